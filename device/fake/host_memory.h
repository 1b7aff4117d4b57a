// Pinned host memory: page-aligned blocks the copy engine may use
// asynchronously.
//
// On the fake, "pinned" means only "allocated by ph_host_malloc and
// therefore known to the driver": the block is its own mapping (page-
// aligned, never shared with malloc's heap) and is recorded in a registry
// so ph_pointer_get_attributes recognises any interior pointer and
// ph_memcpy_async knows the host side stays valid after the call returns.
// Real drivers lock the pages and register them with the DMA engine here.
//
// Two addresses per block. A block is a memfd mapped twice (MAP_SHARED):
// the address ph_host_malloc returns, and an alias that only the copy
// engine uses (PlanCopy reads and writes a pinned host side through it).
// Both map the same pages, so a copy's bytes appear at the user's address;
// and mprotect on the user's address leaves the alias writable, so the
// copy engine keeps working while the host's view is protected. This is
// what a DMA engine does on real hardware (it writes physical pages, not
// the process's mapping) and why the fake declares
// PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION. A shared mapping is inherited
// shared, not copy-on-write, by a forked child (CUDA's pinned memory is
// not usable in one at all). Where memfd_create is unavailable the block
// is a private anonymous mapping whose alias is itself, and the fake does
// not declare the capability (PinnedAliasesAvailable).
//
// Locking: one mutex guards the registry (base -> size, alias); lookups
// are O(log n) and the lock is never held across a copy.
#ifndef PHANTOM_FAKE_HOST_MEMORY_H_
#define PHANTOM_FAKE_HOST_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "phantom/hal.h"

namespace phantom::fake {

// ph_host_malloc / ph_host_free semantics (size > 0, ptr != null).
ph_status_t AllocatePinned(size_t size, void** out_ptr);
ph_status_t FreePinned(void* ptr);

// If `address` lies inside a live pinned block, stores its start and
// requested size and returns true.
bool LookupPinned(const void* address, uintptr_t* out_base, size_t* out_size);

// Same, and also the address of `address`'s byte in the block's alias (the
// copy engine's mapping of the same pages).
bool LookupPinnedAlias(const void* address, uintptr_t* out_base,
                       size_t* out_size, void** out_alias);

// True when pinned blocks get a separate alias mapping (memfd_create
// works here): the copy engine's writes then ignore protection of the
// user's address.
bool PinnedAliasesAvailable();

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_HOST_MEMORY_H_
