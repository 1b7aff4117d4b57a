// The copy engine's channels: how the fake moves the bytes of a copy.
//
// A discrete accelerator's copy engine moves bytes without the host's
// cores, and usually over several DMA channels at once. The fake has only
// host threads, and one thread's memmove does not reach the memory
// bandwidth of this machine: on the 2-core development VM, a 16 MiB
// memmove split over two threads ran 1.4-1.7x faster than on one, 1.1-1.3x
// at 256 MiB. So a large copy is shared by two threads: the thread that
// executes the copy (a stream worker, or the caller of ph_memcpy) and the
// second channel, one helper thread shared by the process. Both take 2 MiB
// chunks from a shared cursor until none is left, so a channel that runs
// slower (its vCPU just woke from idle) moves less instead of holding the
// copy up; the copy returns when every chunk has arrived. If the caller
// took every chunk before the helper woke, it does not wait for it.
//
// Small copies stay on one thread: waking the helper costs tens of
// microseconds on a VM, the time to copy a few MiB. Overlapping ranges
// (a D2D copy within one allocation) stay on one thread too, since memmove
// semantics do not survive a split. While the helper serves one copy,
// another copy that wants it (a second stream, a second device) does its
// whole copy on its own thread rather than wait for the helper.
#ifndef PHANTOM_FAKE_COPY_CHANNELS_H_
#define PHANTOM_FAKE_COPY_CHANNELS_H_

#include <cstddef>

namespace phantom::fake {

// Copies at or above this size are split over the two channels.
constexpr size_t kSplitCopyBytes = size_t{8} << 20;

// memmove(dst, src, size), shared by two channels when it is large and
// the ranges do not overlap. Returns how many channels moved bytes (1 or
// 2), for tests.
int ChannelCopy(void* dst, const void* src, size_t size);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_COPY_CHANNELS_H_
