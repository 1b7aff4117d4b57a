// The device memory allocator PyTorch uses for phantom tensors.
//
// This is the foundation's allocator: every allocation is a driver
// allocation and every free returns memory to the driver, so its accounting
// is exact and it never hides a leak. It is correct under asynchronous
// streams without tracking them: a free first synchronizes the device (as
// cudaFree does), so no queued work can still be using the memory. A free
// that happens inside device work (a kernel's captured tensor released on
// a stream worker) cannot wait for the device it runs on; it is deferred and
// done by the next allocation or free on a host thread.
//
// Out of memory raises c10::OutOfMemoryError (torch.OutOfMemoryError) whose
// message gives requested, capacity, allocated, reserved and free bytes;
// nothing is left allocated and the next, smaller request can succeed.
//
// Locking: `mutex_` guards the block table, the statistics and the deferred
// list. It is never held across a driver call that waits for the device.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <mutex>
#include <unordered_map>
#include <vector>

namespace phantom {

class PhantomDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
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

  // Frees `ptr` (from allocate) as described above. Never throws.
  void free(void* ptr) noexcept;

 private:
  struct Block {
    c10::DeviceIndex device;
    size_t size;
  };

  void freeDeferred() noexcept;
  void freeNow(void* ptr) noexcept;
  c10::CachingDeviceAllocator::DeviceStats& statsOf(c10::DeviceIndex device);

  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  std::vector<void*> deferred_;
  std::unordered_map<c10::DeviceIndex, c10::CachingDeviceAllocator::DeviceStats>
      stats_;
};

PhantomDeviceAllocator& deviceAllocator();

}  // namespace phantom
