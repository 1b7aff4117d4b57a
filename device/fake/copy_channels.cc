// Two-channel copies; see copy_channels.h.
#include "copy_channels.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "spin_wait.h"

namespace phantom::fake {
namespace {

// The second channel: one helper thread that moves one range at a time.
// Like a stream worker, it polls a while for the next range before
// sleeping, and the thread waiting for its range polls before blocking
// (spin_wait.h).
class SecondChannel {
 public:
  // Hands the helper a range to move. False, and nothing started, if it
  // is serving another copy or cannot be used in this process.
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
      dst_ = dst;
      src_ = src;
      size_ = size;
      posted_.fetch_add(1, std::memory_order_release);
    }
    work_posted_.notify_one();
    return true;
  }

  // Returns once the helper has moved the range TryStart handed it.
  void Wait() {
    const uint64_t target = posted_.load(std::memory_order_relaxed);
    auto moved = [&] {
      return done_.load(std::memory_order_acquire) >= target;
    };
    if (!SpinUntil(moved)) {
      std::unique_lock<std::mutex> lock(mutex_);
      range_done_.wait(lock, moved);
    }
    busy_.store(false, std::memory_order_release);
  }

 private:
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
      void* dst = nullptr;
      const void* src = nullptr;
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
      std::memcpy(dst, src, size);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.store(served, std::memory_order_release);
      }
      range_done_.notify_one();
    }
  }

  std::atomic<pid_t> owner_pid_{0};  // the process the helper runs in
  std::atomic<bool> busy_{false};    // a copy holds the channel
  std::mutex mutex_;
  std::condition_variable work_posted_;
  std::condition_variable range_done_;
  std::atomic<uint64_t> posted_{0};  // ranges handed over
  std::atomic<uint64_t> done_{0};    // ranges moved
  void* dst_ = nullptr;
  const void* src_ = nullptr;
  size_t size_ = 0;
};

SecondChannel& Channel() {
  // Never destroyed: stream workers may still copy during static
  // destruction at exit, and the helper thread is never joined.
  static SecondChannel* channel = new SecondChannel;
  return *channel;
}

}  // namespace

int ChannelCopy(void* dst, const void* src, size_t size) {
  const auto to = reinterpret_cast<uintptr_t>(dst);
  const auto from = reinterpret_cast<uintptr_t>(src);
  const bool overlap = to < from + size && from < to + size;
  if (size < kSplitCopyBytes || overlap) {
    std::memmove(dst, src, size);
    return 1;
  }
  // Split on a page boundary, so the channels write pages of their own.
  const size_t first = (size / 2) & ~size_t{4095};
  if (!Channel().TryStart(reinterpret_cast<void*>(to + first),
                          reinterpret_cast<const void*>(from + first),
                          size - first)) {
    std::memcpy(dst, src, size);
    return 1;
  }
  std::memcpy(dst, src, first);
  Channel().Wait();
  return 2;
}

}  // namespace phantom::fake
