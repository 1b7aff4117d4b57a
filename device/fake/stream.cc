// Stream workers and the stream registry; see stream.h.
#include "stream.h"

#include <pthread.h>

#include <cstring>
#include <string>
#include <utility>

#include "activity.h"
#include "activity_trace.h"
#include "copy_channels.h"
#include "errors.h"
#include "handle_registry.h"
#include "idle_thread_teams.h"
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

// The device meter a task's running time counts on (activity.h): kernels
// make the device busy, copies and fills its memory; event markers and
// waits are bookkeeping.
ActivityMeter* MeterFor(TaskKind kind, int device) {
  switch (kind) {
    case TaskKind::kHostFunc:
      return &ComputeMeter(device);
    case TaskKind::kCopy:
    case TaskKind::kMemset:
      return &MemoryMeter(device);
    default:
      return nullptr;
  }
}

}  // namespace

Stream* CurrentStream() { return t_current_stream; }

namespace {
std::atomic<uint64_t> g_next_trace_id{1};
}  // namespace

Stream::Stream(int device, int priority)
    : device_(device),
      priority_(priority),
      trace_id_(g_next_trace_id.fetch_add(1, std::memory_order_relaxed)),
      slots_(new Slot[kLaunchQueueSlots]) {
  for (uint64_t i = 0; i < kLaunchQueueSlots; ++i) {
    slots_[i].sequence.store(i, std::memory_order_relaxed);
  }
}

Stream::~Stream() { Shutdown(); }

void Stream::Start() { worker_ = std::thread([this] { WorkerLoop(); }); }

Stream::Slot& Stream::SlotAt(uint64_t position) const {
  return slots_[position & (kLaunchQueueSlots - 1)];
}

bool Stream::ClosedAndDrained() const {
  const uint64_t tail = tail_.load(std::memory_order_seq_cst);
  // Every claimed position consumed and completed: a helper
  // (RunQueuedUpTo) may still be running the last task it took.
  return (tail & kClosedBit) != 0 &&
         (tail & ~kClosedBit) == head_.load(std::memory_order_seq_cst) &&
         (tail & ~kClosedBit) == completed_.load(std::memory_order_seq_cst);
}

bool Stream::NextPublished() const {
  const uint64_t head = head_.load(std::memory_order_seq_cst);
  return SlotAt(head).sequence.load(std::memory_order_seq_cst) == head + 1 ||
         overflow_front_.load(std::memory_order_seq_cst) == head;
}

bool Stream::TryTakeConsumer() {
  return !consumer_busy_.load(std::memory_order_relaxed) &&
         !consumer_busy_.exchange(true, std::memory_order_acquire);
}

void Stream::ReleaseConsumer() {
  consumer_busy_.store(false, std::memory_order_seq_cst);
  // A worker that found the queue's next task taken by a helper may have
  // gone to sleep meanwhile (its wait checks consumer_busy_ after
  // announcing itself): it must see the rest of the queue.
  if (worker_sleeping_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(mutex_);
    work_arrived_.notify_one();
  }
}

bool Stream::TakeNext(Task* task, bool* ran_inline) {
  const uint64_t head = head_.load(std::memory_order_relaxed);
  Slot& slot = SlotAt(head);
  if (slot.sequence.load(std::memory_order_acquire) == head + 1) {
    if (slot.compact) {
      *task = Task{};
      task->kind = slot.kind;
      task->name = slot.name;
      if (slot.kind == TaskKind::kHostFunc) {
        task->host = slot.host;
      } else {
        task->copy_dst = slot.copy.dst;
        task->copy_src = slot.copy.src;
        task->bytes = slot.copy.bytes;
        task->copy_kind = static_cast<ph_memcpy_kind_t>(slot.copy_kind);
        task->fill_byte = slot.fill_byte;
      }
    } else {
      *task = std::exchange(slot.task, Task{});
    }
    *ran_inline = slot.ran_inline;
  } else {
    if (overflow_front_.load(std::memory_order_seq_cst) != head) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = overflow_.begin();  // == head: only the consumer erases
    *task = std::move(it->second.task);
    *ran_inline = it->second.ran_inline;
    overflow_.erase(it);
    overflow_front_.store(overflow_.empty() ? kNone : overflow_.begin()->first,
                          std::memory_order_seq_cst);
    // The slot was not used in this lap: it is free from the last one.
  }
  // Free the slot for the producer one lap later.
  slot.sequence.store(head + kLaunchQueueSlots, std::memory_order_seq_cst);
  head_.store(head + 1, std::memory_order_release);
  return true;
}

void Stream::WorkerLoop() {
  t_current_stream = this;
  // Named, so that top -H, perf and gdb tell a device's workers from the
  // host's threads ("ph-stream-d0"; Linux keeps 15 characters).
  const std::string name = "ph-stream-d" + std::to_string(device_);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  for (;;) {
    // One task per hold of the consumer role, so that a waiting host
    // thread can take over between two tasks (RunQueuedUpTo).
    if (TryTakeConsumer()) {
      Task task;
      bool ran_inline = false;
      const bool took = TakeNext(&task, &ran_inline);
      if (took && !ran_inline) Execute(std::move(task));
      consumer_busy_.store(false, std::memory_order_release);
      if (took) continue;
    }
    if (ClosedAndDrained()) break;
    // Poll for the next task a while before sleeping (spin_wait.h); a task
    // a helper is running is not the worker's to wait for.
    const auto ready = [&] {
      return (!consumer_busy_.load(std::memory_order_seq_cst) &&
              NextPublished()) ||
             ClosedAndDrained();
    };
    // While a waiting host thread holds the consumer role it may be
    // running long kernels on its OpenMP team: poll only kSpinBudget of
    // that, then sleep (its hand-back wakes this thread), so as not to
    // take a core from the team.
    std::chrono::steady_clock::time_point helper_since{};
    bool helper_long = false;
    const auto ready_or_helper_long = [&] {
      if (ready()) return true;
      if (!consumer_busy_.load(std::memory_order_relaxed)) {
        helper_since = {};
        return false;
      }
      const auto now = std::chrono::steady_clock::now();
      if (helper_since == std::chrono::steady_clock::time_point{}) {
        helper_since = now;
      }
      helper_long = now - helper_since >= kSpinBudget;
      return helper_long;
    };
    if (!SpinUntil(ready_or_helper_long, kIdlePollBudget) || helper_long) {
      std::unique_lock<std::mutex> lock(mutex_);
      worker_sleeping_.store(true, std::memory_order_seq_cst);
      // Idle for kTeamReleaseDelay: give back the OpenMP team the
      // kernels made on this thread (idle_thread_teams.h), unlocked.
      if (!work_arrived_.wait_for(lock, kTeamReleaseDelay, ready)) {
        lock.unlock();
        ReleaseThreadOpenMpTeam();
        lock.lock();
        work_arrived_.wait(lock, ready);
      }
      worker_sleeping_.store(false, std::memory_order_relaxed);
    }
  }
  t_current_stream = nullptr;
}

void RunCopyWork(TaskKind kind, void* dst, const void* src, int fill_byte,
                 uint64_t bytes) {
  if (kind == TaskKind::kMemset) {
    std::memset(dst, fill_byte, bytes);
  } else {
    ChannelCopy(dst, src, bytes);
  }
}

ph_status_t RunTraced(Task& task, int device, uint64_t stream_trace_id,
                      uint64_t correlation, char* error, size_t error_size) {
  ph_activity_record_t record{};
  record.kind = task.kind == TaskKind::kCopy     ? PH_ACTIVITY_MEMCPY
                : task.kind == TaskKind::kMemset ? PH_ACTIVITY_MEMSET
                                                 : PH_ACTIVITY_HOST_WORK;
  record.device = device;
  record.stream_id = stream_trace_id;
  record.correlation_id = correlation;
  record.name = record.kind == PH_ACTIVITY_HOST_WORK ? task.name : nullptr;
  record.bytes = task.bytes;
  record.copy_kind = task.copy_kind;
  record.start_ns = NowNs();
  const ph_status_t status = task.Run(error, error_size);
  record.end_ns = NowNs();
  trace::Record(record);
  return status;
}

void Stream::Execute(Task task) {
  const bool skip =
      sticky_status_.load(std::memory_order_acquire) != PH_SUCCESS &&
      !task.runs_when_sticky;
  if (task.wait && !skip) {
    ExecuteWait(std::move(task));
    return;
  }
  ph_status_t status = PH_SUCCESS;
  char error[kTaskErrorBytes] = "";
  if (!skip) {
    const MeteredSpan metered(MeterFor(task.kind, device_));
    if (trace::On() && task.kind != TaskKind::kEventMarker) {
      status = RunTraced(task, device_, trace_id_, task.correlation, error,
                         sizeof error);
    } else {
      status = task.Run(error, sizeof error);
    }
  }
  task.Release();
  const char* name = task.name != nullptr ? task.name : "(unnamed)";
  auto on_complete = std::move(task.on_complete);
  task = Task{};  // destroy the closures before the task counts complete

  if (status == PH_SUCCESS && !on_complete) {
    // The common case, without the lock.
    completed_.fetch_add(1, std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      NotifyWaitersLocked();
    }
    return;
  }
  std::string message;
  if (status != PH_SUCCESS) {
    error[sizeof error - 1] = '\0';
    message = std::string("work '") + name + "' failed on phantom device " +
              std::to_string(device_) + ": " +
              (error[0] != '\0' ? error : "(the work gave no message)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (status != PH_SUCCESS) {
    std::string origin = message;
    SetStickyLocked(AsTaskError(status), std::move(message), std::move(origin));
  }
  // Counting the task complete and its on_complete (an event becoming
  // reached) happen under one hold of the lock, and Query, Synchronize and
  // WaitForGeneration take the lock before they answer: a synchronize that
  // sees the count then finds the event reached, and whoever sees the
  // event reached then finds the stream's count up to date. The sticky
  // state handed to on_complete is that of the work before the marker:
  // only this stream's own tasks, run one at a time, change it.
  completed_.fetch_add(1, std::memory_order_seq_cst);
  if (on_complete) {
    on_complete(sticky_status_.load(std::memory_order_relaxed),
                sticky_origin_);
  }
  NotifyWaitersLocked();
}

void Stream::ExecuteWait(Task task) {
  std::string message;
  std::string origin;
  const ph_status_t failure = task.wait(&message, &origin);
  task.Release();
  task = Task{};
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure != PH_SUCCESS) {
    SetStickyLocked(AsTaskError(failure), std::move(message),
                    std::move(origin));
  }
  completed_.fetch_add(1, std::memory_order_seq_cst);
  NotifyWaitersLocked();
}

void Stream::SetStickyLocked(ph_status_t status, std::string message,
                             std::string origin) {
  if (sticky_status_.load(std::memory_order_relaxed) != PH_SUCCESS) return;
  sticky_message_ = std::move(message);
  sticky_origin_ = std::move(origin);
  sticky_status_.store(status, std::memory_order_release);
}

void Stream::NotifyWaitersLocked() {
  if (!wait_targets_.empty() &&
      *wait_targets_.begin() <= completed_.load(std::memory_order_relaxed)) {
    task_completed_.notify_all();
  }
}

bool Stream::Claim(uint64_t* position, bool only_when_idle) {
  uint64_t tail = tail_.load(std::memory_order_seq_cst);
  for (;;) {
    if ((tail & kClosedBit) != 0) return false;
    if (only_when_idle &&
        completed_.load(std::memory_order_seq_cst) != tail) {
      return false;
    }
    if (tail_.compare_exchange_weak(tail, tail + 1,
                                    std::memory_order_seq_cst)) {
      *position = tail;
      return true;
    }
    // `tail` now holds the current value: try again.
  }
}

bool Stream::Compact(const Task& task) {
  if (task.run || task.release || task.on_complete || task.wait ||
      task.runs_when_sticky || task.correlation != 0) {
    return false;
  }
  switch (task.kind) {
    case TaskKind::kHostFunc:
      return task.copy_dst == nullptr && task.bytes == 0 &&
             task.copy_kind == PH_MEMCPY_HOST_TO_HOST;
    case TaskKind::kCopy:
    case TaskKind::kMemset:
      return task.copy_dst != nullptr && task.host.run == nullptr &&
             task.host.release == nullptr;
    default:
      return false;
  }
}

void Stream::Publish(uint64_t position, Task task, bool ran_inline) {
  Slot& slot = SlotAt(position);
  if (slot.sequence.load(std::memory_order_acquire) == position) {
    // The slot is free for this lap: the common, lock-free case.
    slot.compact = Compact(task);
    if (slot.compact) {
      slot.kind = task.kind;
      slot.name = task.name;
      if (task.kind == TaskKind::kHostFunc) {
        slot.host = task.host;
      } else {
        slot.copy = {task.copy_dst, task.copy_src, task.bytes};
        slot.copy_kind = static_cast<uint8_t>(task.copy_kind);
        slot.fill_byte = task.fill_byte;
      }
    } else {
      slot.task = std::move(task);
    }
    slot.ran_inline = ran_inline;
    slot.sequence.store(position + 1, std::memory_order_seq_cst);
    if (worker_sleeping_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(mutex_);
      work_arrived_.notify_one();
    }
    return;
  }
  // The task one lap earlier still holds the slot (the queue is more than
  // kLaunchQueueSlots deep): the overflow keeps this one.
  std::lock_guard<std::mutex> lock(mutex_);
  overflow_.emplace(position, Overflowed{std::move(task), ran_inline});
  overflow_front_.store(overflow_.begin()->first, std::memory_order_seq_cst);
  work_arrived_.notify_one();
}

ph_status_t Stream::Enqueue(Task task, bool refuse_when_sticky,
                            uint64_t* out_generation) {
  std::string message;
  if (trace::On()) task.correlation = trace::CurrentCorrelation();
  ph_status_t refusal = Refusal(refuse_when_sticky, &message);
  if (refusal == PH_SUCCESS) {
    uint64_t position = 0;
    if (Claim(&position, /*only_when_idle=*/false)) {
      Publish(position, std::move(task), /*ran_inline=*/false);
      *out_generation = position + 1;
      return PH_SUCCESS;
    }
    // Closed since the check above; the bit stays set, so this refuses.
    refusal = Refusal(false, &message);
  }
  task.Release();
  return Fail(refusal, std::move(message));
}

ph_status_t Stream::RunNow(Task task) {
  std::string message;
  if (trace::On()) task.correlation = trace::CurrentCorrelation();
  const ph_status_t refusal = Refusal(true, &message);
  if (refusal != PH_SUCCESS) {
    task.Release();
    return Fail(refusal, std::move(message));
  }
  uint64_t position = 0;
  bool claimed = Claim(&position, /*only_when_idle=*/true);
  if (!claimed && (tail_.load(std::memory_order_acquire) & kClosedBit) == 0) {
    // Busy: wait for the work queued so far, as the task would, then run
    // it here if no other thread queued more meanwhile. The worker never
    // sees the task, so a blocking copy after a kernel (what `.item()`
    // makes) costs one hand-off between threads instead of two.
    WaitForGeneration(Enqueued());
    // Refused as at the top: the queued work failed (sticky), or the
    // stream is being destroyed.
    const ph_status_t refused = Refusal(true, &message);
    if (refused != PH_SUCCESS) {
      task.Release();
      return Fail(refused, std::move(message));
    }
    claimed = Claim(&position, /*only_when_idle=*/true);
  }
  if (!claimed) {
    // Closing, or more work arrived: queue it and wait, as the worker runs it.
    uint64_t generation = 0;
    const ph_status_t queued = Enqueue(std::move(task), true, &generation);
    if (queued != PH_SUCCESS) return queued;
    WaitForGeneration(generation);
    return StickyStatus();
  }
  // Every earlier task has completed and the worker waits at this
  // position: run the task here, as the stream's work, then publish the
  // position marked "already run" so the worker moves past it.
  Stream* const caller_stream = t_current_stream;
  t_current_stream = this;
  Execute(std::move(task));
  t_current_stream = caller_stream;
  Publish(position, Task{}, /*ran_inline=*/true);
  return StickyStatus();
}

ph_status_t Stream::Refusal(bool refuse_when_sticky, std::string* message) {
  if (refuse_when_sticky &&
      sticky_status_.load(std::memory_order_acquire) != PH_SUCCESS) {
    std::lock_guard<std::mutex> lock(mutex_);
    *message = sticky_message_;
    return sticky_status_.load(std::memory_order_relaxed);
  }
  if ((tail_.load(std::memory_order_acquire) & kClosedBit) != 0) {
    *message = "the stream is being destroyed";
    return PH_ERROR_INVALID_HANDLE;
  }
  return PH_SUCCESS;
}

ph_status_t Stream::StickyStatusLocked() {
  const ph_status_t status = sticky_status_.load(std::memory_order_relaxed);
  if (status == PH_SUCCESS) return PH_SUCCESS;
  return Fail(status, sticky_message_);
}

ph_status_t Stream::StickyStatus() {
  if (sticky_status_.load(std::memory_order_acquire) == PH_SUCCESS) {
    return PH_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return StickyStatusLocked();
}

ph_status_t Stream::Query() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (sticky_status_.load(std::memory_order_relaxed) != PH_SUCCESS) {
    return StickyStatusLocked();
  }
  return completed_.load(std::memory_order_seq_cst) == Enqueued()
             ? PH_SUCCESS
             : PH_NOT_READY;
}

void Stream::WaitLocked(std::unique_lock<std::mutex>& lock,
                        uint64_t generation) {
  if (completed_.load(std::memory_order_seq_cst) >= generation) return;
  // Poll a while before blocking (spin_wait.h); the lock is taken again
  // before returning, so whatever the task's completion did under it
  // (sticky status, on_complete) is visible to the caller.
  lock.unlock();
  const bool may_run = t_current_stream == nullptr;
  const bool done = SpinUntil([&] {
    if (completed_.load(std::memory_order_acquire) >= generation) return true;
    if (may_run) RunQueuedUpTo(generation);
    return completed_.load(std::memory_order_acquire) >= generation;
  });
  lock.lock();
  if (done) return;
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  const auto target = wait_targets_.insert(generation);
  task_completed_.wait(lock, [&] {
    return completed_.load(std::memory_order_seq_cst) >= generation;
  });
  wait_targets_.erase(target);
  waiters_.fetch_sub(1, std::memory_order_relaxed);
}

void Stream::RunQueuedUpTo(uint64_t generation) {
  if (!NextPublished() || !TryTakeConsumer()) return;
  Stream* const caller_stream = t_current_stream;
  t_current_stream = this;
  Task task;
  bool ran_inline = false;
  while (head_.load(std::memory_order_relaxed) < generation &&
         TakeNext(&task, &ran_inline)) {
    if (!ran_inline) Execute(std::move(task));
    task = Task{};
  }
  t_current_stream = caller_stream;
  ReleaseConsumer();
}

ph_status_t Stream::Synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  WaitLocked(lock, Enqueued());
  return StickyStatusLocked();
}

void Stream::WaitForGeneration(uint64_t generation) {
  std::unique_lock<std::mutex> lock(mutex_);
  WaitLocked(lock, generation);
}

void Stream::Shutdown() {
  std::lock_guard<std::mutex> join_lock(join_mutex_);
  tail_.fetch_or(kClosedBit, std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lock(mutex_);
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
