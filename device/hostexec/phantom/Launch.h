// Launching host-code work on a phantom stream.
//
// The fake device computes with the CPU's own kernels; this is how such a
// kernel is queued. launchAsync returns as soon as the work is queued, like
// a kernel launch on a real accelerator; an exception thrown by the work
// becomes the stream's sticky error (reported by the next sync, naming the
// work). launchAndWait is for work whose result the host needs at once
// (data-dependent output shapes): the exception is rethrown to the caller
// as it was raised and the stream stays usable. Its callers first report
// the wait to torch.phantom.set_sync_debug_mode (phantom/SyncDebug.h,
// noteHostWait), with the reason the host has to wait.
//
// This is the CPU-kernel execution layer's (device/hostexec): the runtime
// does not link it, and reaches it only through the hooks this layer
// installs when it is loaded (phantom/DeviceWork.h, HostExecHooks): the
// runtime's waits call releaseFinishedWork, and the host allocator queues
// its keep-alive work with launchAsync.
#pragma once

#include <phantom/DeviceWork.h>  // inDeviceWork, currentWorkStream
#include <phantom/FaultInjection.h>
#include <phantom/Stream.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace phantom {

void launchAsync(const PhantomStream& stream, const char* name,
                 std::function<void()> work);

namespace launch_detail {

// Queued work as the driver holds it (Launch.cpp): the stream, the
// launching thread's OpenMP thread count, and the closure, destroyed on a
// host thread once finished (releaseFinishedWork).
struct AsyncWork {
  explicit AsyncWork(const PhantomStream& s) : stream(s) {}
  virtual ~AsyncWork() = default;
  virtual void call() = 0;
  PhantomStream stream;
  int threads = 0;  // set by launchWork
  AsyncWork* next_finished = nullptr;  // in the finished list
};

template <typename Work>
struct AsyncWorkOf final : AsyncWork {
  template <typename W>
  AsyncWorkOf(const PhantomStream& s, W&& w)
      : AsyncWork(s), work(std::forward<W>(w)) {}
  void call() override { work(); }
  Work work;
};

// Queues `state` (owned from here on, also on failure).
void launchWork(const PhantomStream& stream, const char* name,
                std::unique_ptr<AsyncWork> state);

}  // namespace launch_detail

// launchAsync for a closure other than a std::function: the closure is
// kept in the queued work's own allocation, so a launch makes one heap
// allocation instead of two (the work's and the std::function's) and
// moves the closure once. The same semantics; with a fault-injection knob
// armed it takes the std::function path, which the knobs wrap.
template <typename Work,
          typename = std::enable_if_t<!std::is_same_v<
              std::decay_t<Work>, std::function<void()>>>>
void launchAsync(const PhantomStream& stream, const char* name, Work&& work) {
  if (C10_UNLIKELY(faults_detail::active.load(std::memory_order_relaxed))) {
    launchAsync(stream, name, std::function<void()>(std::forward<Work>(work)));
    return;
  }
  launch_detail::launchWork(
      stream, name,
      std::make_unique<launch_detail::AsyncWorkOf<std::decay_t<Work>>>(
          stream, std::forward<Work>(work)));
}

void launchAndWait(const PhantomStream& stream, const char* name,
                   std::function<void()> work);

// Destroys the closures of finished launchAsync work: the worker hands
// them back rather than destroying them itself, so what a host thread
// allocated is freed on a host thread (Launch.cpp, FinishedWork). Called
// at every launch and synchronize, so what a closure kept alive (a pinned
// buffer of a non_blocking copy) is freed by the time a synchronize
// returns (the runtime calls it after every wait, through its hook). Does
// nothing inside device work. True if it destroyed any.
bool releaseFinishedWork() noexcept;

}  // namespace phantom
