// See phantom/AllocatorHistory.h for the design.
#include <phantom/AllocatorHistory.h>

#include <phantom/DeviceWork.h>

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <mutex>
#include <utility>

namespace phantom {

using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;

// ---------------------------------------------------------------------------
// Out-of-memory observers.

namespace {

std::mutex& observersMutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

std::vector<OutOfMemoryObserver>& observers() {
  static auto* list = new std::vector<OutOfMemoryObserver>();  // leaked: exit
  return *list;
}

}  // namespace

void attachOutOfMemoryObserver(OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observersMutex());
  observers().push_back(std::move(observer));
}

void notifyOutOfMemory(c10::DeviceIndex device, size_t requested,
                       size_t allowed, size_t free) {
  std::vector<OutOfMemoryObserver> copy;
  {
    std::lock_guard<std::mutex> lock(observersMutex());
    copy = observers();
  }
  for (const auto& observer : copy) {
    observer(device, requested, allowed, free);
  }
}

// ---------------------------------------------------------------------------
// The history of one device.

RecordContext AllocatorHistory::contextLevel() const {
  return static_cast<RecordContext>(mode_.load(std::memory_order_relaxed) >>
                                    kContextShift);
}

AllocatorHistory::Context AllocatorHistory::gather(Action action) const {
  const uint32_t mode = mode_.load(std::memory_order_relaxed);
  const auto level = static_cast<RecordContext>(mode >> kContextShift);
  if ((mode & kEnabled) == 0 || level == RecordContext::NEVER) {
    return nullptr;
  }
  // Allocations keep their stack for the state from "state" on; frees
  // have one only with context="all".
  const bool wanted = action == Action::FREE_REQUESTED
                          ? level == RecordContext::ALL
                          : true;
  if (!wanted) {
    return nullptr;
  }
  const bool python = !inDeviceWork();
  const bool cpp = (mode & kCppFrames) != 0;
  if (!python && !cpp) {
    return nullptr;
  }
  return torch::CapturedTraceback::gather(python, /*script=*/python, cpp);
}

void AllocatorHistory::configure(const HistoryOptions& options) {
  uint32_t mode = 0;
  if (options.enabled) {
    mode = kEnabled | (options.trace ? kTrace : 0) |
           (options.cpp_frames ? kCppFrames : 0) |
           (static_cast<uint32_t>(options.context) << kContextShift);
  }
  mode_.store(mode, std::memory_order_relaxed);
  max_entries_ = options.max_entries == 0 ? 1 : options.max_entries;
  skip_actions_ = options.skip_actions;
  if (!options.enabled || !options.trace || options.clear ||
      ring_.size() > max_entries_) {
    ring_.clear();
    next_ = 0;
  }
  if (!options.enabled ||
      options.context == RecordContext::NEVER) {
    block_contexts_.clear();
    segment_contexts_.clear();
  }
}

AllocatorHistory::Context AllocatorHistory::entryContext(
    Action action, const Context& context) const {
  const RecordContext level = contextLevel();
  switch (action) {
    case Action::FREE_REQUESTED:
    case Action::FREE_COMPLETED:
      return level == RecordContext::ALL ? context : nullptr;
    default:
      return level >= RecordContext::ALLOC ? context : nullptr;
  }
}

void AllocatorHistory::append(Action action, size_t addr, size_t size,
                              c10::StreamId stream, Context context) {
  if ((mode_.load(std::memory_order_relaxed) & kTrace) == 0 ||
      (skip_actions_ & (uint32_t{1} << action)) != 0) {
    return;
  }
  TraceEntry entry(action, device_, addr, size,
                   reinterpret_cast<void*>(static_cast<intptr_t>(stream)),
                   c10::MempoolId_t{0, 0}, c10::getTime(),
                   entryContext(action, context));
  if (ring_.size() < max_entries_) {
    ring_.push_back(std::move(entry));
    return;
  }
  ring_[next_] = std::move(entry);
  next_ = (next_ + 1) % max_entries_;
}

void AllocatorHistory::allocated(void* ptr, size_t size, c10::StreamId stream,
                                 const Context& context) {
  if (context != nullptr) {
    block_contexts_[ptr] = context;
  }
  append(Action::ALLOC, reinterpret_cast<size_t>(ptr), size, stream, context);
}

void AllocatorHistory::freeRequested(void* ptr, size_t size,
                                     c10::StreamId stream,
                                     const Context& context) {
  append(Action::FREE_REQUESTED, reinterpret_cast<size_t>(ptr), size, stream,
         context);
}

void AllocatorHistory::freeCompleted(void* ptr, size_t size,
                                     c10::StreamId stream) {
  Context context;
  auto it = block_contexts_.find(ptr);
  if (it != block_contexts_.end()) {
    context = std::move(it->second);
    block_contexts_.erase(it);
  }
  append(Action::FREE_COMPLETED, reinterpret_cast<size_t>(ptr), size, stream,
         context);
}

void AllocatorHistory::segmentAllocated(void* ptr, size_t size,
                                        c10::StreamId stream,
                                        const Context& context) {
  if (context != nullptr) {
    segment_contexts_[ptr] = context;
  }
  append(Action::SEGMENT_ALLOC, reinterpret_cast<size_t>(ptr), size, stream,
         context);
}

void AllocatorHistory::segmentFreed(void* ptr, size_t size,
                                    c10::StreamId stream) {
  Context context;
  auto it = segment_contexts_.find(ptr);
  if (it != segment_contexts_.end()) {
    context = std::move(it->second);
    segment_contexts_.erase(it);
  }
  append(Action::SEGMENT_FREE, reinterpret_cast<size_t>(ptr), size, stream,
         context);
}

void AllocatorHistory::outOfMemory(size_t requested, size_t device_free,
                                   c10::StreamId stream,
                                   const Context& context) {
  // As on CUDA, an OOM entry's address is the free bytes the device reports.
  append(Action::OOM, device_free, requested, stream, context);
}

AllocatorHistory::Context AllocatorHistory::blockContext(void* ptr) const {
  auto it = block_contexts_.find(ptr);
  return it == block_contexts_.end() ? nullptr : it->second;
}

AllocatorHistory::Context AllocatorHistory::segmentContext(void* ptr) const {
  auto it = segment_contexts_.find(ptr);
  return it == segment_contexts_.end() ? nullptr : it->second;
}

std::vector<TraceEntry> AllocatorHistory::trace() const {
  std::vector<TraceEntry> out;
  out.reserve(ring_.size());
  for (size_t i = 0; i < ring_.size(); ++i) {
    out.push_back(ring_[(next_ + i) % ring_.size()]);
  }
  return out;
}

}  // namespace phantom
