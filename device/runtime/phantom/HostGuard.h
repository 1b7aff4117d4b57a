// Host-side protection of a non_blocking device-to-host copy's destination.
//
// A non_blocking copy from the device into pinned host memory returns
// before the bytes arrive. Reading the destination before something shows
// the copy finished (a synchronize, an event query) is a race that usually
// reads the right numbers on an idle machine and stale ones under load. The
// race detector (torch_phantom/race_detector.py) closes the window: it
// protects the destination's pages (PROT_NONE) when the copy is queued and
// releases them when the host observes the copy's completion. A host access
// in between faults; a SIGSEGV handler here finds the guard that covers the
// address, marks it violated, unprotects its pages and returns, so the
// faulting instruction is retried and the program goes on (it reads what
// the race gave it). The detector collects violations after each op and at
// releases, and reports them; a signal handler cannot raise.
//
// This needs the device's copies to ignore the host's page protection
// (PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION, hal.h): otherwise the copy
// itself would fault. `available` tells whether a device's driver declares
// it; without it nothing is protected.
//
// Pages. Protection is page-granular, so only pages whose bytes in use all
// belong to the destination are protected: a block of the pinned caching
// allocator is page-aligned and holds one storage, so the pages past the
// storage's end (the block's rounding) count as the destination's when
// it ends there; pages shared with other bytes of the storage, or of
// pinned memory the allocator does not own, are left readable (a read
// there is not caught: it can hide a race, never invent one). A block
// returned to the allocator drops its guards (releaseRange), so a reuse of
// it never faults.
//
// The table is chunks of slots of atomics, read lock-free by the handler
// (it may run on any thread at any moment); protect, release and take
// serialize on a mutex among themselves. It grows by a chunk when every
// slot is taken, so any number of copies can be outstanding at once
// (bounded by memory only). Faults that are not ours go to the handler
// installed before ours (the fake's device-memory handler, Python's
// faulthandler).
#pragma once

#include <c10/core/Storage.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace phantom::host_guard {

// True when `device`'s driver declares PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION.
bool available(c10::DeviceIndex device);

// Protects the pages of bytes [offset, offset + nbytes) of pinned `storage`
// that may be protected (see "Pages"). Returns the guard's id, or 0 when
// nothing was protected (no whole page, not pinned, no memory for a slot).
// `owns_block` says the storage is the only user of its pinned block.
uint64_t protect(const c10::Storage& storage, size_t offset, size_t nbytes,
                 bool owns_block);

// Unprotects guard `id`'s pages. Returns the faulting address if the guard
// was violated (the violation is then consumed), else 0.
uintptr_t release(uint64_t id);

// Drops every guard overlapping [begin, begin + size) (memory going back to
// its allocator). Violations stay to be taken.
void releaseRange(const void* begin, size_t size);

// Violations since the last call: (guard id, faulting address). Each
// violated guard is consumed.
std::vector<std::pair<uint64_t, uintptr_t>> takeViolations();

// Guards currently protecting pages (for tests).
size_t activeCount();

}  // namespace phantom::host_guard
