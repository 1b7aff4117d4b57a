// The table of device address ranges and the fault handler that reads it.
//
// Each device's addresses are a PROT_NONE mapping, so host code that
// dereferences a device pointer faults at once. A bare "Segmentation fault"
// would send the user hunting; instead a SIGSEGV/SIGBUS handler, installed
// once when the first device maps its memory, checks whether the faulting
// address is device memory and, if so, says so in plain words before the
// process dies with the original signal.
//
// The handler may run at any moment on any thread, so it can take no lock
// and allocate nothing. The ranges therefore live in a fixed array of
// lock-free atomics, one slot per possible device, written once per device
// (size and view first, base last with release order; a reader that sees a
// non-zero base sees the rest). The same table answers "which device owns
// this address?" for the rest of the driver without locking.
//
// Faults outside device memory are handed to whatever handler was installed
// before ours (sanitizers, crash reporters, Python's faulthandler), so the
// fake composes with them.
#ifndef PHANTOM_FAKE_FAULT_HANDLER_H_
#define PHANTOM_FAKE_FAULT_HANDLER_H_

#include <cstddef>
#include <cstdint>

namespace phantom::fake {

// Records device `device`'s address range [base, base + size) and its kernel
// view, and installs the fault handler if this is the first device.
void PublishDeviceRange(int device, uintptr_t base, size_t size,
                        uintptr_t view);

// The device whose address range contains `address`, or -1.
// Async-signal-safe and lock-free.
int DeviceOfAddress(uintptr_t address);

// Opens the window [begin, end) of device `device`'s kernel view: writes
// that fault there wait (in the handler) until EndViewMigration. Makes sure
// our handler is the one installed for SIGSEGV first: a handler that
// another library installed after ours (torch's DataLoader workers install
// one) would otherwise see those faults as crashes. One window per device
// at a time (the caller holds the device's memory lock).
void BeginViewMigration(int device, uintptr_t begin, uintptr_t end);
void EndViewMigration(int device);

// Start of device `device`'s range and of its kernel view (0 if unmapped).
uintptr_t DeviceRangeBase(int device);
uintptr_t DeviceViewBase(int device);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_FAULT_HANDLER_H_
