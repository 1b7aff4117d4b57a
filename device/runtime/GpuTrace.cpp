// The switch that ends PyTorch's GPU trace hooks at exit, the hook shield
// and the query, record-stream, work-stream and device-sync observers
// (GpuTrace.h).
#include <phantom/GpuTrace.h>

#include <atomic>

namespace phantom::gpu_trace {
namespace {
std::atomic<bool> stopped{false};
std::atomic<HookShield> shield{nullptr};
std::atomic<QueryObserver> query_observer{nullptr};
std::atomic<RecordStreamObserver> record_stream_observer{nullptr};
std::atomic<DeviceSyncObserver> device_sync_observer{nullptr};
std::atomic<WorkStreamObserver> work_stream_observer{nullptr};
}  // namespace

void setDeviceSyncObserver(DeviceSyncObserver observer) noexcept {
  device_sync_observer.store(observer, std::memory_order_release);
}

DeviceSyncObserver deviceSyncObserver() noexcept {
  return device_sync_observer.load(std::memory_order_acquire);
}

void setWorkStreamObserver(WorkStreamObserver observer) noexcept {
  work_stream_observer.store(observer, std::memory_order_release);
}

WorkStreamObserver workStreamObserver() noexcept {
  return work_stream_observer.load(std::memory_order_relaxed);
}

void setRecordStreamObserver(RecordStreamObserver observer) noexcept {
  record_stream_observer.store(observer, std::memory_order_release);
}

RecordStreamObserver recordStreamObserver() noexcept {
  return record_stream_observer.load(std::memory_order_relaxed);
}

void setQueryObserver(QueryObserver observer) noexcept {
  query_observer.store(observer, std::memory_order_release);
}

QueryObserver queryObserver() noexcept {
  return query_observer.load(std::memory_order_relaxed);
}

void setHookShield(HookShield hook_shield) noexcept {
  shield.store(hook_shield, std::memory_order_release);
}

HookShield hookShield() noexcept { return shield.load(std::memory_order_acquire); }

void stopTracing() noexcept { stopped.store(true, std::memory_order_release); }

bool tracingStopped() noexcept { return stopped.load(std::memory_order_acquire); }

}  // namespace phantom::gpu_trace
