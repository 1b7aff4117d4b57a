// Host memory the CPU kernels allocate while they run as device work.
//
// The fake device computes with the CPU's kernels, and those allocate
// their outputs and scratch space (oneDNN's reordered convolution buffers,
// an EmbeddingBag's bag sizes) from the CPU allocator. On a real
// accelerator that memory comes from the device's caching allocator: a
// kernel's workspace is reused from call to call. glibc instead hands
// large blocks back to the OS on free and faults them in again, zeroed,
// on the next call: a 32x64x56x56 convolution touched 16,000 fresh pages
// (64 MiB) per call, a third of its time on this machine.
//
// So once device work has run, the process's CPU allocator is wrapped:
// an allocation of kMinCachedBytes or more made by a thread that is
// running device work (inDeviceWork(), Launch.h) is served from a cache of
// freed blocks of the same rounded size, and goes back there when freed,
// from whichever thread frees it; every other allocation goes to the
// allocator that was installed before, untouched. The cache keeps at most
// kMaxCachedBytes of free blocks (a freed block beyond that goes back to
// the OS) and torch.phantom.empty_cache() empties it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace phantom {

// Allocations below this size are left to the CPU allocator: glibc serves
// them from its heaps without new page faults.
constexpr size_t kMinCachedBytes = size_t{128} << 10;
constexpr size_t kMaxCachedBytes = size_t{512} << 20;

struct KernelHostMemoryStats {
  size_t cached_bytes = 0;   // free blocks held for reuse
  size_t cached_blocks = 0;
  size_t live_bytes = 0;     // handed out, not yet freed
  size_t live_blocks = 0;
  uint64_t reused = 0;       // allocations served from the cache
  uint64_t fresh = 0;        // allocations that had to ask the OS
};

// Wraps the CPU allocator, once (the runtime calls it before it first
// launches device work).
void installKernelHostAllocator();

KernelHostMemoryStats kernelHostMemoryStats();

// Frees every cached block (live blocks return to the OS when freed).
void releaseKernelHostMemory();

}  // namespace phantom
