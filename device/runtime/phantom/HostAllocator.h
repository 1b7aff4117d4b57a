// Pinned (page-locked) host memory: tensor.pin_memory(), pin_memory=True
// factories, DataLoader(pin_memory=True), and the staging buffers of
// non_blocking copies.
//
// Pinned memory is what the copy engine can read and write after the host
// has moved on, so it is what makes non_blocking copies truly asynchronous.
// Its allocator is PyTorch's generic caching host allocator
// (at::CachingHostAllocatorImpl, the one CUDA and XPU use) over the
// driver's ph_host_malloc / ph_host_free:
//
//  - Blocks are rounded up to a power of two and cached when freed, so a
//    training loop that pins one batch after another stops calling the
//    driver after the first few steps.
//  - A copy that reads or writes a pinned block asynchronously records the
//    stream it was queued on (recordPinnedUse). When the block is freed, an
//    event is recorded on each such stream, and the block is not handed out
//    again until every one of those events has been reached. Freeing the
//    source of a non_blocking copy at once is therefore safe.
//  - It never takes the GIL and is safe to call from any thread, including
//    stream workers (a tensor freed inside device work).
//
// The allocator is registered for PrivateUse1 with REGISTER_HOST_ALLOCATOR,
// so at::getHostAllocator(at::kPrivateUse1) returns it, and the hooks return
// it from getPinnedMemoryAllocator().
#pragma once

#include <phantom/Stream.h>

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

namespace phantom {

// The caching pinned-memory allocator (an at::HostAllocator).
c10::Allocator* pinnedHostAllocator();
at::HostAllocator* phantomHostAllocator();

// True if `ptr` points into pinned memory from the driver (from this
// allocator or from any other ph_host_malloc call).
bool isPinnedPointer(const void* ptr);

// Tells the allocator that work queued on `stream` uses the pinned block
// that `ptr` / `ctx` belong to (a DataPtr's get() and get_context()), so the
// block is not reused until that work has finished. Returns false if the
// memory is not a block of this allocator (then nothing is recorded), like
// CUDA's CachingHostAllocator_recordEvent.
bool recordPinnedUse(void* ptr, void* ctx, const PhantomStream& stream);

// Same, for the memory of a CPU tensor's storage. If the storage is pinned
// memory the allocator does not own, its storage is kept alive until the
// stream has reached this point instead.
void recordPinnedUse(const c10::Storage& storage, const PhantomStream& stream);

// True if `storage` is a block of this allocator: page-aligned and the
// block's only user (phantom/HostGuard.h protects its whole pages).
bool ownsPinnedBlock(const c10::Storage& storage);

// Frees every cached pinned block whose pending events have completed
// (torch.phantom.host_empty_cache()).
void emptyHostCache();

// Statistics of the caching host allocator (torch.phantom.host_memory_stats()).
at::HostStats hostMemoryStats();
void resetAccumulatedHostMemoryStats();
void resetPeakHostMemoryStats();

}  // namespace phantom
