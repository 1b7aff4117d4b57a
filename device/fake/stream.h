// Streams: an in-order queue of work run by one worker thread.
//
// Each stream owns a worker thread and a FIFO of Tasks (a kind, a static
// name and a closure). The host thread that queues work returns at once;
// the worker pops a task, runs it without holding the stream lock, calls
// its release, and only then counts it complete. Two counters, `enqueued`
// and `completed`, are generations: queue position n is finished when
// completed >= n, which is what query, synchronize and the blocking copy
// wait on. Query therefore says "ready" only after the last task has
// finished running, not when it was dequeued.
//
// Sticky errors: when a task's run returns an error, the stream records
// "work 'NAME' failed on phantom device D: <task's sentence>" with the
// task's status. From then on tasks are released without running (except
// event markers, which still fire so nothing waiting on an event hangs),
// and query, synchronize and every launch report the error. Only
// ph_stream_destroy clears it (by discarding the stream).
//
// Threads: the worker marks itself with a thread-local "current stream",
// which is how ph_kernel_address knows it runs inside work and how
// synchronize/destroy refuse to wait for the calling worker itself.
//
// Running on the caller (RunNow, for ph_run_host_func and copies from or
// to pageable memory, which block the caller anyway): when the queue is
// empty and nothing is running, the calling thread takes the next
// generation, marks the stream busy (the worker starts nothing meanwhile;
// work queued by others waits behind it), runs the task as the stream's
// current work and counts it complete like the worker would. This saves
// the two thread hand-offs of launch-then-wait for host work whose result
// the caller needs at once.
// Priority is recorded and reported but does not change scheduling on the
// fake (every stream has its own thread; the OS schedules them fairly).
//
// Locking: one mutex per stream guards its queue, counters and sticky
// state; two condition variables signal "work arrived" and "a task
// completed". Task closures run and are destroyed outside the lock.
// Waiting: a waiter polls the completion counter for a short budget before
// blocking, and an idle worker polls the enqueue counter before sleeping
// (spin_wait.h): a thread hand-off through the kernel costs tens of
// microseconds, many times a small op.
#ifndef PHANTOM_FAKE_STREAM_H_
#define PHANTOM_FAKE_STREAM_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "phantom/hal.h"

namespace phantom::fake {

constexpr int kStreamPriorityLow = 0;    // numerically greatest
constexpr int kStreamPriorityHigh = -1;  // numerically least
constexpr size_t kTaskErrorBytes = 1024; // room for a task's error sentence

enum class TaskKind { kHostFunc, kCopy, kMemset, kEventMarker, kEventWait };

struct Task {
  TaskKind kind = TaskKind::kHostFunc;
  const char* name = "(unnamed)";  // static string
  // Runs on the worker; on error writes a sentence into `error`.
  std::function<ph_status_t(char* error, size_t error_size)> run;
  // Called exactly once: after run, or instead of it when skipped.
  std::function<void()> release;
  // Event markers run even on a sticky stream so waiters are released.
  bool runs_when_sticky = false;
  // A host function (ph_launch_host_func, ph_run_host_func) is kept as the
  // caller's plain struct instead of being wrapped in `run` and `release`:
  // no allocation per launch. Used when `run` is empty.
  ph_host_task_t host{};
  // Called as the task counts as completed, under the stream lock (so it
  // must be quick and must not call back into the stream): an event is
  // reached exactly when the stream's query and synchronize say the marker
  // finished. Lock order: stream, then the event record's mutex.
  std::function<void()> on_complete;

  ph_status_t Run(char* error, size_t error_size) {
    if (run) return run(error, error_size);
    return host.run != nullptr ? host.run(host.user_data, error, error_size)
                               : PH_SUCCESS;
  }
  // Exactly once per task: after Run, or instead of it.
  void Release() {
    if (release) {
      release();
    } else if (host.release != nullptr) {
      host.release(host.user_data);
    }
  }
};

class Stream {
 public:
  Stream(int device, int priority);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Starts the worker thread. May throw std::system_error.
  void Start();

  // Queues `task`. If `refuse_when_sticky` and the stream has a sticky
  // error, or the stream is shutting down, the task is released (on the
  // calling thread) and an error is returned; the message is set.
  // *out_generation receives the task's position (completed >= it = done).
  ph_status_t Enqueue(Task task, bool refuse_when_sticky,
                      uint64_t* out_generation);

  // Runs `task` in stream order and returns once it has completed
  // (ph_run_host_func): on the calling thread when the stream is idle,
  // else queued and waited for. Returns PH_SUCCESS or the sticky error.
  ph_status_t RunNow(Task task);

  // PH_SUCCESS, PH_NOT_READY or the sticky error (message set).
  ph_status_t Query();
  // Blocks until every task queued before the call has completed; returns
  // PH_SUCCESS or the sticky error (message set).
  ph_status_t Synchronize();
  // Blocks until task number `generation` has completed.
  void WaitForGeneration(uint64_t generation);
  // The sticky status (message set on the calling thread when an error).
  ph_status_t StickyStatus();

  // Drains the queue, stops and joins the worker. Idempotent.
  void Shutdown();

  int device() const { return device_; }
  int priority() const { return priority_; }

 private:
  void WorkerLoop();
  // Runs (or, on a sticky stream, skips) a dequeued task without the lock,
  // then counts it complete; `lock` is held on entry and on return.
  void Execute(Task task, std::unique_lock<std::mutex>& lock);
  ph_status_t StickyStatusLocked();
  // Why a new task must be refused (stream shutting down; or sticky, if
  // asked), with the message; PH_SUCCESS to accept it.
  ph_status_t RefusalLocked(bool refuse_when_sticky, std::string* message);

  const int device_;
  const int priority_;
  std::mutex mutex_;  // guards everything below
  std::condition_variable work_arrived_;
  std::condition_variable task_completed_;
  // Generations that threads are waiting for. The worker wakes waiters only
  // when the smallest is reached, not after every task: on a machine with
  // few cores, waking a waiter per task makes it compete with the worker.
  std::multiset<uint64_t> wait_targets_;
  void WaitLocked(std::unique_lock<std::mutex>& lock, uint64_t generation);
  std::deque<Task> queue_;
  // Written under mutex_; atomic so that waiters can poll them unlocked
  // before blocking (spin_wait.h).
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  ph_status_t sticky_status_ = PH_SUCCESS;
  std::string sticky_message_;
  bool stopping_ = false;
  // A task is running on a host thread (RunNow); the worker starts nothing
  // until it completes, so stream order holds.
  bool inline_running_ = false;
  std::thread worker_;
  std::mutex join_mutex_;  // serialises Shutdown's join
};

// The stream whose worker is the calling thread, or null on host threads.
Stream* CurrentStream();

// Live streams, by handle.
ph_stream_t RegisterStream(std::shared_ptr<Stream> stream);
std::shared_ptr<Stream> FindStream(ph_stream_t handle);
std::shared_ptr<Stream> UnregisterStream(ph_stream_t handle);
std::vector<std::shared_ptr<Stream>> LiveStreams();

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_STREAM_H_
