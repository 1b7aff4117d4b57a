// See phantom/Launch.h.
#include <phantom/DeviceWork.h>
#include <phantom/Exception.h>
#include <phantom/FaultInjection.h>
#include <phantom/KernelHostMemory.h>
#include <phantom/Launch.h>

#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

namespace phantom {
namespace {

// The OpenMP thread count a kernel runs with on the worker: the launching
// thread's (at::get_num_threads() there), as if that thread ran the CPU op
// itself. Many CPU kernels split a reduction by thread count, so the count
// decides their bits. ATen sets a thread's count once, from the process's
// last torch.set_num_threads(), on that thread's first parallel call; the
// worker would keep its first count through a later set_num_threads() and
// stop matching the CPU. (at::set_num_threads also records the count as
// the process's, for threads that start later: it is the launching
// thread's, normally the one the last torch.set_num_threads() set.)
void useThreadCount(int threads) {
  if (threads > 0 && at::get_num_threads() != threads) {
    at::set_num_threads(threads);
  }
}

const char* whatOf(const std::exception& e) {
  // c10::Error's what() carries a C++ backtrace; the plain message is what
  // a user needs in the stream's error.
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

// The failed work's sentence for the driver, which prefixes the op's name
// and the device: `what`, then the stream as the user names it
// (torch.phantom.Stream's repr). The driver knows its streams only by
// handle, and a failure inherited through events is reported by other
// streams, so the original message must say where the op ran. The
// stream's part is kept whole when `what` is too long for the buffer.
void describeFailure(char* error, size_t error_size, const char* what,
                     const PhantomStream& stream) {
  const std::string where = " (queued on " + stream.device().str() +
                            " stream_id=" + std::to_string(stream.id()) + ")";
  const size_t room =
      error_size > where.size() + 1 ? error_size - where.size() - 1 : 0;
  std::snprintf(error, error_size, "%.*s%s", static_cast<int>(room), what,
                where.c_str());
}

using launch_detail::AsyncWork;

// The driver's entry points for queued work (ph_host_task_t).
struct AsyncWorkCalls {
  static ph_status_t run(void* self, char* error, size_t error_size) {
    auto* state = static_cast<AsyncWork*>(self);
    try {
      // The dispatch state of a fresh thread, as on the stream's worker:
      // the driver may run queued work on a host thread that waits for it
      // (the fake does), whose autocast, Python modes or functorch layers
      // must not apply to the kernel's CPU ops.
      const c10::impl::ForceDispatchKeyGuard fresh_dispatch_state(
          c10::default_included_set, c10::default_excluded_set);
      DeviceWorkScope scope(state->stream);
      useThreadCount(state->threads);
      state->call();
      return PH_SUCCESS;
    } catch (const std::exception& e) {
      describeFailure(error, error_size, whatOf(e), state->stream);
    } catch (...) {
      describeFailure(error, error_size, "unknown exception", state->stream);
    }
    return PH_ERROR_DEVICE;
  }

  // Called by the driver once the work has run (or was refused or
  // skipped): the work goes back to the host to be destroyed.
  static void release(void* self);
};

// Finished asynchronous work, destroyed on the host (releaseFinishedWork).
//
// Why not on the worker: everything a launch owns was made by a host
// thread (the AsyncWork, the std::function's closure, what the closure
// captured: the ops' DeviceTensorRefs, a generic op's arguments, a pinned
// storage kept alive). Destroying it on the worker made every launch a
// cross-thread malloc/free pair, and glibc then takes the main arena's
// lock on both threads. With a small op every ~2 us, that contention (with
// the stream's mutex, since replaced by a lock-free queue) cost a futex
// system call every third op (perf: 0.38 per op in benchmark 1's chain).
// A real driver does the same: the host reaps its completed launches. The
// list is a lock-free stack: the worker pushes, a host thread takes all of
// it at once (so the pop has no ABA problem).
class FinishedWork {
 public:
  void push(AsyncWork* work) noexcept {
    work->next_finished = head_.load(std::memory_order_relaxed);
    while (!head_.compare_exchange_weak(work->next_finished, work,
                                        std::memory_order_release,
                                        std::memory_order_relaxed)) {
    }
  }

  // Destroys everything pushed so far; returns whether there was any.
  bool destroyAll() noexcept {
    if (head_.load(std::memory_order_relaxed) == nullptr) return false;
    AsyncWork* work = head_.exchange(nullptr, std::memory_order_acquire);
    const bool any = work != nullptr;
    while (work != nullptr) {
      AsyncWork* const next = work->next_finished;
      delete work;  // a destructor here cannot throw: tensors, closures
      work = next;
    }
    return any;
  }

 private:
  std::atomic<AsyncWork*> head_{nullptr};
};

FinishedWork& finishedWork() {
  // Leaked on purpose: work may finish while statics are destroyed.
  static auto* finished = new FinishedWork;
  return *finished;
}

void AsyncWorkCalls::release(void* self) {
  finishedWork().push(static_cast<AsyncWork*>(self));
}

// Shared between the host (waiting) and the worker (running).
struct WaitedWork {
  explicit WaitedWork(const PhantomStream& s) : stream(s) {}
  std::function<void()> work;
  PhantomStream stream;
  int threads = at::get_num_threads();  // the launching thread's
  std::exception_ptr failure;

  static ph_status_t run(void* self, char*, size_t) {
    auto* state = static_cast<std::shared_ptr<WaitedWork>*>(self)->get();
    try {
      DeviceWorkScope scope(state->stream);
      useThreadCount(state->threads);
      state->work();
      state->work = nullptr;  // drop captures on the worker, while it is ours
    } catch (...) {
      state->failure = std::current_exception();
      state->work = nullptr;
    }
    return PH_SUCCESS;
  }

  static void release(void* self) {
    delete static_cast<std::shared_ptr<WaitedWork>*>(self);
  }
};

}  // namespace

bool releaseFinishedWork() noexcept {
  // Device work must not destroy the host's objects (see FinishedWork).
  return !inDeviceWork() && finishedWork().destroyAll();
}

namespace launch_detail {

void launchWork(const PhantomStream& stream, const char* name,
                std::unique_ptr<AsyncWork> owned) {
  releaseFinishedWork();  // the launches before this one, if they are done
  installKernelHostAllocator();  // the kernels' big allocations: cached
  owned->threads = at::get_num_threads();
  AsyncWork* const state = owned.release();
  const ph_host_task_t task{name, &AsyncWorkCalls::run,
                            &AsyncWorkCalls::release, state};
  // On failure the driver has already released the state (to the finished
  // list). A refusal for earlier failed work reports that failure once and
  // resets the stream (PhantomStream::check).
  const ph_stream_t driver_stream = stream.handle();
  stream.check(ph_launch_host_func(driver_stream, &task), driver_stream);
}

}  // namespace launch_detail

void launchAsync(const PhantomStream& stream, const char* name,
                 std::function<void()> work) {
  faultHookLaunch(stream, name, work, /*waited=*/false);
  launch_detail::launchWork(
      stream, name,
      std::make_unique<launch_detail::AsyncWorkOf<std::function<void()>>>(
          stream, std::move(work)));
}

void launchAndWait(const PhantomStream& stream, const char* name,
                   std::function<void()> work) {
  releaseFinishedWork();
  installKernelHostAllocator();  // the kernels' big allocations: cached
  faultHookLaunch(stream, name, work, /*waited=*/true);
  auto state = std::make_shared<WaitedWork>(stream);
  state->work = std::move(work);
  auto* handle = new std::shared_ptr<WaitedWork>(state);
  const ph_host_task_t task{name, &WaitedWork::run, &WaitedWork::release,
                            handle};
  // Runs in stream order and returns when done (the fake runs it on this
  // thread when the stream is idle). The stream's sticky error, an earlier
  // task's or this one's, is reported once, as a sync reports it.
  const ph_stream_t driver_stream = stream.handle();
  const ph_status_t status = ph_run_host_func(driver_stream, &task);
  // Under graph capture the driver refuses work the host waits for; say
  // which op it was (the capture is now invalidated, hal.h).
  TORCH_CHECK(status != static_cast<ph_status_t>(
                            PH_ERROR_STREAM_CAPTURE_UNSUPPORTED),
              "phantom: ", name, " cannot be captured: it needs its result "
              "on the host (a data-dependent shape, a value read back, or a "
              "trial run) while the stream records work instead of running "
              "it; the capture is invalidated. Run it before or after the "
              "capture. (", ph_last_error_message(), ")");
  stream.check(status, driver_stream);
  if (state->failure) {
    std::rethrow_exception(state->failure);
  }
}

namespace {

// The runtime reaches this layer only through these (phantom/DeviceWork.h).
[[maybe_unused]] const bool hooks_installed = [] {
  HostExecHooks hooks;
  hooks.launch_async = &launchAsync;
  hooks.release_finished_work = &releaseFinishedWork;
  hooks.release_host_memory = []() noexcept { releaseKernelHostMemory(); };
  setHostExecHooks(hooks);
  return true;
}();

}  // namespace

}  // namespace phantom
