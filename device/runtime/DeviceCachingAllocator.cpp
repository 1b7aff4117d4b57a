// DeviceCachingAllocator's methods (DeviceCachingAllocator.h says what the
// class is; docs/allocator.md gives the design).
#include "DeviceCachingAllocator.h"

#include <phantom/Device.h>
#include <phantom/Exception.h>
#include <phantom/GpuTrace.h>
#include <phantom/FaultInjection.h>
#include <phantom/Ipc.h>
#include <phantom/DeviceWork.h>
#include <phantom/Stream.h>
#include <phantom/common/settings.h>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <set>
#include <vector>

namespace phantom {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::BlockInfo;

namespace {

constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);
constexpr size_t kSmallPool = static_cast<size_t>(StatType::SMALL_POOL);
constexpr size_t kLargePool = static_cast<size_t>(StatType::LARGE_POOL);

std::string formatBytes(size_t bytes) {
  char buffer[64];
  if (bytes >= (size_t{1} << 30)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f GiB", bytes / double(1 << 30));
  } else if (bytes >= (size_t{1} << 20)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f MiB", bytes / double(1 << 20));
  } else if (bytes >= (size_t{1} << 10)) {
    // A small device's segments and capacity are KiB.
    std::snprintf(buffer, sizeof(buffer), "%.2f KiB", bytes / double(1 << 10));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%zu bytes", bytes);
  }
  return buffer;
}

// A segment bigger than the request it is made for keeps the rest for later
// requests. On a small device that rest must not take the device: a segment
// is at most 1/kSegmentShareOfDevice of the capacity, or the request itself
// if that is bigger. Devices of 160 MiB and more keep CUDA's sizes
// (docs/allocator.md, "Small devices").
constexpr size_t kSegmentShareOfDevice = 8;

size_t segmentCapFor(size_t capacity) {
  const size_t share = capacity / kSegmentShareOfDevice;
  return std::max(kMinBlockSize, share - share % kMinBlockSize);
}

// The segment to ask the driver for to serve a request of `rounded` bytes.
size_t segmentSizeFor(size_t rounded, size_t segment_cap) {
  size_t size = kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
  if (rounded <= kSmallSize) {
    size = kSmallBuffer;
  } else if (rounded < kMinLargeAlloc) {
    size = kLargeBuffer;
  }
  return size <= segment_cap ? size : std::max(rounded, segment_cap);
}

// Waits for every stream of `device` before memory goes back to the
// driver, and traces the wait as what it is, a synchronize of that device
// (phantom/GpuTrace.h): the race detector then knows that every use queued
// on those streams is ordered before whatever obtains the memory next.
// Call it with the allocator's mutex released: the trace's callbacks take
// the GIL, and a thread holding the GIL may be waiting for that mutex.
// From device work synchronizeAllStreams skips the work's own stream, so
// the wait is no device synchronize and is not traced.
void synchronizeDeviceForRelease(c10::DeviceIndex device) {
  synchronizeAllStreams(device);
  if (!inDeviceWork()) {
    gpu_trace::deviceSynchronized(device);
  }
}

}  // namespace

DeviceCachingAllocator::DeviceCachingAllocator(c10::DeviceIndex device,
                                               const AllocatorSettings& settings)
    : device_(device), settings_(settings), history_(device) {
  size_t free_bytes = 0;
  PHANTOM_CHECK(ph_mem_get_info(device, &free_bytes, &capacity_));
  segment_cap_ = segmentCapFor(capacity_);
}

Block* DeviceCachingAllocator::malloc(size_t requested, c10::StreamId stream) {
  AllocatorHistory::Context context;  // memory history (AllocatorHistory.h)
  if (C10_UNLIKELY(history_.on())) {
    context = history_.gather(TraceEntry::ALLOC);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  processEvents();
  const size_t size = roundSize(requested);
  BlockPool& pool = size <= kSmallSize ? small_ : large_;
  Block* block = takeFreeBlock(pool, stream, size);
  bool over_fraction = false;
  if (block == nullptr) {
    block = newSegment(pool, stream, size, lock, &over_fraction, context);
  }
  if (block == nullptr) {
    throwOutOfMemory(requested, segmentSizeFor(size, segment_cap_), lock,
                     over_fraction, stream, context);
  }
  block = splitForRequest(block, size);
  block->allocated = true;
  block->requested_size = requested;
  const size_t pool_type = block->pool->is_small ? kSmallPool : kLargePool;
  update(stats_.allocation, pool_type, 1);
  update(stats_.allocated_bytes, pool_type, block->size);
  update(stats_.requested_bytes, pool_type, requested);
  update(stats_.active, pool_type, 1);
  update(stats_.active_bytes, pool_type, block->size);
  if (block->size >= settings_.max_split_size) {
    stats_.oversize_allocations.increase(1);
  }
  if (C10_UNLIKELY(history_.on())) {
    history_.allocated(block->ptr, block->size, stream, context);
  }
  reportToProfiler(block->ptr, static_cast<int64_t>(block->size));
  return block;
}

void DeviceCachingAllocator::free(Block* block) {
  AllocatorHistory::Context context;
  if (C10_UNLIKELY(history_.on())) {
    context = history_.gather(TraceEntry::FREE_REQUESTED);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (C10_UNLIKELY(history_.on())) {
    history_.freeRequested(block->ptr, block->size, block->stream, context);
  }
  block->allocated = false;
  const size_t pool_type = block->pool->is_small ? kSmallPool : kLargePool;
  update(stats_.allocation, pool_type, -1);
  update(stats_.allocated_bytes, pool_type, -int64_t(block->size));
  update(stats_.requested_bytes, pool_type, -int64_t(block->requested_size));
  if (block->size >= settings_.max_split_size) {
    stats_.oversize_allocations.decrease(1);
  }
  reportToProfiler(block->ptr, -static_cast<int64_t>(block->size));
  if (!block->stream_uses.empty()) {
    recordUseEvents(block);  // stays active until the events complete
    return;
  }
  returnToPool(block);
}

void DeviceCachingAllocator::accountPrivatePool(PrivatePoolChange change,
                                                size_t size, size_t requested) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t pool_type = size <= kSmallSize ? kSmallPool : kLargePool;
  const int64_t bytes = static_cast<int64_t>(size);
  const int64_t asked = static_cast<int64_t>(requested);
  switch (change) {
    case PrivatePoolChange::kSegmentAllocated:
      update(stats_.segment, pool_type, 1);
      update(stats_.reserved_bytes, pool_type, bytes);
      stats_.num_device_alloc += 1;
      break;
    case PrivatePoolChange::kSegmentFreed:
      update(stats_.segment, pool_type, -1);
      update(stats_.reserved_bytes, pool_type, -bytes);
      stats_.num_device_free += 1;
      break;
    case PrivatePoolChange::kBlockAllocated:
    case PrivatePoolChange::kBlockFreed: {
      const int64_t sign = change == PrivatePoolChange::kBlockAllocated ? 1 : -1;
      update(stats_.allocation, pool_type, sign);
      update(stats_.allocated_bytes, pool_type, sign * bytes);
      update(stats_.requested_bytes, pool_type, sign * asked);
      update(stats_.active, pool_type, sign);
      update(stats_.active_bytes, pool_type, sign * bytes);
      break;
    }
  }
}

void DeviceCachingAllocator::recordStream(Block* block, c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& uses = block->stream_uses;
  if (stream != block->stream &&
      std::find(uses.begin(), uses.end(), stream) == uses.end()) {
    uses.push_back(stream);
  }
}

void DeviceCachingAllocator::emptyCache() {
  // The waits for the events of blocks held back by record_stream are
  // followed by the wait for every stream of the device, traced as a
  // synchronize of the device: the events' streams are among them, so
  // the trace shows those waits too (each event's stream ordered before
  // what follows), and fires with the mutex released.
  waitForPendingEvents();
  synchronizeDeviceForRelease(device_);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.num_sync_all_streams += 1;
  processEvents();
  releaseCachedSegments();
  releaseDeferredUncached();  // the streams were waited for above
}

void DeviceCachingAllocator::setMemoryFraction(double fraction) {
  std::lock_guard<std::mutex> lock(mutex_);
  fraction_ = fraction;
}

double DeviceCachingAllocator::memoryFraction() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fraction_;
}

// Memory straight from the driver, outside the cache (the caching
// allocator disabled, as CUDA's uncached allocations): not in the
// statistics, but within the per-process fraction. `size` is rounded.
void* DeviceCachingAllocator::mallocUncached(size_t requested, size_t size) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!deferred_uncached_.empty() && !inDeviceWork()) {
    lock.unlock();
    synchronizeDeviceForRelease(device_);
    lock.lock();
    releaseDeferredUncached();
  }
  void* ptr = nullptr;
  ph_status_t status = mallocWithinFraction(size, &ptr);
  if (status == PH_ERROR_OUT_OF_MEMORY) {
    // Cached segments go back to the driver first, as for a new segment.
    stats_.num_alloc_retries += 1;
    releaseAfterSync(lock);
    status = mallocWithinFraction(size, &ptr);
  }
  if (status == PH_ERROR_OUT_OF_MEMORY) {
    throwOutOfMemory(requested, size, lock, exceedsFraction(size));
  }
  PHANTOM_CHECK(status);
  uncached_bytes_ += size;
  return ptr;
}

// Returns uncached memory to the driver once no queued work can use it:
// a host thread waits for the device's streams first, as cudaFree does.
// Device work must not wait for other streams (one may be waiting for
// it), so a free from there is deferred to the next uncached allocation
// or empty_cache() on a host thread.
void DeviceCachingAllocator::freeUncached(void* ptr, size_t size) {
  if (inDeviceWork()) {
    std::lock_guard<std::mutex> lock(mutex_);
    deferred_uncached_.emplace_back(ptr, size);
    return;
  }
  synchronizeDeviceForRelease(device_);
  std::lock_guard<std::mutex> lock(mutex_);
  releaseUncached(ptr, size);
}

DeviceStats DeviceCachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceStats copy = stats_;
  copy.max_split_size = settings_.max_split_size == SIZE_MAX
                            ? 0
                            : static_cast<int64_t>(settings_.max_split_size);
  return copy;
}

void DeviceCachingAllocator::resetAccumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  forEachStatArray([](StatArray& array) {
    for (auto& stat : array) {
      stat.reset_accumulated();
    }
  });
  stats_.num_alloc_retries = 0;
  stats_.num_ooms = 0;
  stats_.num_sync_all_streams = 0;
  stats_.num_device_alloc = 0;
  stats_.num_device_free = 0;
  stats_.oversize_allocations.reset_accumulated();
  stats_.oversize_segments.reset_accumulated();
}

void DeviceCachingAllocator::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  forEachStatArray([](StatArray& array) {
    for (auto& stat : array) {
      stat.reset_peak();
    }
  });
  stats_.oversize_allocations.reset_peak();
  stats_.oversize_segments.reset_peak();
}

void DeviceCachingAllocator::snapshot(std::vector<SegmentInfo>& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Block* head : segments_) {
    SegmentInfo segment;
    segment.device = device_;
    segment.address = reinterpret_cast<size_t>(head->ptr);
    segment.stream = reinterpret_cast<void*>(head->stream);
    segment.is_large = !head->pool->is_small;
    if (C10_UNLIKELY(history_.on())) {
      segment.context_when_allocated = history_.segmentContext(head->ptr);
    }
    for (Block* b = head; b != nullptr; b = b->next) {
      BlockInfo info;
      if ((b->allocated || b->pending_events > 0) &&
          C10_UNLIKELY(history_.on())) {
        info.context_when_allocated = history_.blockContext(b->ptr);
      }
      info.size = b->size;
      info.requested_size = b->requested_size;
      info.allocated = b->allocated;
      info.active = b->allocated || b->pending_events > 0;
      segment.total_size += b->size;
      if (info.allocated) {
        segment.allocated_size += b->size;
        segment.requested_size += b->requested_size;
      }
      if (info.active) {
        segment.active_size += b->size;
      }
      segment.blocks.push_back(std::move(info));
    }
    out.push_back(std::move(segment));
  }
}

void DeviceCachingAllocator::configureHistory(const HistoryOptions& options) {
  std::lock_guard<std::mutex> lock(mutex_);
  history_.configure(options);
}

std::vector<TraceEntry> DeviceCachingAllocator::trace() {
  std::lock_guard<std::mutex> lock(mutex_);
  return history_.trace();
}

// torch.profiler's profile_memory: the allocation or free (negative
// size) with the totals after it, as CUDA's allocator reports them.
// Mutex held.
void DeviceCachingAllocator::reportToProfiler(void* ptr, int64_t size) {
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    c10::reportMemoryUsageToProfiler(
        ptr, size, stats_.allocated_bytes[kAggregate].current,
        stats_.reserved_bytes[kAggregate].current,
        c10::Device(c10::DeviceType::PrivateUse1, device_));
  }
}

void DeviceCachingAllocator::update(StatArray& array, size_t pool_type,
                                    int64_t amount) {
  if (amount >= 0) {
    array[kAggregate].increase(static_cast<size_t>(amount));
    array[pool_type].increase(static_cast<size_t>(amount));
  } else {
    array[kAggregate].decrease(static_cast<size_t>(-amount));
    array[pool_type].decrease(static_cast<size_t>(-amount));
  }
}

// Block records are recycled: splitting and merging happen on most
// allocations and frees, and a heap allocation each would cost more than
// the rest of the bookkeeping.
Block* DeviceCachingAllocator::makeBlock(c10::StreamId stream, size_t size,
                                         BlockPool* pool, void* ptr) {
  if (spare_.empty()) {
    return new Block(device_, stream, size, pool, ptr);
  }
  Block* block = spare_.back();
  spare_.pop_back();
  block->stream = stream;
  block->size = size;
  block->requested_size = 0;
  block->pool = pool;
  block->ptr = ptr;
  block->allocated = false;
  block->prev = block->next = nullptr;
  block->bin_prev = block->bin_next = nullptr;
  block->pending_events = 0;
  block->stream_uses.clear();
  return block;
}

// Pool membership, keeping the inactive-split statistics exact.
void DeviceCachingAllocator::insertFree(Block* block) {
  block->pool->insert(block);
  if (block->isSplit()) {
    const size_t pool_type = block->pool->is_small ? kSmallPool : kLargePool;
    update(stats_.inactive_split, pool_type, 1);
    update(stats_.inactive_split_bytes, pool_type, block->size);
  }
}

void DeviceCachingAllocator::eraseFree(Block* block) {
  block->pool->erase(block);
  if (block->isSplit()) {
    const size_t pool_type = block->pool->is_small ? kSmallPool : kLargePool;
    update(stats_.inactive_split, pool_type, -1);
    update(stats_.inactive_split_bytes, pool_type, -int64_t(block->size));
  }
}

Block* DeviceCachingAllocator::takeFreeBlock(BlockPool& pool,
                                             c10::StreamId stream,
                                             size_t size) {
  Block* block = pool.bestFit(stream, size);
  if (block == nullptr) {
    return nullptr;
  }
  // Big blocks are kept for big requests: never cut a small request out
  // of a block past max_split_size, nor waste most of one.
  if (size < settings_.max_split_size &&
      block->size >= settings_.max_split_size) {
    return nullptr;
  }
  if (size >= settings_.max_split_size &&
      block->size >= size + kLargeBuffer) {
    return nullptr;
  }
  eraseFree(block);
  return block;
}

// A new segment for a request of `size`, or nullptr when neither the
// driver nor the per-process fraction (*over_fraction then) allows it,
// even after every cached segment went back to the driver.
Block* DeviceCachingAllocator::newSegment(BlockPool& pool, c10::StreamId stream,
                                          size_t size,
                                          std::unique_lock<std::mutex>& lock,
                                          bool* over_fraction,
                                          const AllocatorHistory::Context& context) {
  const size_t segment_size = segmentSizeFor(size, segment_cap_);
  maybeCollectGarbage(segment_size, lock);
  void* ptr = nullptr;
  ph_status_t status = mallocWithinFraction(segment_size, &ptr);
  if (status == PH_ERROR_OUT_OF_MEMORY) {
    // Memory kept for other processes that are done with it comes back
    // first (phantom/Ipc.h); its frees take this lock.
    lock.unlock();
    ipcCollect();
    lock.lock();
    // Give every cached segment back and try once more.
    stats_.num_alloc_retries += 1;
    releaseAfterSync(lock);
    status = mallocWithinFraction(segment_size, &ptr);
  }
  if (status == PH_ERROR_OUT_OF_MEMORY) {
    *over_fraction = exceedsFraction(segment_size);
    return nullptr;
  }
  PHANTOM_CHECK(status);
  Block* block = makeBlock(stream, segment_size, &pool, ptr);
  segments_.insert(block);
  const size_t pool_type = pool.is_small ? kSmallPool : kLargePool;
  update(stats_.segment, pool_type, 1);
  update(stats_.reserved_bytes, pool_type, segment_size);
  stats_.num_device_alloc += 1;
  if (segment_size >= settings_.max_split_size) {
    stats_.oversize_segments.increase(1);
  }
  if (C10_UNLIKELY(history_.on())) {
    history_.segmentAllocated(ptr, segment_size, stream, context);
  }
  return block;
}

Block* DeviceCachingAllocator::splitForRequest(Block* block, size_t size) {
  const size_t remaining = block->size - size;
  const bool split = block->pool->is_small
                         ? remaining >= kMinBlockSize
                         : remaining > kSmallSize &&
                               block->size < settings_.max_split_size;
  if (!split) {
    return block;
  }
  Block* rest = makeBlock(block->stream, remaining, block->pool,
                          static_cast<char*>(block->ptr) + size);
  rest->prev = block;
  rest->next = block->next;
  if (rest->next != nullptr) {
    rest->next->prev = rest;
  }
  block->next = rest;
  block->size = size;
  insertFree(rest);
  return block;
}

bool DeviceCachingAllocator::isFree(const Block* block) {
  return block != nullptr && !block->allocated && block->pending_events == 0;
}

// `block` takes over its next neighbour's bytes; the neighbour's record
// is recycled.
void DeviceCachingAllocator::absorbNext(Block* block) {
  Block* next = block->next;
  block->size += next->size;
  block->next = next->next;
  if (block->next != nullptr) {
    block->next->prev = block;
  }
  recycle(next);
}

// The block (no longer allocated, no pending events) rejoins its pool,
// merged with free neighbours.
void DeviceCachingAllocator::returnToPool(Block* block) {
  if (C10_UNLIKELY(history_.on())) {
    history_.freeCompleted(block->ptr, block->size, block->stream);
  }
  const size_t pool_type = block->pool->is_small ? kSmallPool : kLargePool;
  update(stats_.active, pool_type, -1);
  update(stats_.active_bytes, pool_type, -int64_t(block->size));
  block->stream_uses.clear();
  // Merging keeps the lower block, so a segment's head never changes.
  if (isFree(block->prev)) {
    Block* prev = block->prev;
    eraseFree(prev);
    absorbNext(prev);
    block = prev;
  }
  if (isFree(block->next)) {
    eraseFree(block->next);
    absorbNext(block);
  }
  insertFree(block);
}

void DeviceCachingAllocator::recordUseEvents(Block* block) {
  for (c10::StreamId stream_id : block->stream_uses) {
    const PhantomStream stream(c10::Stream(
        c10::Stream::UNSAFE,
        c10::Device(c10::DeviceType::PrivateUse1, device_), stream_id));
    ph_event_t event = nullptr;
    PHANTOM_CHECK(ph_event_create(PH_EVENT_DISABLE_TIMING, &event));
    PHANTOM_CHECK(ph_event_record(event, stream.handle()));
    block->pending_events += 1;
    pending_.emplace_back(event, block);
  }
  block->stream_uses.clear();
}

// Blocks whose record_stream events have completed rejoin their pools.
void DeviceCachingAllocator::processEvents() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    const ph_status_t status = ph_event_query(it->first);
    if (status == PH_NOT_READY) {
      ++it;
      continue;
    }
    // Reached, or the stream failed: either way the use is over.
    (void)ph_event_destroy(it->first);
    Block* block = it->second;
    it = pending_.erase(it);
    if (--block->pending_events == 0) {
      returnToPool(block);
    }
  }
}

void DeviceCachingAllocator::waitForPendingEvents() {
  std::vector<ph_event_t> events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : pending_) {
      events.push_back(entry.first);
    }
  }
  // Events are destroyed only under the lock by processEvents, which
  // cannot run for them before this wait returns... unless another thread
  // processes them first; ph_event_synchronize on a destroyed event is a
  // harmless PH_ERROR_INVALID_HANDLE.
  for (ph_event_t event : events) {
    (void)ph_event_synchronize(event);
  }
}

// Frees every cached whole segment, after making sure no queued work can
// still use it. A host thread waits for all the device's streams (without
// the lock). Device work must not wait for other streams (one of them
// may be waiting for it), so there only segments of idle streams, or of
// the stream the work runs on, are freed.
void DeviceCachingAllocator::releaseAfterSync(std::unique_lock<std::mutex>& lock) {
  const bool from_device_work = inDeviceWork();
  if (!from_device_work) {
    lock.unlock();
    synchronizeDeviceForRelease(device_);
    lock.lock();
    stats_.num_sync_all_streams += 1;
  }
  processEvents();
  releaseCachedSegments(from_device_work);
}

void DeviceCachingAllocator::releaseCachedSegments(bool only_idle_streams) {
  for (BlockPool* pool : {&small_, &large_}) {
    for (Block* block : pool->all()) {
      if (block->isSplit() ||
          (only_idle_streams && !streamIsIdle(block->stream))) {
        continue;
      }
      pool->erase(block);
      releaseSegment(block);
    }
  }
}

bool DeviceCachingAllocator::streamIsIdle(c10::StreamId stream_id) const {
  const PhantomStream stream(c10::Stream(
      c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device_),
      stream_id));
  const ph_stream_t handle = stream.handle();
  return handle == currentWorkStream() ||
         ph_stream_query(handle) == PH_SUCCESS;
}

void DeviceCachingAllocator::releaseSegment(Block* block) {
  if (C10_UNLIKELY(history_.on())) {
    history_.segmentFreed(block->ptr, block->size, block->stream);
  }
  if (ph_free(block->ptr) != PH_SUCCESS) {
    std::fprintf(stderr, "phantom: ph_free(%p) failed: %s\n", block->ptr,
                 ph_last_error_message());
  }
  const size_t pool_type = block->pool->is_small ? kSmallPool : kLargePool;
  update(stats_.segment, pool_type, -1);
  update(stats_.reserved_bytes, pool_type, -int64_t(block->size));
  stats_.num_device_free += 1;
  if (block->size >= settings_.max_split_size) {
    stats_.oversize_segments.decrease(1);
  }
  segments_.erase(block);
  recycle(block);
}

void DeviceCachingAllocator::maybeCollectGarbage(size_t segment_size,
                                                 std::unique_lock<std::mutex>& lock) {
  const double threshold = settings_.garbage_collection_threshold;
  if (threshold <= 0) {
    return;
  }
  const auto reserved = static_cast<double>(
      stats_.reserved_bytes[kAggregate].current + segment_size);
  if (reserved <= threshold * static_cast<double>(allowedBytes())) {
    return;
  }
  releaseAfterSync(lock);
}

// Called right after the driver, or the per-process memory fraction,
// refused `segment_size` bytes. For the driver, its ph_last_error_message()
// (this thread's) still says why, in the driver's words (for the fake:
// the largest free range, and the setting that sets the capacity).
void DeviceCachingAllocator::throwOutOfMemory(size_t requested,
                                              size_t segment_size,
                                              std::unique_lock<std::mutex>& lock,
                                              bool over_fraction,
                                              c10::StreamId stream,
                                              const AllocatorHistory::Context& context) {
  const std::string driver_says =
      over_fraction ? std::string() : std::string(ph_last_error_message());
  stats_.num_ooms += 1;
  const int64_t allocated = stats_.allocated_bytes[kAggregate].current;
  const int64_t reserved = stats_.reserved_bytes[kAggregate].current;
  const size_t uncached = uncached_bytes_;
  const double fraction = fraction_;
  const size_t allowed = allowedBytes();
  size_t free_bytes = 0;
  size_t total = 0;
  (void)ph_mem_get_info(device_, &free_bytes, &total);
  if (C10_UNLIKELY(history_.on())) {
    history_.outOfMemory(requested, free_bytes, stream, context);
  }
  lock.unlock();
  notifyOutOfMemory(device_, requested, allowed, free_bytes);
  // When the segment is bigger than the request, the segment is what
  // found no room: say so, or "free on the device" below would seem to
  // contradict the failure.
  const std::string segment =
      segment_size > requested
          ? ", which needs a new " + formatBytes(segment_size) +
                " segment of device memory (the caching allocator serves "
                "requests of this size from segments of that size)" +
                (over_fraction ? std::string()
                               : std::string(", and the device has no free "
                                             "range that large"))
          : std::string();
  const std::string where =
      c10::get_privateuse1_backend() + " out of memory: tried to allocate " +
      formatBytes(requested) + " (" + std::to_string(requested) +
      " bytes) on " +
      c10::Device(c10::DeviceType::PrivateUse1, device_).str() + segment +
      ". ";
  const std::string accounting =
      "allocated by PyTorch " + formatBytes(allocated) +
      "; reserved by PyTorch " + formatBytes(reserved) + " (" +
      formatBytes(reserved - allocated) + " of it cached, not in use)" +
      (uncached > 0 ? "; outside the cache (caching allocator disabled) " +
                          formatBytes(uncached)
                    : std::string());
  if (over_fraction) {
    char fraction_text[32];
    std::snprintf(fraction_text, sizeof fraction_text, "%g", fraction);
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, where,
        "The per-process memory fraction ", fraction_text, " lets this "
        "process use ", formatBytes(allowed), " of the device's ",
        formatBytes(total), "; ", accounting, ". Raise it with torch.",
        c10::get_privateuse1_backend(),
        ".set_per_process_memory_fraction(f, device=",
        static_cast<int>(device_), ") (f up to 1.0), or free tensors you no "
        "longer need.");
  }
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, where, "Device capacity ", formatBytes(total),
      "; ", accounting, "; free on the device ", formatBytes(free_bytes),
      ". Free tensors you no longer need, or use smaller batches.",
      driver_says.empty() ? "" : " The driver says: ", driver_says);
}

void DeviceCachingAllocator::releaseUncached(void* ptr, size_t size) {
  if (ph_free(ptr) != PH_SUCCESS) {
    std::fprintf(stderr, "phantom: ph_free(%p) failed: %s\n", ptr,
                 ph_last_error_message());
  }
  uncached_bytes_ -= size;
}

// Frees deferred uncached memory (freeUncached) from a host thread,
// after waiting for the device's streams. mutex_ held.
void DeviceCachingAllocator::releaseDeferredUncached() {
  if (deferred_uncached_.empty() || inDeviceWork()) {
    return;
  }
  std::vector<std::pair<void*, size_t>> pending;
  pending.swap(deferred_uncached_);
  for (const auto& [ptr, size] : pending) {
    releaseUncached(ptr, size);
  }
}

// The per-process memory fraction (set_per_process_memory_fraction):
// reserved segments plus uncached allocations stay within `fraction_` of
// the capacity. At 1.0 only the driver limits them.
size_t DeviceCachingAllocator::allowedBytes() const {
  return fraction_ >= 1.0 ? capacity_
                          : static_cast<size_t>(fraction_ *
                                                static_cast<double>(capacity_));
}

bool DeviceCachingAllocator::exceedsFraction(size_t more_bytes) const {
  if (fraction_ >= 1.0) {
    return false;
  }
  const size_t in_use =
      static_cast<size_t>(stats_.reserved_bytes[kAggregate].current) +
      uncached_bytes_;
  return in_use + more_bytes > allowedBytes();
}

// ph_malloc, or PH_ERROR_OUT_OF_MEMORY without asking the driver when
// the bytes would pass the fraction. mutex_ held.
ph_status_t DeviceCachingAllocator::mallocWithinFraction(size_t bytes,
                                                         void** ptr) {
  if (exceedsFraction(bytes)) {
    return PH_ERROR_OUT_OF_MEMORY;
  }
  return ph_malloc(device_, bytes, ptr);
}

}  // namespace phantom
