// The caching device allocator PyTorch uses for phantom tensors.
//
// Asking the driver for memory (ph_malloc) is slow and returning it
// (ph_free) needs the device to be idle, so, like CUDA's caching allocator,
// this one keeps memory it got from the driver ("segments") and carves
// blocks out of them:
//
//  - Sizes are rounded up to kMinBlockSize. Requests up to kSmallSize come
//    from the small pool, carved out of kSmallBuffer segments; larger ones
//    come from the large pool (segments of kLargeBuffer for requests below
//    kMinLargeAlloc, else the size rounded up to kRoundLarge). On a device
//    smaller than 160 MiB a segment takes at most 1/8 of the capacity (or
//    just the request), so a 1 MiB device works too.
//  - A block belongs to the stream that was current when it was allocated.
//    A freed block goes back to its pool and is handed out again only to
//    allocations on the same stream, whose later work is ordered after the
//    work that used it. Best fit within (stream, size); blocks are split
//    when the rest is big enough, and free neighbours merge on free. Free
//    small-pool blocks sit in exact-size bins with a bitmap (best fit in a
//    few word operations); the large pool is an ordered set.
//  - The steady state (a cache hit) takes one uncontended lock and makes
//    no driver call and no heap allocation: Block records are recycled.
//  - Tensor.record_stream(s) marks a block as used on another stream; its
//    free then records an event on each such stream and the block returns
//    to the pool only once those events have completed.
//  - Memory goes back to the driver only after waiting for the device's
//    streams: on empty_cache(), when an allocation fails (free every cached
//    segment, retry once), and past the garbage-collection threshold.
//  - Out of memory after that raises c10::OutOfMemoryError with the full
//    accounting: requested, the segment that found no room when it is
//    bigger, capacity, allocated, reserved and free bytes, and the driver's
//    own message.
//  - A per-process memory fraction (set_per_process_memory_fraction, as on
//    CUDA) caps what the allocator takes from the driver: a new segment
//    that would bring the reserved bytes past fraction x capacity is
//    refused as if the driver were full (cached segments go back and the
//    request is tried once more), and the OutOfMemoryError then names the
//    fraction and how to raise it.
//  - The cache can be turned off (caching_allocator_enable(False)): each
//    allocation then comes straight from the driver and goes back to it
//    when freed, after the device's streams are waited for, as CUDA's
//    uncached allocations do (not in the statistics; within the
//    fraction). Freed cached memory stays cached until empty_cache().
//  - rawAlloc/rawDelete hand out bare device pointers to other libraries
//    (caching_allocator_alloc/delete), from the same cache.
//
// Settings: PHANTOM_ALLOC_CONF="max_split_size_mb:N,garbage_collection_threshold:F,
// record_memory_history:N"
// (see docs/allocator.md), parsed by the settings parser
// (phantom/common/settings.h). A malformed value is an error at start-up.
//
// Locking: one mutex per device guards that device's pools, blocks and
// statistics. It is never held while waiting for a stream, and the GIL is
// never taken. Frees may come from any thread, including stream workers.
#pragma once

#include <phantom/AllocatorHistory.h>

#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace phantom {

constexpr size_t kMinBlockSize = 512;          // every size is a multiple of this
constexpr size_t kSmallSize = 1 << 20;         // 1 MiB: largest "small" request
constexpr size_t kSmallBuffer = 2 << 20;       // 2 MiB: segment size for small requests
constexpr size_t kMinLargeAlloc = 10 << 20;    // 10 MiB: below this, large requests share
constexpr size_t kLargeBuffer = 20 << 20;      // 20 MiB: ... a segment of this size
constexpr size_t kRoundLarge = 2 << 20;        // 2 MiB: rounding of big segments

struct AllocatorSettings {
  size_t max_split_size = SIZE_MAX;       // blocks at least this big are never split
  double garbage_collection_threshold = 0;  // 0: off; else fraction of capacity
  size_t record_memory_history = 0;  // 0: off; else history entries kept
};

// Parses a PHANTOM_ALLOC_CONF value; throws c10::ValueError saying what is
// wrong and what is accepted.
AllocatorSettings parseAllocatorSettings(const std::string& text);

class DeviceCachingAllocator;

// What happened to private-pool memory (phantom/PrivatePool.h), for the
// statistics: the driver gave or took back a piece (a segment), or a
// tensor took or gave back a block.
enum class PrivatePoolChange {
  kSegmentAllocated,
  kSegmentFreed,
  kBlockAllocated,
  kBlockFreed,
};

class PhantomDeviceAllocator final : public c10::DeviceAllocator {
 public:
  PhantomDeviceAllocator();
  ~PhantomDeviceAllocator() override;

  c10::DataPtr allocate(size_t nbytes) override;
  // An allocation on `device` for work on `stream` (allocate() takes the
  // current device and its current stream).
  c10::DataPtr allocateOn(size_t nbytes, c10::DeviceIndex device,
                          c10::StreamId stream);
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Every segment of every device with its blocks (torch.phantom.memory_snapshot),
  // with the stacks that allocated them while memory history records them.
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> snapshot();

  // torch.phantom.memory._record_memory_history, on every device
  // (phantom/AllocatorHistory.h).
  void recordHistory(const HistoryOptions& options);
  // Each device's recorded trace, oldest first; index = device.
  std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>> traces();

  // The settings in force (from PHANTOM_ALLOC_CONF); throws if malformed.
  const AllocatorSettings& settings();

  // Private pools keep their own driver memory; memory_stats counts it as
  // CUDA's allocator counts its private pools' segments and blocks.
  void accountPrivatePool(c10::DeviceIndex device, PrivatePoolChange change,
                          size_t size, size_t requested);

  // Frees the memory behind a DataPtr's context (its deleter). Any thread.
  void releaseContext(void* context) noexcept;
  // Frees an allocation made with the cache off (its deleter).
  void releaseUncached(c10::DeviceIndex device, void* ptr,
                       size_t size) noexcept;

  // torch.phantom.caching_allocator_enable: off, allocations bypass the
  // cache (see the top of this file). Process-wide, as on CUDA.
  void setCachingEnabled(bool enabled);
  bool cachingEnabled() const;

  // torch.phantom.set_per_process_memory_fraction; throws c10::ValueError
  // unless 0 <= fraction <= 1.
  void setMemoryFraction(double fraction, c10::DeviceIndex device);
  double memoryFraction(c10::DeviceIndex device);

  // torch.phantom.caching_allocator_alloc / _delete (RawAllocations.cpp):
  // `nbytes` of device memory for work on `stream`, kept alive until
  // rawDelete(ptr). rawDelete throws for a pointer rawAlloc did not give.
  void* rawAlloc(size_t nbytes, c10::DeviceIndex device, c10::StreamId stream);
  void rawDelete(void* ptr);

 private:
  DeviceCachingAllocator& forDevice(c10::DeviceIndex device);

  std::once_flag init_;
  std::atomic<bool> ready_{false};  // init_ has run
  std::atomic<bool> caching_enabled_{true};
  AllocatorSettings settings_;
  std::vector<std::unique_ptr<DeviceCachingAllocator>> devices_;
  std::mutex raw_mutex_;  // guards raw_allocations_
  std::unordered_map<void*, c10::DataPtr> raw_allocations_;
};

PhantomDeviceAllocator& deviceAllocator();

}  // namespace phantom
