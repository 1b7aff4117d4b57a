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
// running device work (inDeviceWork(), DeviceWork.h) is served from a cache of
// freed blocks of the same rounded size, and goes back there when freed,
// from whichever thread frees it; every other allocation goes to the
// allocator that was installed before, untouched. The cache keeps at most
// kMaxCachedBytes of free blocks (a freed block beyond that goes back to
// the OS) and torch.phantom.empty_cache() empties it.
//
// Lending (LendingScope, below). Work that knows where a result must end
// up (the device output the host allocated ahead) would otherwise copy the
// kernel's fresh CPU result into it: a second pass over memory, 25 MiB per
// 32x64x56x56 convolution. Instead the work may offer the output's memory
// (its kernel view, which the CPU kernel can write) for the kernel's
// allocations of exactly that size, one at a time: a scratch buffer of the
// size may take it first and hands it on when freed (oneDNN's convolution
// reorders its input into a buffer of its output's size, frees it, then
// allocates the output). If the result comes back there with the output's
// strides, the copy is skipped. If a scratch buffer still held the memory
// when the result was allocated, it is dead when the kernel returns and
// the copy overwrites it, as without lending. The one hazard is a kernel that
// keeps a buffer past its return (a cache): the scope reports a lent block
// still alive when it ends, and the caller fails the op loudly.
// PHANTOM_NO_LENDING=1 turns lending off.
#pragma once

#include <c10/util/SmallVector.h>

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
  uint64_t lent = 0;         // allocations served from a device output
  uint64_t in_place = 0;     // results found in their device output: no copy
};

// Wraps the CPU allocator, once (the runtime calls it before it first
// launches device work).
void installKernelHostAllocator();

KernelHostMemoryStats kernelHostMemoryStats();

// Counts a result that came back in the device output it was lent
// (stats.in_place); the ops that lend call it where they skip the copy.
void noteResultInPlace();

// Frees every cached block (live blocks return to the OS when freed).
void releaseKernelHostMemory();

// Offers device memory to the CPU allocations of the calling thread (which
// must be running device work) until close() or the end of the scope.
// Scopes do not nest: a second one on the same thread refuses offers.
class LendingScope {
 public:
  LendingScope();
  ~LendingScope();
  LendingScope(const LendingScope&) = delete;
  LendingScope& operator=(const LendingScope&) = delete;

  // Offers [data, data + nbytes) to the allocations of exactly nbytes, to
  // one at a time (again once that one is freed).
  // Refused (returns false) below kMinCachedBytes, outside device work, in
  // a nested scope, for a size already offered (two outputs of one size
  // could each receive the other's result), or after close().
  bool offer(void* data, size_t nbytes);

  // Whether an offer of `nbytes` could be taken (before any is made): the
  // scope is open and the size is large enough. Lets a caller skip
  // allocating an output ahead that could not be lent.
  bool accepts(size_t nbytes) const;

  // Ends the offers: later allocations are the CPU allocator's again.
  void close();

  // After the kernel's results are dropped: whether a block this scope
  // lent is still allocated, i.e. the kernel kept it.
  bool lentBlockStillAlive() const;

  // Throws (naming `op`) if lentBlockStillAlive(): the op's outputs share
  // memory with a buffer the kernel kept, and must not be handed out.
  void requireNothingKept(const char* op) const;

 private:
  // Whether an offer is lent right now is the allocator's record of lent
  // blocks; a withdrawn offer has data == nullptr.
  struct Offer {
    void* data;
    size_t nbytes;
  };
  friend void* takeLentBlock(size_t nbytes);
  c10::SmallVector<Offer, 4> offers_;
  bool active_ = false;
};

}  // namespace phantom
