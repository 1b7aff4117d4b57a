// Memory history of the caching device allocator: what
// torch.phantom.memory._record_memory_history records, in
// torch.cuda.memory's terms, so that _snapshot() is a dict PyTorch's
// memory_viz reads.
//
// Each device's allocator owns one AllocatorHistory and calls it from a few
// hooks: an allocation, a free asked for (free_requested), a block back in
// its pool (free_completed, which record_stream can delay until the other
// streams' work is done), a segment got from or given back to the driver,
// an out-of-memory error. The history keeps, per its options:
//  - "state": the stack that allocated each live block and segment,
//    reported with the blocks of a snapshot;
//  - "all": also a trace of those actions (a ring of at most max_entries
//    entries, oldest dropped first), each with address, size, stream and
//    time, and a stack where `context` asks for one.
// Stacks are torch's CapturedTraceback (Python and TorchScript frames; C++
// frames too with stacks="all"): gathered by the caller before the device
// lock is taken, kept unsymbolized (a few words per frame) and turned into
// file/line/name only when a snapshot is taken. Work running on a stream
// worker gathers no Python frames (the worker must never wait for the GIL
// a host thread may hold while it waits for that stream).
//
// Off (the default), each hook costs one relaxed atomic load.
//
// Locking: everything but the mode is guarded by the device allocator's
// mutex; gather() runs without it.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace phantom {

// The options of _record_memory_history, parsed.
struct HistoryOptions {
  bool enabled = false;  // "state" or "all"; false: None
  bool trace = false;    // "all": keep the trace of actions
  c10::CachingDeviceAllocator::RecordContext context =
      c10::CachingDeviceAllocator::RecordContext::NEVER;
  bool cpp_frames = false;  // stacks="all"
  size_t max_entries = SIZE_MAX;
  bool clear = false;  // drop the trace recorded so far
  uint32_t skip_actions = 0;  // bit TraceEntry::Action: not traced
};

// Called after an out-of-memory error, outside the allocator's lock, with
// the device, the bytes requested, the bytes this process may use on the
// device (its capacity, or less under a memory fraction) and the bytes the
// driver says are free.
using OutOfMemoryObserver = std::function<void(
    c10::DeviceIndex device, size_t requested, size_t allowed, size_t free)>;

// Observers are process-wide and never removed (as on CUDA).
void attachOutOfMemoryObserver(OutOfMemoryObserver observer);
void notifyOutOfMemory(c10::DeviceIndex device, size_t requested,
                       size_t allowed, size_t free);

class AllocatorHistory {
 public:
  using Action = c10::CachingDeviceAllocator::TraceEntry::Action;
  using Context = std::shared_ptr<c10::GatheredContext>;

  explicit AllocatorHistory(c10::DeviceIndex device) : device_(device) {}

  // Anything to record at all (one relaxed load).
  bool on() const { return mode_.load(std::memory_order_relaxed) != 0; }

  // The stack to keep for `action` under the current options, or null.
  // Call before taking the device's lock.
  Context gather(Action action) const;

  // --- under the device allocator's lock ---
  void configure(const HistoryOptions& options);

  void allocated(void* ptr, size_t size, c10::StreamId stream,
                 const Context& context);
  void freeRequested(void* ptr, size_t size, c10::StreamId stream,
                     const Context& context);
  void freeCompleted(void* ptr, size_t size, c10::StreamId stream);
  void segmentAllocated(void* ptr, size_t size, c10::StreamId stream,
                        const Context& context);
  void segmentFreed(void* ptr, size_t size, c10::StreamId stream);
  void outOfMemory(size_t requested, size_t device_free,
                   c10::StreamId stream, const Context& context);

  // The stack that allocated the live block or segment at `ptr`, or null.
  Context blockContext(void* ptr) const;
  Context segmentContext(void* ptr) const;

  // The trace, oldest first.
  std::vector<c10::CachingDeviceAllocator::TraceEntry> trace() const;

 private:
  // Bits of mode_.
  static constexpr uint32_t kEnabled = 1;
  static constexpr uint32_t kTrace = 2;
  static constexpr uint32_t kCppFrames = 4;
  static constexpr uint32_t kContextShift = 3;  // RecordContext above here

  c10::CachingDeviceAllocator::RecordContext contextLevel() const;
  // The context an entry of `action` keeps.
  Context entryContext(Action action, const Context& context) const;
  void append(Action action, size_t addr, size_t size, c10::StreamId stream,
              Context context);

  const c10::DeviceIndex device_;
  std::atomic<uint32_t> mode_{0};
  size_t max_entries_ = SIZE_MAX;
  uint32_t skip_actions_ = 0;
  std::vector<c10::CachingDeviceAllocator::TraceEntry> ring_;
  size_t next_ = 0;  // where the next entry goes once ring_ is full
  std::unordered_map<void*, Context> block_contexts_;
  std::unordered_map<void*, Context> segment_contexts_;
};

}  // namespace phantom
