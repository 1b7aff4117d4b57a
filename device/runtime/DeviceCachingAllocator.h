// One device's caching allocator: the free-block pools, segments from the
// driver, splitting and merging, record_stream's deferred frees, the
// per-process memory fraction, statistics, snapshots and memory history.
// PhantomDeviceAllocator (phantom/DeviceAllocator.h) holds one per device
// and is what torch calls; this class is private to the runtime. Its public
// methods take the allocator's mutex; the private ones expect it held
// unless they say otherwise. docs/allocator.md gives the design.
#pragma once

#include "AllocatorBlocks.h"

#include <phantom/AllocatorHistory.h>
#include <phantom/DeviceAllocator.h>
#include <phantom/PrivatePool.h>
#include <phantom/hal.h>

#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace phantom {

using c10::CachingAllocator::StatArray;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::TraceEntry;
using allocator_detail::Block;
using allocator_detail::BlockPool;

// The size a request is served at: a multiple of kMinBlockSize.
inline size_t roundSize(size_t size) {
  return size < kMinBlockSize
             ? kMinBlockSize
             : kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

class DeviceCachingAllocator {
 public:
  DeviceCachingAllocator(c10::DeviceIndex device,
                         const AllocatorSettings& settings);

  Block* malloc(size_t requested, c10::StreamId stream);

  void free(Block* block);

  void accountPrivatePool(PrivatePoolChange change, size_t size,
                          size_t requested);

  void recordStream(Block* block, c10::StreamId stream);

  void emptyCache();

  void setMemoryFraction(double fraction);

  double memoryFraction();

  void* mallocUncached(size_t requested, size_t size);

  void freeUncached(void* ptr, size_t size);

  DeviceStats stats();

  void resetAccumulated();

  void resetPeak();

  void snapshot(std::vector<SegmentInfo>& out);

  void configureHistory(const HistoryOptions& options);

  std::vector<TraceEntry> trace();

 private:
  template <typename Fn>
  void forEachStatArray(Fn&& fn) {
    for (StatArray* array :
         {&stats_.allocation, &stats_.segment, &stats_.active,
          &stats_.inactive_split, &stats_.allocated_bytes,
          &stats_.reserved_bytes, &stats_.active_bytes,
          &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      fn(*array);
    }
  }

  void reportToProfiler(void* ptr, int64_t size);

  static void update(StatArray& array, size_t pool_type, int64_t amount);

  Block* makeBlock(c10::StreamId stream, size_t size, BlockPool* pool,
                   void* ptr);

  void recycle(Block* block) { spare_.push_back(block); }

  void insertFree(Block* block);

  void eraseFree(Block* block);

  Block* takeFreeBlock(BlockPool& pool, c10::StreamId stream, size_t size);

  Block* newSegment(BlockPool& pool, c10::StreamId stream, size_t size,
                    std::unique_lock<std::mutex>& lock, bool* over_fraction,
                    const AllocatorHistory::Context& context);

  Block* splitForRequest(Block* block, size_t size);

  static bool isFree(const Block* block);

  void absorbNext(Block* block);

  void returnToPool(Block* block);

  void recordUseEvents(Block* block);

  void processEvents();

  void waitForPendingEvents();

  void releaseAfterSync(std::unique_lock<std::mutex>& lock);

  void releaseCachedSegments(bool only_idle_streams = false);

  bool streamIsIdle(c10::StreamId stream_id) const;

  void releaseSegment(Block* block);

  void maybeCollectGarbage(size_t segment_size,
                           std::unique_lock<std::mutex>& lock);

  [[noreturn]] void throwOutOfMemory(size_t requested, size_t segment_size,
                                     std::unique_lock<std::mutex>& lock,
                                     bool over_fraction,
                                     c10::StreamId stream = 0,
                                     const AllocatorHistory::Context& context = nullptr);

  void releaseUncached(void* ptr, size_t size);

  void releaseDeferredUncached();

  size_t allowedBytes() const;

  bool exceedsFraction(size_t more_bytes) const;

  ph_status_t mallocWithinFraction(size_t bytes, void** ptr);

  const c10::DeviceIndex device_;
  const AllocatorSettings& settings_;
  size_t capacity_ = 0;
  size_t segment_cap_ = 0;  // largest segment bigger than its request

  std::mutex mutex_;  // guards everything below
  double fraction_ = 1.0;      // set_per_process_memory_fraction
  size_t uncached_bytes_ = 0;  // live allocations made with caching off
  std::vector<std::pair<void*, size_t>> deferred_uncached_;
  BlockPool small_{true};
  BlockPool large_{false};
  std::set<Block*> segments_;  // the head block of each segment
  std::deque<std::pair<ph_event_t, Block*>> pending_;
  std::vector<Block*> spare_;  // recycled Block records (never shrinks: few)
  DeviceStats stats_;
  AllocatorHistory history_;
};

}  // namespace phantom
