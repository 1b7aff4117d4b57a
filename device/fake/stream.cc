// Stream workers and the stream registry; see stream.h.
#include "stream.h"

#include <string>
#include <utility>

#include "errors.h"
#include "handle_registry.h"
#include "spin_wait.h"

namespace phantom::fake {
namespace {

thread_local Stream* t_current_stream = nullptr;

HandleRegistry<Stream>& Streams() {
  // Leaked on purpose: see docs/fake-driver.md, "Process exit". Destroying
  // live streams from a static destructor would join workers that may be
  // blocked forever on user work.
  static auto* registry = new HandleRegistry<Stream>(0x5);
  return *registry;
}

// A task's status as the stream records it: any non-error answer from a
// failing task (NOT_READY, unknown values) becomes PH_ERROR_DEVICE.
ph_status_t AsTaskError(ph_status_t status) {
  switch (status) {
    case PH_ERROR_INVALID_ARGUMENT:
    case PH_ERROR_INVALID_DEVICE:
    case PH_ERROR_INVALID_HANDLE:
    case PH_ERROR_OUT_OF_MEMORY:
    case PH_ERROR_DEVICE:
    case PH_ERROR_UNIMPLEMENTED:
    case PH_ERROR_NOT_INITIALIZED:
      return status;
    default:
      return PH_ERROR_DEVICE;
  }
}

}  // namespace

Stream* CurrentStream() { return t_current_stream; }

Stream::Stream(int device, int priority)
    : device_(device), priority_(priority) {}

Stream::~Stream() { Shutdown(); }

void Stream::Start() { worker_ = std::thread([this] { WorkerLoop(); }); }

void Stream::WorkerLoop() {
  t_current_stream = this;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (queue_.empty() && !stopping_) {
      // Poll for the next task a while before sleeping (spin_wait.h).
      const uint64_t seen = enqueued_.load(std::memory_order_relaxed);
      lock.unlock();
      SpinUntil([&] {
        return enqueued_.load(std::memory_order_acquire) != seen;
      });
      lock.lock();
    }
    work_arrived_.wait(lock, [this] {
      return !inline_running_ && (stopping_ || !queue_.empty());
    });
    if (queue_.empty()) break;  // stopping and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    Execute(std::move(task), lock);
  }
  t_current_stream = nullptr;
}

void Stream::Execute(Task task, std::unique_lock<std::mutex>& lock) {
  const bool skip = sticky_status_ != PH_SUCCESS && !task.runs_when_sticky;
  lock.unlock();

  ph_status_t status = PH_SUCCESS;
  char error[kTaskErrorBytes] = "";
  if (!skip) status = task.Run(error, sizeof error);
  task.Release();
  const char* name = task.name != nullptr ? task.name : "(unnamed)";
  std::string message;
  if (status != PH_SUCCESS) {
    error[sizeof error - 1] = '\0';
    message = std::string("work '") + name + "' failed on phantom device " +
              std::to_string(device_) + ": " +
              (error[0] != '\0' ? error : "(the work gave no message)");
  }
  std::function<void()> on_complete = std::move(task.on_complete);
  task = Task{};  // destroy the closures outside the lock

  lock.lock();
  if (status != PH_SUCCESS && sticky_status_ == PH_SUCCESS) {
    sticky_status_ = AsTaskError(status);
    sticky_message_ = std::move(message);
  }
  // Counting the task complete and its on_complete (an event becoming
  // reached) happen under one hold of the lock: a synchronize woken by
  // the count then finds the event reached, and whoever sees the event
  // reached then finds the stream's count up to date.
  ++completed_;
  if (on_complete) on_complete();
  if (!wait_targets_.empty() && *wait_targets_.begin() <= completed_) {
    task_completed_.notify_all();
  }
}

ph_status_t Stream::RunNow(Task task) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::string message;
  const ph_status_t refusal = RefusalLocked(true, &message);
  if (refusal != PH_SUCCESS) {
    lock.unlock();
    task.Release();
    return Fail(refusal, std::move(message));
  }
  const bool idle = queue_.empty() && completed_ == enqueued_ &&
                    !inline_running_;
  if (!idle) {
    queue_.push_back(std::move(task));
    const uint64_t generation = ++enqueued_;
    work_arrived_.notify_one();
    WaitLocked(lock, generation);
    return StickyStatusLocked();
  }
  ++enqueued_;
  inline_running_ = true;
  Stream* const caller_stream = t_current_stream;
  t_current_stream = this;  // the task runs as this stream's work
  Execute(std::move(task), lock);
  t_current_stream = caller_stream;
  inline_running_ = false;
  if (!queue_.empty() || stopping_) work_arrived_.notify_one();
  return StickyStatusLocked();
}
ph_status_t Stream::Enqueue(Task task, bool refuse_when_sticky,
                            uint64_t* out_generation) {
  ph_status_t refusal = PH_SUCCESS;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refusal = RefusalLocked(refuse_when_sticky, &message);
    if (refusal == PH_SUCCESS) {
      queue_.push_back(std::move(task));
      *out_generation = ++enqueued_;
      work_arrived_.notify_one();
      return PH_SUCCESS;
    }
  }
  task.Release();
  return Fail(refusal, std::move(message));
}

ph_status_t Stream::RefusalLocked(bool refuse_when_sticky,
                                  std::string* message) {
  if (stopping_) {
    *message = "the stream is being destroyed";
    return PH_ERROR_INVALID_HANDLE;
  }
  if (refuse_when_sticky && sticky_status_ != PH_SUCCESS) {
    *message = sticky_message_;
    return sticky_status_;
  }
  return PH_SUCCESS;
}

ph_status_t Stream::StickyStatusLocked() {
  if (sticky_status_ == PH_SUCCESS) return PH_SUCCESS;
  return Fail(sticky_status_, sticky_message_);
}

ph_status_t Stream::StickyStatus() {
  std::lock_guard<std::mutex> lock(mutex_);
  return StickyStatusLocked();
}

ph_status_t Stream::Query() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (sticky_status_ != PH_SUCCESS) return StickyStatusLocked();
  return completed_ == enqueued_ ? PH_SUCCESS : PH_NOT_READY;
}

void Stream::WaitLocked(std::unique_lock<std::mutex>& lock,
                        uint64_t generation) {
  if (completed_ >= generation) return;
  // Poll a while before blocking (spin_wait.h); the lock is taken again
  // before returning, so whatever the task's completion did under it
  // (sticky status, on_complete) is visible to the caller.
  lock.unlock();
  const bool done = SpinUntil([&] {
    return completed_.load(std::memory_order_acquire) >= generation;
  });
  lock.lock();
  if (done || completed_ >= generation) return;
  const auto target = wait_targets_.insert(generation);
  task_completed_.wait(lock, [&] { return completed_ >= generation; });
  wait_targets_.erase(target);
}

ph_status_t Stream::Synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  WaitLocked(lock, enqueued_);
  return StickyStatusLocked();
}

void Stream::WaitForGeneration(uint64_t generation) {
  std::unique_lock<std::mutex> lock(mutex_);
  WaitLocked(lock, generation);
}

void Stream::Shutdown() {
  std::lock_guard<std::mutex> join_lock(join_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    work_arrived_.notify_one();
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) {
    worker_.join();
  } else if (worker_.joinable()) {
    worker_.detach();  // last reference dropped by our own task: cannot join
  }
}

ph_stream_t RegisterStream(std::shared_ptr<Stream> stream) {
  return reinterpret_cast<ph_stream_t>(Streams().Add(std::move(stream)));
}

std::shared_ptr<Stream> FindStream(ph_stream_t handle) {
  return Streams().Find(reinterpret_cast<uintptr_t>(handle));
}

std::shared_ptr<Stream> UnregisterStream(ph_stream_t handle) {
  return Streams().Remove(reinterpret_cast<uintptr_t>(handle));
}

std::vector<std::shared_ptr<Stream>> LiveStreams() { return Streams().All(); }

}  // namespace phantom::fake
