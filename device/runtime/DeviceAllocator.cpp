// See phantom/DeviceAllocator.h.
#include <phantom/DeviceAllocator.h>
#include <phantom/Device.h>
#include <phantom/Exception.h>
#include <phantom/Launch.h>

#include <c10/util/Exception.h>

#include <cstdio>

namespace phantom {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
constexpr size_t kSmallPool = static_cast<size_t>(c10::CachingAllocator::StatType::SMALL_POOL);
constexpr size_t kLargePool = static_cast<size_t>(c10::CachingAllocator::StatType::LARGE_POOL);
constexpr size_t kSmallSize = 1 << 20;  // 1 MiB: largest "small" allocation

void deleteDeviceMemory(void* ptr) {
  deviceAllocator().free(ptr);
}

template <typename Fn>
void forPools(size_t size, Fn&& fn) {
  fn(kAggregate);
  fn(size <= kSmallSize ? kSmallPool : kLargePool);
}

std::string formatBytes(size_t bytes) {
  char buffer[64];
  if (bytes >= (size_t{1} << 30)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f GiB", bytes / double(1 << 30));
  } else if (bytes >= (size_t{1} << 20)) {
    std::snprintf(buffer, sizeof(buffer), "%.2f MiB", bytes / double(1 << 20));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%zu bytes", bytes);
  }
  return buffer;
}

}  // namespace

DeviceStats& PhantomDeviceAllocator::statsOf(c10::DeviceIndex device) {
  return stats_[device];
}

c10::DataPtr PhantomDeviceAllocator::allocate(size_t nbytes) {
  const c10::DeviceIndex device = currentDevice();
  const c10::Device where(c10::DeviceType::PrivateUse1, device);
  freeDeferred();
  if (nbytes == 0) {
    return {nullptr, nullptr, &deleteDeviceMemory, where};
  }
  void* ptr = nullptr;
  ph_status_t status = ph_malloc(device, nbytes, &ptr);
  if (status == PH_ERROR_OUT_OF_MEMORY) {
    // Memory freed inside device work may still be waiting for us.
    freeDeferred();
    status = ph_malloc(device, nbytes, &ptr);
  }
  if (status == PH_ERROR_OUT_OF_MEMORY) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    ph_mem_get_info(device, &free_bytes, &total_bytes);
    int64_t allocated = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      DeviceStats& stats = statsOf(device);
      stats.num_ooms += 1;
      allocated = stats.allocated_bytes[kAggregate].current;
    }
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "phantom out of memory: tried to allocate ",
        formatBytes(nbytes), " (", nbytes, " bytes) on phantom:",
        static_cast<int>(device), ". Device capacity ",
        formatBytes(total_bytes), "; allocated by PyTorch ",
        formatBytes(allocated), "; reserved by PyTorch ",
        formatBytes(allocated), "; free ", formatBytes(free_bytes),
        ". Free tensors you no longer need, use smaller batches, or raise "
        "the capacity with PHANTOM_DEVICE_MEMORY.");
  }
  PHANTOM_CHECK(status);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.emplace(ptr, Block{device, nbytes});
    DeviceStats& stats = statsOf(device);
    stats.num_device_alloc += 1;
    forPools(nbytes, [&](size_t pool) {
      stats.allocation[pool].increase(1);
      stats.segment[pool].increase(1);
      stats.active[pool].increase(1);
      stats.allocated_bytes[pool].increase(nbytes);
      stats.reserved_bytes[pool].increase(nbytes);
      stats.active_bytes[pool].increase(nbytes);
      stats.requested_bytes[pool].increase(nbytes);
    });
  }
  return {ptr, ptr, &deleteDeviceMemory, where};
}

c10::DeleterFnPtr PhantomDeviceAllocator::raw_deleter() const {
  return &deleteDeviceMemory;
}

void PhantomDeviceAllocator::copy_data(void* dest, const void* src,
                                       std::size_t count) const {
  // Used when a storage is cloned: the source may still be written by
  // queued work, so wait for its device first.
  ph_pointer_attributes_t attributes{};
  PHANTOM_CHECK(ph_pointer_get_attributes(src, &attributes));
  if (attributes.type == PH_MEMORY_DEVICE) {
    synchronizeDevice(static_cast<c10::DeviceIndex>(attributes.device));
  }
  PHANTOM_CHECK(ph_memcpy(dest, src, count, PH_MEMCPY_DEVICE_TO_DEVICE));
}

void PhantomDeviceAllocator::free(void* ptr) noexcept {
  if (ptr == nullptr) {
    return;
  }
  if (inDeviceWork()) {
    std::lock_guard<std::mutex> lock(mutex_);
    deferred_.push_back(ptr);
    return;
  }
  freeDeferred();
  freeNow(ptr);
}

void PhantomDeviceAllocator::freeDeferred() noexcept {
  if (inDeviceWork()) {
    return;
  }
  std::vector<void*> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (deferred_.empty()) {
      return;
    }
    pending.swap(deferred_);
  }
  for (void* ptr : pending) {
    freeNow(ptr);
  }
}

void PhantomDeviceAllocator::freeNow(void* ptr) noexcept {
  Block block{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      std::fprintf(stderr, "phantom: freeing unknown device pointer %p\n", ptr);
      return;
    }
    block = it->second;
    blocks_.erase(it);
  }
  // Queued work may still read or write the block. A sticky stream error is
  // reported by the stream's next sync; the memory is freed either way.
  ph_device_synchronize(block.device);
  if (ph_free(ptr) != PH_SUCCESS) {
    std::fprintf(stderr, "phantom: ph_free(%p) failed: %s\n", ptr,
                 ph_last_error_message());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceStats& stats = statsOf(block.device);
  stats.num_device_free += 1;
  forPools(block.size, [&](size_t pool) {
    stats.allocation[pool].decrease(1);
    stats.segment[pool].decrease(1);
    stats.active[pool].decrease(1);
    stats.allocated_bytes[pool].decrease(block.size);
    stats.reserved_bytes[pool].decrease(block.size);
    stats.active_bytes[pool].decrease(block.size);
    stats.requested_bytes[pool].decrease(block.size);
  });
}

void PhantomDeviceAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  // Nothing is cached; finish frees that device work handed back to us.
  freeDeferred();
}

void PhantomDeviceAllocator::recordStream(const c10::DataPtr& /*ptr*/,
                                          c10::Stream /*stream*/) {
  // Frees synchronize the whole device, which covers every stream.
}

DeviceStats PhantomDeviceAllocator::getDeviceStats(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  std::lock_guard<std::mutex> lock(mutex_);
  return statsOf(device);
}

void PhantomDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceStats& stats = statsOf(device);
  for (auto* array : {&stats.allocation, &stats.segment, &stats.active,
                      &stats.inactive_split, &stats.allocated_bytes,
                      &stats.reserved_bytes, &stats.active_bytes,
                      &stats.inactive_split_bytes, &stats.requested_bytes}) {
    for (auto& stat : *array) {
      stat.reset_accumulated();
    }
  }
  stats.num_alloc_retries = 0;
  stats.num_ooms = 0;
  stats.num_device_alloc = 0;
  stats.num_device_free = 0;
}

void PhantomDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceStats& stats = statsOf(device);
  for (auto* array : {&stats.allocation, &stats.segment, &stats.active,
                      &stats.inactive_split, &stats.allocated_bytes,
                      &stats.reserved_bytes, &stats.active_bytes,
                      &stats.inactive_split_bytes, &stats.requested_bytes}) {
    for (auto& stat : *array) {
      stat.reset_peak();
    }
  }
}

std::pair<size_t, size_t> PhantomDeviceAllocator::getMemoryInfo(
    c10::DeviceIndex device) {
  checkDeviceIndex(device);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  PHANTOM_CHECK(ph_mem_get_info(device, &free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

PhantomDeviceAllocator& deviceAllocator() {
  // Leaked on purpose: tensors may be freed by static destructors at exit.
  static auto* allocator = new PhantomDeviceAllocator();
  return *allocator;
}

// Registered with priority so that c10::GetAllocator(PrivateUse1) and
// c10::getDeviceAllocator(PrivateUse1) find it as soon as the library loads.
static struct RegisterDeviceAllocator {
  RegisterDeviceAllocator() {
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &deviceAllocator());
  }
} register_device_allocator;

}  // namespace phantom
