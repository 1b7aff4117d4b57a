// PhantomDeviceAllocator: torch's c10::DeviceAllocator for phantom, over
// one DeviceCachingAllocator per device (DeviceCachingAllocator.h), plus the
// allocator settings (PHANTOM_ALLOC_CONF). phantom/DeviceAllocator.h gives
// the design.
#include "DeviceCachingAllocator.h"

#include <phantom/DeviceAllocator.h>
#include <phantom/Device.h>
#include <phantom/Exception.h>
#include <phantom/GpuTrace.h>
#include <phantom/FaultInjection.h>
#include <phantom/PrivatePool.h>
#include <phantom/Ipc.h>
#include <phantom/DeviceWork.h>
#include <phantom/Stream.h>
#include <phantom/common/settings.h>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace phantom {

// ---------------------------------------------------------------------------
// Settings.

// The option list is parsed by the settings parser (device/common), with
// the rules and the sentence every PHANTOM_* value has.
static_assert(settings::kMaxSplitSizeMb.min == (kLargeBuffer >> 20) + 1,
              "max_split_size_mb must be able to exceed a large-pool segment");

AllocatorSettings parseAllocatorSettings(const std::string& text) {
  settings::Value value;
  std::string error;
  TORCH_CHECK_VALUE(settings::Parse(settings::kAllocConf, text.c_str(), &value, &error),
                    error);
  AllocatorSettings result;
  if (const auto* option = value.option(settings::kMaxSplitSizeMb)) {
    result.max_split_size = static_cast<size_t>(option->number) << 20;
  }
  if (const auto* option = value.option(settings::kGarbageCollectionThreshold)) {
    result.garbage_collection_threshold = option->fraction;
  }
  if (const auto* option = value.option(settings::kRecordMemoryHistory)) {
    result.record_memory_history = static_cast<size_t>(option->number);
  }
  return result;
}

// ---------------------------------------------------------------------------
// The c10::DeviceAllocator over all devices.

namespace {

void deleteBlock(void* context) {
  if (context == nullptr) {
    return;
  }
  deviceAllocator().releaseContext(context);
}

// An allocation made with the caching allocator disabled.
struct UncachedAllocation {
  void* ptr;
  size_t size;  // as allocated (rounded)
  c10::DeviceIndex device;
};

void deleteUncached(void* context) {
  auto* allocation = static_cast<UncachedAllocation*>(context);
  deviceAllocator().releaseUncached(allocation->device, allocation->ptr,
                                    allocation->size);
  delete allocation;
}

}  // namespace

PhantomDeviceAllocator::PhantomDeviceAllocator() = default;
PhantomDeviceAllocator::~PhantomDeviceAllocator() = default;

const AllocatorSettings& PhantomDeviceAllocator::settings() {
  // std::call_once costs thread-local set-up on every call; this is on
  // every allocation, so check a flag first.
  if (C10_LIKELY(ready_.load(std::memory_order_acquire))) {
    return settings_;
  }
  std::call_once(init_, [this] {
    const char* text = std::getenv(settings::kAllocConf.name);
    settings_ = parseAllocatorSettings(text == nullptr ? "" : text);
    const c10::DeviceIndex count = deviceCountNoThrow();
    for (c10::DeviceIndex device = 0; device < count; ++device) {
      devices_.push_back(
          std::make_unique<DeviceCachingAllocator>(device, settings_));
      if (settings_.record_memory_history > 0) {
        HistoryOptions history;  // _record_memory_history(stacks="python")
        history.enabled = history.trace = true;
        history.context = c10::CachingDeviceAllocator::RecordContext::ALL;
        history.max_entries = settings_.record_memory_history;
        devices_.back()->configureHistory(history);
      }
    }
    ready_.store(true, std::memory_order_release);
  });
  return settings_;
}

DeviceCachingAllocator& PhantomDeviceAllocator::forDevice(
    c10::DeviceIndex device) {
  settings();
  if (C10_LIKELY(device >= 0 &&
                 static_cast<size_t>(device) < devices_.size())) {
    return *devices_[device];
  }
  checkDeviceIndex(device);  // throws, saying what is valid
  TORCH_INTERNAL_ASSERT(false, "phantom:", static_cast<int>(device),
                        " has no allocator");
}

c10::DataPtr PhantomDeviceAllocator::allocate(size_t nbytes) {
  const c10::DeviceIndex device = currentDevice();
  return allocateOn(nbytes, device, currentPhantomStreamId(device));
}

c10::DataPtr PhantomDeviceAllocator::allocateOn(size_t nbytes,
                                                c10::DeviceIndex device,
                                                c10::StreamId stream) {
  faultHookAllocation(nbytes);  // see phantom/FaultInjection.h
  const c10::Device where(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) {
    return {nullptr, nullptr, &deleteBlock, where};
  }
  // Beyond PTRDIFF_MAX the rounding below would wrap around to a small
  // block; such a size is a negative one converted to unsigned.
  TORCH_CHECK_WITH(OutOfMemoryError,
                   nbytes <= static_cast<size_t>(PTRDIFF_MAX),
                   c10::get_privateuse1_backend(), ": cannot allocate ", nbytes,
                   " bytes: the size is larger than any device can hold (a "
                   "negative size converted to unsigned?); check the sizes "
                   "passed to the tensor or storage");
  if (C10_UNLIKELY(privatePoolRoutingActive())) {  // phantom/PrivatePool.h
    c10::DataPtr pooled = privatePoolAllocate(nbytes, device, stream);
    if (pooled) return pooled;
  }
  DeviceCachingAllocator& allocator = forDevice(device);
  if (C10_UNLIKELY(!caching_enabled_.load(std::memory_order_relaxed))) {
    const size_t size = roundSize(nbytes);
    void* ptr = allocator.mallocUncached(nbytes, size);
    gpu_trace::memoryAllocated(ptr);
    return {ptr, new UncachedAllocation{ptr, size, device}, &deleteUncached,
            where};
  }
  Block* block = allocator.malloc(nbytes, stream);
  gpu_trace::memoryAllocated(block->ptr);
  return {block->ptr, block, &deleteBlock, where};
}

void PhantomDeviceAllocator::releaseUncached(c10::DeviceIndex device,
                                             void* ptr, size_t size) noexcept {
  try {
    gpu_trace::memoryFreed(ptr);
    devices_[device]->freeUncached(ptr, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phantom: freeing device memory failed: %s\n",
                 e.what());
  }
}

void PhantomDeviceAllocator::setCachingEnabled(bool enabled) {
  caching_enabled_.store(enabled, std::memory_order_relaxed);
}

bool PhantomDeviceAllocator::cachingEnabled() const {
  return caching_enabled_.load(std::memory_order_relaxed);
}

void PhantomDeviceAllocator::setMemoryFraction(double fraction,
                                               c10::DeviceIndex device) {
  TORCH_CHECK_VALUE(fraction >= 0.0 && fraction <= 1.0,
                    "set_per_process_memory_fraction: the fraction must be "
                    "between 0 and 1, got ", fraction);
  forDevice(device).setMemoryFraction(fraction);
}

double PhantomDeviceAllocator::memoryFraction(c10::DeviceIndex device) {
  return forDevice(device).memoryFraction();
}

void PhantomDeviceAllocator::releaseContext(void* context) noexcept {
  auto* block = static_cast<Block*>(context);
  try {
    gpu_trace::memoryFreed(block->ptr);
    devices_[block->device]->free(block);
  } catch (const std::exception& e) {
    // A deleter cannot throw; the block stays out of the pool (leaked),
    // which is safe, and the reason is reported.
    std::fprintf(stderr, "phantom: freeing device memory failed: %s\n", e.what());
  }
}

c10::DeleterFnPtr PhantomDeviceAllocator::raw_deleter() const {
  return &deleteBlock;
}

void PhantomDeviceAllocator::copy_data(void* dest, const void* src,
                                       std::size_t count) const {
  // Used when a storage is cloned: the source may still be written by
  // queued work, so wait for its device first. The wait is traced as what
  // it is, a synchronize of that device (phantom/GpuTrace.h; no allocator
  // lock is held here), so the race detector knows that everything queued
  // before it is ordered before what follows. From device work
  // synchronizeAllStreams skips the work's own stream: no device
  // synchronize, not traced.
  ph_pointer_attributes_t attributes{};
  PHANTOM_CHECK(ph_pointer_get_attributes(src, &attributes));
  if (attributes.type == PH_MEMORY_DEVICE) {
    const auto device = static_cast<c10::DeviceIndex>(attributes.device);
    synchronizeAllStreams(device);
    if (!inDeviceWork()) {
      gpu_trace::deviceSynchronized(device);
    }
  }
  PHANTOM_CHECK(ph_memcpy(dest, src, count, PH_MEMCPY_DEVICE_TO_DEVICE));
}

void PhantomDeviceAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  settings();
  for (auto& device : devices_) {
    device->emptyCache();
  }
  // The kernels' cached host workspace (the CPU-kernel execution layer's,
  // reached through phantom/DeviceWork.h) goes too, as the device's cached
  // blocks do.
  hostExecHooks().release_host_memory();
}

void PhantomDeviceAllocator::recordStream(const c10::DataPtr& ptr,
                                          c10::Stream stream) {
  if (const c10::DataPtr* sent = ipcWrappedDataPtr(ptr)) {
    recordStream(*sent, stream);  // a storage sent to another process
    return;
  }
  if (privatePoolRecordStream(ptr)) return;  // never handed out again
  if (ptr.get_deleter() != &deleteBlock || ptr.get_context() == nullptr) {
    return;  // not our memory (or empty): nothing to track
  }
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream needs a ", c10::get_privateuse1_backend(),
              " stream, got a stream of ", stream.device_type());
  auto* block = static_cast<Block*>(ptr.get_context());
  TORCH_CHECK(stream.device_index() == block->device,
              "record_stream: the stream is on ", stream.device(),
              " but the tensor's memory is on ",
              c10::Device(c10::DeviceType::PrivateUse1, block->device));
  forDevice(block->device).recordStream(block, stream.id());
}

void PhantomDeviceAllocator::accountPrivatePool(c10::DeviceIndex device,
                                                PrivatePoolChange change,
                                                size_t size, size_t requested) {
  forDevice(device).accountPrivatePool(change, size, requested);
}

DeviceStats PhantomDeviceAllocator::getDeviceStats(c10::DeviceIndex device) {
  return forDevice(device).stats();
}

void PhantomDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  forDevice(device).resetAccumulated();
}

void PhantomDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  forDevice(device).resetPeak();
}

std::pair<size_t, size_t> PhantomDeviceAllocator::getMemoryInfo(
    c10::DeviceIndex device) {
  checkDeviceIndex(device);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  PHANTOM_CHECK(ph_mem_get_info(device, &free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

std::vector<SegmentInfo> PhantomDeviceAllocator::snapshot() {
  settings();
  std::vector<SegmentInfo> segments;
  for (auto& device : devices_) {
    device->snapshot(segments);
  }
  privatePoolSnapshot(segments);
  return segments;
}

void PhantomDeviceAllocator::recordHistory(const HistoryOptions& options) {
  settings();
  for (auto& device : devices_) {
    device->configureHistory(options);
  }
}

std::vector<std::vector<TraceEntry>> PhantomDeviceAllocator::traces() {
  settings();
  std::vector<std::vector<TraceEntry>> out;
  for (auto& device : devices_) {
    out.push_back(device->trace());
  }
  return out;
}

PhantomDeviceAllocator& deviceAllocator() {
  // Leaked on purpose: tensors may be freed by static destructors at exit.
  static auto* allocator = new PhantomDeviceAllocator();
  return *allocator;
}

// Registered when the library loads so that c10::GetAllocator(PrivateUse1)
// and c10::getDeviceAllocator(PrivateUse1) find it.
static struct RegisterDeviceAllocator {
  RegisterDeviceAllocator() {
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &deviceAllocator());
  }
} register_device_allocator;

}  // namespace phantom
