// Two-channel copies; see copy_channels.h.
#include "copy_channels.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "spin_wait.h"

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: part of every x86-64 CPU
#endif

namespace phantom::fake {
namespace {

// A copy on two channels is cut into chunks that the two threads take
// from the two ends, the thread that executes the copy from the front and
// the helper from the back, until they meet, rather than in two fixed
// halves: when one channel runs slower (its vCPU just woke from idle, or
// another thread shares its core) the other moves more, and the copy
// takes the time of the two together instead of that of the slower half.
// When both keep pace each channel moves the same half of the range from
// one copy to the next, so a copy repeated over memory that fits in the
// caches finds its half in its own core's cache, as a CPU copy_ split
// between two OpenMP threads does; with both taking chunks from one
// shared cursor, which chunk went to which core changed from copy to copy.
// A copy that stays in the cache is cut finer, so that a 1 MiB copy still
// gives each channel a few chunks to balance.
constexpr size_t kChunkBytes = size_t{2} << 20;
constexpr size_t kCachedChunkBytes = size_t{256} << 10;

size_t ChunkBytesFor(size_t size) {
  return size >= kStreamingCopyBytes ? kChunkBytes : kCachedChunkBytes;
}

// The chunks of one copy not yet taken: [front, back), as chunk numbers
// packed in one word so that a take from either end is one compare and
// swap.
class ChunkCursor {
 public:
  void Reset(size_t size) {
    const uint64_t chunks = (size + ChunkBytesFor(size) - 1) / ChunkBytesFor(size);
    state_.store(chunks << 32, std::memory_order_relaxed);
  }
  // The next chunk's number from the front or the back, or -1 if none is left.
  int64_t Take(bool from_front) {
    uint64_t state = state_.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = state & 0xffffffffu;
      const uint64_t back = state >> 32;
      if (front >= back) return -1;
      const uint64_t next = from_front ? (back << 32) | (front + 1)
                                       : ((back - 1) << 32) | front;
      if (state_.compare_exchange_weak(state, next, std::memory_order_relaxed)) {
        return static_cast<int64_t>(from_front ? front : back - 1);
      }
    }
  }

 private:
  std::atomic<uint64_t> state_{0};
};

// Takes chunks of [0, size) from one end of `cursor` and copies them until
// none is left, with streaming stores when the whole copy is large
// (kStreamingCopyBytes; a chunk alone is always below it).
void CopyChunks(ChunkCursor& cursor, bool from_front, unsigned char* dst,
                const unsigned char* src, size_t size) {
  const bool streaming = size >= kStreamingCopyBytes;
  const size_t chunk = ChunkBytesFor(size);
  for (;;) {
    const int64_t taken = cursor.Take(from_front);
    if (taken < 0) return;
    const size_t offset = static_cast<size_t>(taken) * chunk;
    const size_t bytes = std::min(chunk, size - offset);
    if (streaming) {
      StreamingCopy(dst + offset, src + offset, bytes);
    } else {
      std::memcpy(dst + offset, src + offset, bytes);
    }
  }
}

// The second channel: one helper thread that joins one copy at a time.
// Like a stream worker, it polls a while for the next copy before
// sleeping, and the thread waiting for it polls before blocking
// (spin_wait.h). A copy the caller finished before the helper joined it is
// closed, and the helper, when it wakes, leaves it alone: the caller never
// waits for a helper that has not started.
class SecondChannel {
 public:
  // Offers the helper the copy [dst, dst + size) <- src, which the caller
  // then works on too (Work) and ends with Finish. False, and nothing
  // offered, if the helper serves another copy or cannot be used in this
  // process.
  bool TryStart(void* dst, const void* src, size_t size) {
    // A forked child has no helper thread (and maybe a mutex locked by a
    // thread that is gone): it copies on one thread.
    const pid_t owner = owner_pid_.load(std::memory_order_acquire);
    if (owner != 0 && owner != getpid()) return false;
    bool idle = false;
    if (!busy_.compare_exchange_strong(idle, true, std::memory_order_acquire)) {
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (owner_pid_.load(std::memory_order_relaxed) == 0 &&
          !StartHelperLocked()) {
        busy_.store(false, std::memory_order_release);
        return false;
      }
      dst_ = static_cast<unsigned char*>(dst);
      src_ = static_cast<const unsigned char*>(src);
      size_ = size;
      cursor_.Reset(size);
      const uint64_t copy = posted_.load(std::memory_order_relaxed) + 1;
      state_.store(State(copy, kPosted), std::memory_order_relaxed);
      posted_.store(copy, std::memory_order_release);
    }
    work_posted_.notify_one();
    return true;
  }

  // The caller's share of the copy TryStart offered.
  void Work() { CopyChunks(cursor_, /*from_front=*/true, dst_, src_, size_); }

  // Returns once every byte of the copy has arrived: at once if the helper
  // had not joined it (it is closed), else when the helper is done.
  // Returns whether the helper moved a part.
  bool Finish() {
    const uint64_t copy = posted_.load(std::memory_order_relaxed);
    uint64_t posted = State(copy, kPosted);
    bool helped = true;
    if (state_.compare_exchange_strong(posted, State(copy, kClosed),
                                       std::memory_order_acq_rel)) {
      helped = false;
    } else {
      auto done = [&] {
        return state_.load(std::memory_order_acquire) == State(copy, kDone);
      };
      if (!SpinUntil(done)) {
        std::unique_lock<std::mutex> lock(mutex_);
        range_done_.wait(lock, done);
      }
    }
    busy_.store(false, std::memory_order_release);
    return helped;
  }

 private:
  // A copy's state: its number (posted_ when it was offered) and phase.
  enum Phase : uint64_t { kPosted = 0, kJoined = 1, kClosed = 2, kDone = 3 };
  static uint64_t State(uint64_t copy, Phase phase) { return copy * 4 + phase; }

  bool StartHelperLocked() {
    try {
      std::thread([this] { Serve(); }).detach();
    } catch (const std::system_error&) {
      return false;  // no thread to spare: copy on one channel
    }
    owner_pid_.store(getpid(), std::memory_order_release);
    return true;
  }

  void Serve() {
    pthread_setname_np(pthread_self(), "ph-copy");
    uint64_t served = 0;
    for (;;) {
      SpinUntil([&] {
        return posted_.load(std::memory_order_acquire) != served;
      });
      unsigned char* dst = nullptr;
      const unsigned char* src = nullptr;
      size_t size = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_posted_.wait(lock, [&] {
          return posted_.load(std::memory_order_relaxed) != served;
        });
        served = posted_.load(std::memory_order_relaxed);
        dst = dst_;
        src = src_;
        size = size_;
      }
      // Join the copy unless its caller already finished and closed it.
      uint64_t posted = State(served, kPosted);
      if (!state_.compare_exchange_strong(posted, State(served, kJoined),
                                          std::memory_order_acq_rel)) {
        continue;
      }
      CopyChunks(cursor_, /*from_front=*/false, dst, src, size);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        state_.store(State(served, kDone), std::memory_order_release);
      }
      range_done_.notify_one();
    }
  }

  std::atomic<pid_t> owner_pid_{0};  // the process the helper runs in
  std::atomic<bool> busy_{false};    // a copy holds the channel
  std::mutex mutex_;
  std::condition_variable work_posted_;
  std::condition_variable range_done_;
  std::atomic<uint64_t> posted_{0};  // copies offered
  std::atomic<uint64_t> state_{0};   // the last copy's State
  ChunkCursor cursor_;               // the chunks not yet taken
  unsigned char* dst_ = nullptr;
  const unsigned char* src_ = nullptr;
  size_t size_ = 0;
};

SecondChannel& Channel() {
  // Never destroyed: stream workers may still copy during static
  // destruction at exit, and the helper thread is never joined.
  static SecondChannel* channel = new SecondChannel;
  return *channel;
}

}  // namespace

void StreamingCopy(void* dst, const void* src, size_t size) {
#if defined(__x86_64__)
  auto* to = static_cast<unsigned char*>(dst);
  const auto* from = static_cast<const unsigned char*>(src);
  // Streaming stores need a 16-byte aligned destination; a whole cache
  // line per turn lets the CPU write it out without reading it first.
  constexpr size_t kLine = 64;
  const size_t head = std::min(
      size, (kLine - reinterpret_cast<uintptr_t>(to) % kLine) % kLine);
  std::memcpy(to, from, head);
  to += head;
  from += head;
  size -= head;
  const size_t lines = size / kLine;
  for (size_t i = 0; i < lines; ++i) {
    const auto* in = reinterpret_cast<const __m128i*>(from);
    auto* out = reinterpret_cast<__m128i*>(to);
    const __m128i a = _mm_loadu_si128(in);
    const __m128i b = _mm_loadu_si128(in + 1);
    const __m128i c = _mm_loadu_si128(in + 2);
    const __m128i d = _mm_loadu_si128(in + 3);
    _mm_stream_si128(out, a);
    _mm_stream_si128(out + 1, b);
    _mm_stream_si128(out + 2, c);
    _mm_stream_si128(out + 3, d);
    to += kLine;
    from += kLine;
  }
  std::memcpy(to, from, size % kLine);
  // Streaming stores are weakly ordered: fence them so that whoever learns
  // of the copy's end through a release store also sees its bytes.
  _mm_sfence();
#else
  std::memcpy(dst, src, size);
#endif
}

int ChannelCopy(void* dst, const void* src, size_t size) {
  const auto to = reinterpret_cast<uintptr_t>(dst);
  const auto from = reinterpret_cast<uintptr_t>(src);
  const bool overlap = to < from + size && from < to + size;
  if (size < kSplitCopyBytes || overlap) {
    std::memmove(dst, src, size);
    return 1;
  }
  SecondChannel& channel = Channel();
  if (!channel.TryStart(dst, src, size)) {
    ChunkCursor alone;  // the same chunks, all on this thread
    alone.Reset(size);
    CopyChunks(alone, /*from_front=*/true, static_cast<unsigned char*>(dst),
               static_cast<const unsigned char*>(src), size);
    return 1;
  }
  channel.Work();
  return channel.Finish() ? 2 : 1;
}

}  // namespace phantom::fake
