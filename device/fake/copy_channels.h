// The copy engine's channels: how the fake moves the bytes of a copy.
//
// A discrete accelerator's copy engine moves bytes without the host's
// cores, and usually over several DMA channels at once. The fake has only
// host threads, and one thread's memmove does not reach the memory
// bandwidth of this machine: on the 2-core development VM, a 16 MiB
// memmove split over two threads ran 1.4-1.7x faster than on one, 1.1-1.3x
// at 256 MiB. So a large copy is shared by two threads: the thread that
// executes the copy (a stream worker, or the caller of ph_memcpy) and the
// second channel, one helper thread shared by the process. Both take
// chunks, the executing thread from the front of the range and the helper
// from the back, until they meet, so a channel that runs slower (its vCPU
// just woke from idle) moves less instead of holding the copy up, and a
// repeated copy keeps each half on one core; the copy returns when every
// chunk has arrived. If the caller took every chunk before the helper
// woke, it does not wait for it.
//
// Copies below 1 MiB stay on one thread: they take a few microseconds,
// less than waking the helper from sleep costs on a VM (tens of
// microseconds). From 1 MiB a copy is offered to the helper, which polls
// for the next copy a while before it sleeps (spin_wait.h), so in a run of
// copies it is awake and joins at once; a copy that finds it asleep is
// mostly or wholly done by the caller, who never waits for a helper that
// has not started. Overlapping ranges
// (a D2D copy within one allocation) stay on one thread too, since memmove
// semantics do not survive a split. While the helper serves one copy,
// another copy that wants it (a second stream, a second device) does its
// whole copy on its own thread rather than wait for the helper.
//
// A copy larger than the last-level cache is written with streaming
// (non-temporal) stores: ordinary stores first read each destination
// cache line (so a copy moves three bytes over the memory bus per byte
// copied) and then evict lines the next chunk needs; streaming stores
// write whole lines straight to memory. glibc's memcpy switches to them
// only from its own threshold (240 MiB on the development VM, where it
// takes the L3 to be 320 MiB), so a 64 MiB copy in 2 MiB memcpy calls
// never used them (docs/pinned-memory.md, "Copy speed", has the
// bandwidths either way). Below the threshold the destination stays in
// the cache, which is faster for a copy that fits there and leaves the
// bytes where the next kernel reads them, as memcpy does.
#ifndef PHANTOM_FAKE_COPY_CHANNELS_H_
#define PHANTOM_FAKE_COPY_CHANNELS_H_

#include <cstddef>

namespace phantom::fake {

// Copies at or above this size are split over the two channels.
constexpr size_t kSplitCopyBytes = size_t{1} << 20;

// Copies at or above this size, not overlapping, are written with
// streaming stores (on x86-64; elsewhere memcpy). Half of the 32 MiB L3
// of the development VM: a copy of this size's source and destination
// together fill it.
constexpr size_t kStreamingCopyBytes = size_t{16} << 20;

// memmove(dst, src, size), shared by two channels when it is large and
// the ranges do not overlap. Returns how many channels moved bytes (1 or
// 2), for tests.
int ChannelCopy(void* dst, const void* src, size_t size);

// memcpy(dst, src, size) with streaming stores where the target has them;
// the ranges must not overlap. The stores are fenced before it returns, so
// a release store after it publishes every byte. Exposed for tests of odd
// alignments and sizes.
void StreamingCopy(void* dst, const void* src, size_t size);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_COPY_CHANNELS_H_
