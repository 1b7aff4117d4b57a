// Devices: count, selection and validation of indices.
//
// The device count is read from the driver once and cached; a driver that
// fails to start (for example because one of its settings is malformed)
// counts as zero devices, and the driver's reason is kept so that every
// attempt to use the device raises it instead of a vague "no device".
// The current device is per thread, as in CUDA, and is kept by the driver.
//
// Fork: the fake driver runs each stream on a worker thread, and a forked
// child has none of its parent's threads, so a child that used the device
// its parent had initialised would wait forever. As CUDA does ("Cannot
// re-initialize CUDA in forked subprocess"), the first use of the device
// (deviceCountOrThrow, which every device access goes through) registers a
// pthread_atfork child handler that marks the child as a bad fork; from
// then on deviceCountOrThrow and PhantomStream::handle raise a clear error
// in the child. device_count() and is_available() keep working there.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace phantom {

// Number of devices; 0 if the driver could not start. Never throws.
c10::DeviceIndex deviceCountNoThrow() noexcept;

// Why the driver could not start, or "" when it did.
const std::string& driverStartupError() noexcept;

// Number of devices; throws with the driver's reason when there are none.
c10::DeviceIndex deviceCountOrThrow();

// True in a child forked after this process first used the device.
bool inBadFork() noexcept;
// Raises the error a bad-fork child gets when it touches the device.
[[noreturn]] void throwBadFork();

// Throws a clear error unless 0 <= index < deviceCount().
void checkDeviceIndex(c10::DeviceIndex index);

c10::DeviceIndex currentDevice();
void setCurrentDevice(c10::DeviceIndex index);
// Sets the current device and returns the previous one.
c10::DeviceIndex exchangeDevice(c10::DeviceIndex index);

// Blocks until all work on every stream of the device has finished, then
// raises the first error any of that work raised (see Stream.h: a stream
// whose error has been reported is usable again). Defined in Stream.cpp.
void synchronizeDevice(c10::DeviceIndex index);

}  // namespace phantom
