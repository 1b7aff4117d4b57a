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
// A failure also travels along events (hal.h's error model): a marker
// hands the stream's sticky state at its place in the queue to its event
// record (on_complete), and an event wait whose record carries a failure
// makes this stream sticky with it, at the wait's place (Task::wait). The
// stream keeps the original failure's message apart from what it reports
// (sticky_origin_), so a failure inherited through several streams is
// still told as the original, with one "inherited" prefix, not one per
// hop. Both are tasks of the locked slow path; launches and ordinary
// tasks do not change.
//
// Threads: the worker marks itself with a thread-local "current stream",
// which is how ph_kernel_address knows it runs inside work and how
// synchronize/destroy refuse to wait for the calling worker itself.
//
// Running on the caller (RunNow, for ph_run_host_func and copies from or
// to pageable memory, which block the caller anyway): when every queued
// task has completed, the calling thread claims the next position (the
// worker waits at that slot, so it starts nothing meanwhile; work queued
// by others waits behind it), runs the task as the stream's current work,
// counts it complete like the worker would, and then publishes the slot
// marked "already run", which the worker only frees. This saves the two
// thread hand-offs of launch-then-wait for host work whose result the
// caller needs at once.
// Priority is recorded and reported but does not change scheduling on the
// fake (every stream has its own thread; the OS schedules them fairly).
//
// The launch queue takes no lock per push or pop: a ring of
// kLaunchQueueSlots slots, each with a sequence number (Vyukov's bounded
// queue). A producer claims a position with one
// compare-and-swap on `tail_`, moves its task into the slot and publishes
// it by storing the slot's sequence; the worker, the only consumer, reads
// slots in order without any lock. Position n holds generation n + 1.
// With a mutex, the host's push and the worker's pop and completion took
// one lock three times per op; on two cores that contention cost a futex
// system call every few ops. The mutex is still there, but only for the
// uncommon paths: sleeping and waking (an idle worker, a waiter), the
// overflow, sticky errors and event markers.
// The ring does not bound the queue: a task whose slot is still held by
// the task one lap earlier (more than kLaunchQueueSlots pending) goes to
// an overflow map under the mutex, keyed by its position, and the worker
// takes it from there in its turn. A launch never waits for room: it may
// be made under a lock that the stream's own work needs (the caching
// allocator records events under its mutex, and device work allocates),
// or from that work itself. Destroy closes the queue with the high bit of
// `tail_`: no position can be claimed after it, and the worker exits once
// it has consumed every claimed position.
// Sleeping without lost wake-ups: a sleeper (the worker, a waiter)
// announces itself in an atomic before it checks its condition
// a last time under the mutex; whoever makes the condition true stores it
// first and then reads the announcement (both sequentially consistent),
// and takes the mutex to notify only if someone sleeps.
// Waiting: a waiter polls the completion counter for a short budget before
// blocking, and an idle worker polls its next slot before sleeping
// (spin_wait.h): a thread hand-off through the kernel costs tens of
// microseconds, many times a small op.
// A waiting host thread also runs the queue itself: taking the next task
// is a role (consumer_busy_), which the worker takes for one task at a
// time and a host thread waiting for the stream (Synchronize,
// WaitForGeneration, RunNow on a busy stream) takes while polling, to run
// the published tasks up to the one it waits for, as the stream's work
// (t_current_stream), then hands back. The queue stays in order and each
// task runs once, on whichever thread holds the role; a task the worker is
// running is waited for, never taken over. This removes the hand-off when
// the worker is not on a core: on a loaded machine a worker preempted
// while it polled its queue cost a waiter its whole time slice (ms), and
// the waiter's own polling took the core it needed. Work running on a
// stream's worker (a device task that waits) only waits: it never runs
// another stream's queue.
#ifndef PHANTOM_FAKE_STREAM_H_
#define PHANTOM_FAKE_STREAM_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
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

enum class TaskKind : uint8_t {
  kHostFunc,
  kCopy,
  kMemset,
  kEventMarker,
  kEventWait
};

// A queued copy or fill: `bytes` from `src` to `dst` over the copy
// channels (kind kCopy), or `bytes` of `fill_byte` at `dst` (kMemset).
void RunCopyWork(TaskKind kind, void* dst, const void* src, int fill_byte,
                 uint64_t bytes);

struct Task {
  TaskKind kind = TaskKind::kHostFunc;
  const char* name = "(unnamed)";  // static string
  // Runs on the worker; on error writes a sentence into `error`.
  std::function<ph_status_t(char* error, size_t error_size)> run;
  // Called exactly once: after run, or instead of it when skipped.
  std::function<void()> release;
  // Event markers run even on a sticky stream so waiters are released.
  bool runs_when_sticky = false;
  // The activity trace (activity_trace.h): the launching thread's
  // correlation id (taken when queued while tracing is on), and a copy's
  // or fill's size and a copy's direction.
  uint64_t correlation = 0;
  uint64_t bytes = 0;
  ph_memcpy_kind_t copy_kind = PH_MEMCPY_HOST_TO_HOST;
  // A host function (ph_launch_host_func, ph_run_host_func) is kept as the
  // caller's plain struct instead of being wrapped in `run` and `release`:
  // no allocation per launch. Used when `run` is empty.
  ph_host_task_t host{};
  // Likewise a queued copy (kCopy: `bytes` from copy_src to copy_dst, both
  // host-addressable, over the copy channels) or fill (kMemset: `bytes` of
  // fill_byte at copy_dst) is kept as plain data. Used when `run` is empty
  // and copy_dst is set.
  void* copy_dst = nullptr;
  const void* copy_src = nullptr;
  int fill_byte = 0;
  // Called as the task counts as completed, under the stream lock (so it
  // must be quick and must not call back into the stream): an event is
  // reached exactly when the stream's query and synchronize say the marker
  // finished. It receives the stream's sticky state at that point: the
  // status (PH_SUCCESS if no earlier work failed) and the original
  // failure's message. Lock order: stream, then the event record's mutex.
  std::function<void(ph_status_t failure, const std::string& origin)>
      on_complete;
  // An event wait (TaskKind::kEventWait), run instead of `run`: blocks
  // until the awaited point is reached and returns the failure it carries
  // (PH_SUCCESS if none), with the message the stream then reports and the
  // original failure's message. The failure is inherited, not this task's
  // own, so its message is not wrapped in "work 'NAME' failed".
  std::function<ph_status_t(std::string* message, std::string* origin)> wait;

  ph_status_t Run(char* error, size_t error_size) {
    if (run) return run(error, error_size);
    if (copy_dst != nullptr) {
      RunCopyWork(kind, copy_dst, copy_src, fill_byte, bytes);
      return PH_SUCCESS;
    }
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

// Slots in a stream's lock-free ring; more pending tasks overflow.
constexpr uint64_t kLaunchQueueSlots = 1024;  // a power of two

// Runs `task` on the calling thread and records it in the activity trace
// (activity_trace.h) as work of stream `stream_trace_id` on `device`, tagged
// with `correlation`: a stream's worker for each task it runs while tracing
// is on, and a graph replay for each node it runs (graph.cc).
ph_status_t RunTraced(Task& task, int device, uint64_t stream_trace_id,
                      uint64_t correlation, char* error, size_t error_size);

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
  // Unique among the process's streams, never reused (the activity
  // trace's stream_id; 1 for the first).
  uint64_t trace_id() const { return trace_id_; }
  int priority() const { return priority_; }

 private:
  // A slot's first cache line holds everything a plain host task (a
  // queued kernel: ph_launch_host_func) or a plain copy or fill
  // (ph_memcpy_async, ph_memset_async) needs when untraced, and such a
  // task is stored there alone: the launch writes one line and the
  // consumer reads it, instead of the ~250 bytes of a Task (four
  // closures), which moved between the host's core and the worker's on
  // every op. Other tasks (event markers and waits, traced work) are kept
  // whole in `task`.
  struct CompactCopy {
    void* dst;
    const void* src;
    uint64_t bytes;
  };
  struct alignas(64) Slot {
    // == position: free for that position's producer; position + 1: holds
    // its task; position + kLaunchQueueSlots: consumed, free for the next
    // lap.
    std::atomic<uint64_t> sequence{0};
    // A RunNow task that already ran on its caller: the consumer only
    // frees the slot.
    bool ran_inline = false;
    bool compact = false;  // the task is the fields below alone
    TaskKind kind = TaskKind::kHostFunc;
    uint8_t copy_kind = 0;   // a ph_memcpy_kind_t
    int32_t fill_byte = 0;
    const char* name = nullptr;
    union {
      ph_host_task_t host;  // kHostFunc
      CompactCopy copy;     // kCopy, kMemset
    };
    Task task;  // when not compact
    Slot() : host{} {}
  };
  // Whether `task` is a plain host task that a slot's first line holds.
  static bool Compact(const Task& task);
  struct Overflowed {
    Task task;
    bool ran_inline = false;
  };
  static constexpr uint64_t kClosedBit = uint64_t{1} << 63;

  void WorkerLoop();
  Slot& SlotAt(uint64_t position) const;
  // Claims the next position into *position: false if the queue is closed,
  // or, with `only_when_idle`, unless every earlier task has completed.
  bool Claim(uint64_t* position, bool only_when_idle);
  // Hands the task of a claimed position to the worker (its slot, or the
  // overflow) and wakes a sleeping worker.
  void Publish(uint64_t position, Task task, bool ran_inline);
  // Takes the task at head_ if it has been published (without the lock
  // when it is in the ring); false if not yet. Only the holder of the
  // consumer role (TryTakeConsumer) calls it.
  bool TakeNext(Task* task, bool* ran_inline);
  // Whether the task at head_ has been published.
  bool NextPublished() const;
  // The consumer role: whoever holds it takes and runs the queue's tasks,
  // one at a time, in order (the worker, or a waiting host thread).
  bool TryTakeConsumer();
  // Gives the role back from a helper, waking the worker if it sleeps.
  void ReleaseConsumer();
  // A waiting host thread runs the queued tasks up to position
  // `generation` itself, if the worker is not running one (see the top
  // comment, "Waiting").
  void RunQueuedUpTo(uint64_t generation);
  // Every claimed position consumed and completed after Shutdown closed
  // the queue.
  bool ClosedAndDrained() const;
  // Runs (or, on a sticky stream, skips) a task on the calling thread and
  // counts it complete; no lock is held on entry.
  void Execute(Task task);
  // Execute for an event wait that is not skipped (Task::wait).
  void ExecuteWait(Task task);
  // Makes the stream sticky unless it already is; mutex_ held.
  void SetStickyLocked(ph_status_t status, std::string message,
                       std::string origin);
  // Wakes waiters whose generation has completed; mutex_ held.
  void NotifyWaitersLocked();
  ph_status_t StickyStatusLocked();
  // Why a new task must be refused (the queue closed; or sticky, if
  // asked), with the message; PH_SUCCESS to accept it.
  ph_status_t Refusal(bool refuse_when_sticky, std::string* message);
  void WaitLocked(std::unique_lock<std::mutex>& lock, uint64_t generation);
  uint64_t Enqueued() const {
    return tail_.load(std::memory_order_acquire) & ~kClosedBit;
  }

  const int device_;
  const int priority_;
  const uint64_t trace_id_;
  std::unique_ptr<Slot[]> slots_;
  // Cache lines by who writes them, so that a launch and the worker's
  // step touch no line the other side wrote in steady state.
  // Written by producers: positions claimed so far (and kClosedBit).
  alignas(64) std::atomic<uint64_t> tail_{0};
  // Written by the worker (or a RunNow caller) per task: tasks counted
  // complete, and the next position to consume (the worker's own).
  alignas(64) std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> head_{0};  // written by the consumer-role holder
  std::atomic<bool> consumer_busy_{false};  // the consumer role is held
  // Read on every launch or task, written only on uncommon paths.
  // Who sleeps on the mutex's condition variables (see the top comment).
  alignas(64) std::atomic<bool> worker_sleeping_{false};
  std::atomic<int> waiters_{0};
  // The smallest position in overflow_, or kNone; written under mutex_,
  // read without it.
  static constexpr uint64_t kNone = ~uint64_t{0};
  std::atomic<uint64_t> overflow_front_{kNone};
  // Written under mutex_ (after sticky_message_); read without it.
  std::atomic<ph_status_t> sticky_status_{PH_SUCCESS};

  // Guards what follows, and the sleeping above.
  alignas(64) std::mutex mutex_;
  std::condition_variable work_arrived_;
  std::condition_variable task_completed_;
  // Tasks whose ring slot was still taken one lap earlier, by position.
  std::map<uint64_t, Overflowed> overflow_;
  // Generations that threads are waiting for. The worker wakes waiters only
  // when the smallest is reached, not after every task: on a machine with
  // few cores, waking a waiter per task makes it compete with the worker.
  std::multiset<uint64_t> wait_targets_;
  std::string sticky_message_;  // what query, synchronize, launch report
  std::string sticky_origin_;   // the original failure's message
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
