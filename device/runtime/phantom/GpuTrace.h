// PyTorch's GPU trace hooks (c10::impl::GPUTrace), emitted for phantom.
//
// Once `torch._C._activate_gpu_trace()` has run, c10 holds the Python
// interpreter, and each hook below calls the callbacks registered in
// `torch.phantom._gpu_trace` (the same registries torch.cuda._gpu_trace
// and torch.xpu._gpu_trace have), so tools written against those hooks,
// such as a stream sanitizer, see phantom's streams, events, allocations
// and synchronizations. Streams are named by their driver handle
// (`Stream.native_handle`), events by theirs, memory by its device address.
// Until the trace is activated each hook is one relaxed load and a branch.
// A hook takes the GIL to run the callbacks: call it with no runtime lock
// held.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/macros/Macros.h>

#include <cstdint>

namespace phantom::gpu_trace {

// Stops the hooks for good: called at interpreter exit, after which a hook
// taking the GIL (a tensor freed on autograd's device thread, say) would
// end its thread inside a noexcept frame and abort the process.
void stopTracing() noexcept;
bool tracingStopped() noexcept;

// Runs `call(arg)` for a hook. The Python extension installs one that sets
// aside the calling thread's pending Python exception while the hook runs
// and restores it after: a tensor freed while an exception unwinds (an op
// that raised, its temporaries released) reaches memoryFreed with that
// exception set, and running Python callbacks then would replace it with
// a SystemError. Without one, the hook is called directly.
using HookShield = void (*)(void (*call)(const void*), const void* arg);
void setHookShield(HookShield shield) noexcept;
HookShield hookShield() noexcept;

template <typename Hook>
inline void runHook(const Hook& hook) {
  if (HookShield shield = hookShield(); shield != nullptr) {
    shield([](const void* h) { (*static_cast<const Hook*>(h))(); }, &hook);
  } else {
    hook();
  }
}

// A query that answered "finished" (torch.Stream.query, torch.Event.query
// and whatever calls them through the device guard): the host has now seen
// that work end, as a synchronize shows it. c10's trace has no hook for a
// query, so the race detector installs this one (it then releases the host
// pages it protects until a copy is seen to finish). `is_event` tells an
// event (named by its handle) from a stream (by its driver handle). No
// observer: one relaxed load and a branch.
using QueryObserver = void (*)(bool is_event, uintptr_t handle);
void setQueryObserver(QueryObserver observer) noexcept;
QueryObserver queryObserver() noexcept;

inline void queryFinished(bool is_event, uintptr_t handle) {
  if (QueryObserver observer = queryObserver(); C10_UNLIKELY(observer != nullptr)) {
    observer(is_event, handle);
  }
}

// A stream recorded on a block from C++, which the dispatcher never sees
// as an aten::record_stream call: through the device guard
// (recordDataPtrOnStream: c10's Future does it for the streams its
// callbacks run on), or by pccl for its communication stream
// (ProcessGroupPhantom::issue). The race detector installs this observer so
// that such a block, freed after its use on that stream, is known to be
// held back for it. `data` is the block's address, `stream` the stream's
// driver handle. No observer: one relaxed load and a branch.
using RecordStreamObserver = void (*)(const void* data, uintptr_t stream);
void setRecordStreamObserver(RecordStreamObserver observer) noexcept;
RecordStreamObserver recordStreamObserver() noexcept;

inline void streamRecordedOn(const void* data, uintptr_t stream) {
  if (RecordStreamObserver observer = recordStreamObserver();
      C10_UNLIKELY(observer != nullptr)) {
    observer(data, stream);
  }
}

// A synchronize of one device, with its index: c10's device-synchronize
// hook carries no device, so the Python extension installs this observer
// to fire torch.phantom._gpu_trace's callbacks that take the device
// (register_callback_for_device_synchronization_with_index). It is called
// by deviceSynchronized below, only while the trace is active. No
// observer: one relaxed load and a branch.
using DeviceSyncObserver = void (*)(c10::DeviceIndex device);
void setDeviceSyncObserver(DeviceSyncObserver observer) noexcept;
DeviceSyncObserver deviceSyncObserver() noexcept;

inline const c10::impl::PyInterpreter* active() {
  const c10::impl::PyInterpreter* trace = c10::impl::GPUTrace::get_trace();
  return C10_UNLIKELY(trace != nullptr) && !tracingStopped() ? trace : nullptr;
}

template <typename Handle>
inline uintptr_t id(Handle handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

// The op being dispatched on the calling thread queues its device work on
// another stream than the current one: `stream` (driver handle `handle`,
// stream id `stream_id` of `device`), ordered after everything queued so
// far on the stream with driver handle `after`. pccl's collectives run on
// its communication stream that way (ProcessGroupPhantom::issue). The race
// detector installs this observer to file the op's accesses on `stream`,
// where they happen, and to order `stream` after `after`. Fire it once the
// ordering is queued and before anything is recorded on `stream` behind
// the work, with no runtime lock held. No observer: one relaxed load and a
// branch.
using WorkStreamObserver = void (*)(uintptr_t after, c10::DeviceIndex device,
                                    int64_t stream_id, uintptr_t handle);
void setWorkStreamObserver(WorkStreamObserver observer) noexcept;
WorkStreamObserver workStreamObserver() noexcept;

template <typename Stream>
inline void workQueuedOn(Stream after, c10::DeviceIndex device, int64_t stream_id,
                         Stream stream) {
  if (WorkStreamObserver observer = workStreamObserver();
      C10_UNLIKELY(observer != nullptr)) {
    observer(id(after), device, stream_id, id(stream));
  }
}

template <typename Event>
inline void eventCreated(Event event) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_event_creation(kType, id(event)); });
  }
}

template <typename Event>
inline void eventDestroyed(Event event) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_event_deletion(kType, id(event)); });
  }
}

template <typename Event, typename Stream>
inline void eventRecorded(Event event, Stream stream) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_event_record(kType, id(event), id(stream)); });
  }
}

template <typename Event, typename Stream>
inline void eventWaited(Event event, Stream stream) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_event_wait(kType, id(event), id(stream)); });
  }
}

template <typename Event>
inline void eventSynchronized(Event event) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_event_synchronization(kType, id(event)); });
  }
}

template <typename Stream>
inline void streamCreated(Stream stream) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_stream_creation(kType, id(stream)); });
  }
}

template <typename Stream>
inline void streamSynchronized(Stream stream) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_stream_synchronization(kType, id(stream)); });
  }
}

// Every stream of `device` is ordered before whatever the host does next:
// torch.phantom.synchronize(device), and the caching allocator's wait for
// all of a device's streams before it returns cached memory to the driver
// (empty_cache(), the retry after running out of memory). c10's hook gets
// no device (tools written for torch.cuda's trace read it as every
// device); the device-sync observer gets the index.
inline void deviceSynchronized(c10::DeviceIndex device) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_device_synchronization(kType); });
    if (DeviceSyncObserver observer = deviceSyncObserver(); observer != nullptr) {
      observer(device);
    }
  }
}

inline void memoryAllocated(const void* ptr) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_memory_allocation(kType, id(ptr)); });
  }
}

inline void memoryFreed(const void* ptr) {
  if (const auto* t = active(); C10_UNLIKELY(t != nullptr)) {
    runHook([&] { (*t)->trace_gpu_memory_deallocation(kType, id(ptr)); });
  }
}

}  // namespace phantom::gpu_trace
