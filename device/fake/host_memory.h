// Pinned host memory: page-aligned blocks the copy engine may use
// asynchronously.
//
// On the fake, "pinned" means only "allocated by ph_host_malloc and
// therefore known to the driver": the block comes straight from mmap
// (page-aligned, never shared with malloc's heap) and is recorded in a
// registry so ph_pointer_get_attributes recognises any interior pointer and
// ph_memcpy_async knows the host side stays valid after the call returns.
// Real drivers lock the pages and register them with the DMA engine here.
//
// Locking: one mutex guards the registry (base -> size); lookups are
// O(log n) and the lock is never held across a copy.
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

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_HOST_MEMORY_H_
