// The C entry points of phantom/hal.h's streams, host work and copies for
// the fake driver: thin shells, as in hal_entry.cc, over Stream
// (stream.h), the copy engine (copy_engine.h) and graph capture (graph.h).
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "activity.h"
#include "activity_trace.h"
#include "config.h"
#include "copy_channels.h"
#include "copy_engine.h"
#include "device_memory.h"
#include "entry_checks.h"
#include "errors.h"
#include "event.h"
#include "fault_handler.h"
#include "graph.h"
#include "host_memory.h"
#include "phantom/hal.h"
#include "stream.h"

namespace phantom::fake {
namespace {

// Queues a copy (kind kCopy: `bytes` from `src` to `dst`) or fill (kMemset:
// `bytes` of `fill_byte` at `dst`), both sides host-addressable. A
// non-blocking one is plain data in its Task (no closure, no allocation:
// it is what every copy_ launches). When `blocking`, waits for that task
// and returns the copy's outcome (or the sticky error that skipped it); a
// blocking copy on an idle stream runs on the caller (Stream::RunNow), as
// ph_run_host_func does, which spares two thread hand-offs per copy.
ph_status_t QueueCopy(Stream& stream, TaskKind kind, const char* name,
                      void* dst, const void* src, int fill_byte, size_t bytes,
                      ph_memcpy_kind_t copy_kind, bool blocking) {
  Task task;
  task.kind = kind;
  task.name = name;
  task.bytes = bytes;
  task.copy_kind = copy_kind;
  task.copy_dst = dst;
  task.copy_src = src;
  task.fill_byte = fill_byte;
  if (!blocking) {
    if (CaptureActive()) {  // recorded into the stream's graph instead
      bool recorded = false;
      const ph_status_t status = RecordIfCapturing(stream, task, &recorded);
      if (recorded) return status;
    }
    uint64_t generation = 0;
    return stream.Enqueue(std::move(task), true, &generation);
  }
  if (CaptureActive()) {
    const ph_status_t refused = RefuseOnCapturingStream(
        stream, "ph_memcpy_async with pageable host memory (a blocking copy)");
    if (refused != PH_SUCCESS) return refused;
  }
  // The closure also notes that the copy ran, for the outcome below.
  auto ran = std::make_shared<bool>(false);
  task.run = [ran, kind, dst, src, fill_byte, bytes](char*, size_t) {
    RunCopyWork(kind, dst, src, fill_byte, bytes);
    *ran = true;
    return PH_SUCCESS;
  };
  const ph_status_t status = stream.RunNow(std::move(task));
  if (*ran) return PH_SUCCESS;  // the worker's write happens-before its count
  return status;
}

// ph_launch_host_func and ph_run_host_func: validate the task, wrap it, and
// hand it to `submit` (which owns it from then on). hal.h promises
// `release` on every error return.
template <typename Submit>
ph_status_t SubmitHostTask(const char* function, ph_stream_t handle,
                           const ph_host_task_t* host_task, Submit&& submit) {
  if (host_task == nullptr) return NullOut(function, "task");
  const ph_host_task_t copy = *host_task;
  auto release = [copy] {
    if (copy.release != nullptr) copy.release(copy.user_data);
  };
  if (copy.run == nullptr) {
    release();
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": task '" +
                    (copy.name != nullptr ? copy.name : "(unnamed)") +
                    "' has a NULL run function");
  }
  std::shared_ptr<Stream> stream;
  const ph_status_t found = GetStream(function, handle, &stream);
  if (found != PH_SUCCESS) {
    release();
    return found;
  }
  // Until the stream owns the task, an exception (bad_alloc building the
  // closures) must still release it.
  try {
    Task task;
    task.kind = TaskKind::kHostFunc;
    task.name = copy.name != nullptr ? copy.name : "(unnamed)";
    task.host = copy;  // run and released by the stream (Task::host)
    return submit(*stream, std::move(task));
  } catch (...) {
    release();
    throw;
  }
}

}  // namespace
}  // namespace phantom::fake

using namespace phantom::fake;  // NOLINT: this file is the C shell

extern "C" {

/* ---- Streams ----------------------------------------------------------- */

ph_status_t ph_stream_create(int device, int priority,
                             ph_stream_t* out_stream) {
  return Guarded("ph_stream_create", [&] {
    if (out_stream == nullptr) return NullOut("ph_stream_create", "out_stream");
    *out_stream = nullptr;
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    const int clamped =
        priority < kStreamPriorityHigh
            ? kStreamPriorityHigh
            : (priority > kStreamPriorityLow ? kStreamPriorityLow : priority);
    auto stream = std::make_shared<Stream>(device, clamped);
    stream->Start();
    *out_stream = RegisterStream(std::move(stream));
    return PH_SUCCESS;
  });
}

ph_status_t ph_stream_destroy(ph_stream_t handle) {
  return Guarded("ph_stream_destroy", [&] {
    std::shared_ptr<Stream> stream;
    const ph_status_t found = GetStream("ph_stream_destroy", handle, &stream);
    if (found != PH_SUCCESS) return found;
    if (CurrentStream() == stream.get()) {
      return WaitsForItself("ph_stream_destroy", "that stream");
    }
    ph_status_t capturing = PH_SUCCESS;
    if (CaptureActive()) {
      capturing = RefuseOnCapturingStream(*stream, "ph_stream_destroy");
      ForgetStream(*stream);
    }
    stream = UnregisterStream(handle);
    if (!stream) return InvalidHandle("ph_stream_destroy", "stream", handle);
    stream->Shutdown();
    return capturing;
  });
}

ph_status_t ph_stream_query(ph_stream_t handle) {
  return Guarded("ph_stream_query", [&] {
    std::shared_ptr<Stream> stream;
    const ph_status_t found = GetStream("ph_stream_query", handle, &stream);
    if (found != PH_SUCCESS) return found;
    if (CaptureActive()) {
      const ph_status_t refused =
          RefuseOnCapturingStream(*stream, "ph_stream_query");
      if (refused != PH_SUCCESS) return refused;
    }
    return stream->Query();
  });
}

ph_status_t ph_stream_synchronize(ph_stream_t handle) {
  return Guarded("ph_stream_synchronize", [&] {
    std::shared_ptr<Stream> stream;
    const ph_status_t found =
        GetStream("ph_stream_synchronize", handle, &stream);
    if (found != PH_SUCCESS) return found;
    if (CurrentStream() == stream.get()) {
      return WaitsForItself("ph_stream_synchronize", "that stream");
    }
    if (CaptureActive()) {
      const ph_status_t refused =
          RefuseOnCapturingStream(*stream, "ph_stream_synchronize");
      if (refused != PH_SUCCESS) return refused;
    }
    return stream->Synchronize();
  });
}

ph_status_t ph_stream_get_device(ph_stream_t handle, int* out_device) {
  return Guarded("ph_stream_get_device", [&] {
    if (out_device == nullptr) {
      return NullOut("ph_stream_get_device", "out_device");
    }
    *out_device = 0;
    std::shared_ptr<Stream> stream;
    const ph_status_t found = GetStream("ph_stream_get_device", handle, &stream);
    if (found != PH_SUCCESS) return found;
    *out_device = stream->device();
    return PH_SUCCESS;
  });
}

ph_status_t ph_stream_get_priority(ph_stream_t handle, int* out_priority) {
  return Guarded("ph_stream_get_priority", [&] {
    if (out_priority == nullptr) {
      return NullOut("ph_stream_get_priority", "out_priority");
    }
    *out_priority = 0;
    std::shared_ptr<Stream> stream;
    const ph_status_t found =
        GetStream("ph_stream_get_priority", handle, &stream);
    if (found != PH_SUCCESS) return found;
    *out_priority = stream->priority();
    return PH_SUCCESS;
  });
}

ph_status_t ph_stream_wait_event(ph_stream_t stream_handle,
                                 ph_event_t event_handle) {
  return Guarded("ph_stream_wait_event", [&] {
    std::shared_ptr<Stream> stream;
    ph_status_t status =
        GetStream("ph_stream_wait_event", stream_handle, &stream);
    if (status != PH_SUCCESS) return status;
    std::shared_ptr<Event> event;
    status = GetEvent("ph_stream_wait_event", event_handle, &event);
    if (status != PH_SUCCESS) return status;
    if (CaptureActive() || event->captured.load(std::memory_order_acquire)) {
      bool handled = false;
      status = WaitEventIfCapturing(*stream, event, &handled);
      if (handled) return status;
    }
    if (event->shared) return event->shared->QueueWait(event->shared, *stream);
    std::shared_ptr<EventRecord> record = event->Latest();
    if (!record) return PH_SUCCESS;  // never recorded: no wait
    Task task;
    task.kind = TaskKind::kEventWait;
    task.name = "ph_stream_wait_event";
    // Work after the wait depends on the work before the record: if that
    // failed, this stream fails with it, here (hal.h's error model).
    task.wait = [record](std::string* message, std::string* origin) {
      record->WaitReached();
      ph_status_t failure = PH_SUCCESS;
      record->Reached(&failure, origin);
      if (failure != PH_SUCCESS) *message = InheritedByWait(*record, *origin);
      return failure;
    };
    uint64_t generation = 0;
    return stream->Enqueue(std::move(task), false, &generation);
  });
}

ph_status_t ph_launch_host_func(ph_stream_t handle,
                                const ph_host_task_t* host_task) {
  return Guarded("ph_launch_host_func", [&] {
    return SubmitHostTask("ph_launch_host_func", handle, host_task,
                          [](Stream& stream, Task task) {
                            if (CaptureActive()) {  // recorded instead
                              bool recorded = false;
                              const ph_status_t status =
                                  RecordIfCapturing(stream, task, &recorded);
                              if (recorded) return status;
                            }
                            uint64_t generation = 0;
                            return stream.Enqueue(std::move(task), true,
                                                  &generation);
                          });
  });
}

ph_status_t ph_run_host_func(ph_stream_t handle,
                             const ph_host_task_t* host_task) {
  return Guarded("ph_run_host_func", [&] {
    return SubmitHostTask(
        "ph_run_host_func", handle, host_task, [](Stream& stream, Task task) {
          if (CurrentStream() == &stream) {
            task.Release();
            return Fail(PH_ERROR_INVALID_ARGUMENT,
                        "ph_run_host_func: called from work running on the "
                        "same stream, which would wait for itself");
          }
          if (CaptureActive()) {
            const ph_status_t refused = RefuseOnCapturingStream(
                stream, "ph_run_host_func (work the caller waits for)");
            if (refused != PH_SUCCESS) {
              task.Release();
              return refused;
            }
          }
          return stream.RunNow(std::move(task));
        });
  });
}

/* ---- Copies ------------------------------------------------------------ */

ph_status_t ph_memcpy(void* dst, const void* src, size_t size,
                      ph_memcpy_kind_t kind) {
  return Guarded("ph_memcpy", [&] {
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    if (size == 0) return PH_SUCCESS;
    if (CaptureActive()) {
      const ph_status_t refused = RefuseUnsafeCall("ph_memcpy", -1);
      if (refused != PH_SUCCESS) return refused;
    }
    CopyPlan plan;
    const ph_status_t planned = PlanCopy("ph_memcpy", dst, src, size, kind, &plan);
    if (planned != PH_SUCCESS) return planned;
    // Busy time of each device whose memory the copy reads or writes.
    const int dst_device = DeviceOfAddress(reinterpret_cast<uintptr_t>(dst));
    const int src_device = DeviceOfAddress(reinterpret_cast<uintptr_t>(src));
    const MeteredSpan dst_metered(dst_device >= 0 ? &MemoryMeter(dst_device)
                                                  : nullptr);
    const MeteredSpan src_metered(
        src_device >= 0 && src_device != dst_device ? &MemoryMeter(src_device)
                                                    : nullptr);
    if (!trace::On()) {
      ChannelCopy(plan.dst, plan.src, plan.size);
      return PH_SUCCESS;
    }
    ph_activity_record_t record{};  // a blocking copy runs on no stream
    record.kind = PH_ACTIVITY_MEMCPY;
    record.device = dst_device >= 0 ? dst_device : std::max(src_device, 0);
    record.correlation_id = trace::CurrentCorrelation();
    record.bytes = size;
    record.copy_kind = kind;
    record.start_ns = NowNs();
    ChannelCopy(plan.dst, plan.src, plan.size);
    record.end_ns = NowNs();
    trace::Record(record);
    return PH_SUCCESS;
  });
}

ph_status_t ph_memcpy_async(void* dst, const void* src, size_t size,
                            ph_memcpy_kind_t kind, ph_stream_t handle) {
  return Guarded("ph_memcpy_async", [&] {
    std::shared_ptr<Stream> stream;
    ph_status_t status = GetStream("ph_memcpy_async", handle, &stream);
    if (status != PH_SUCCESS) return status;
    status = stream->StickyStatus();
    if (status != PH_SUCCESS) return status;
    if (size == 0) return PH_SUCCESS;
    CopyPlan plan;
    status = PlanCopy("ph_memcpy_async", dst, src, size, kind, &plan);
    if (status != PH_SUCCESS) return status;
    if (plan.pageable_host && CurrentStream() == stream.get()) {
      return WaitsForItself("ph_memcpy_async with pageable host memory",
                            "the stream it copies on");
    }
    return QueueCopy(*stream, TaskKind::kCopy, "ph_memcpy_async", plan.dst,
                     plan.src, 0, plan.size, kind, plan.pageable_host);
  });
}

ph_status_t ph_memset_async(void* dst, int value, size_t size,
                            ph_stream_t handle) {
  return Guarded("ph_memset_async", [&] {
    std::shared_ptr<Stream> stream;
    ph_status_t status = GetStream("ph_memset_async", handle, &stream);
    if (status != PH_SUCCESS) return status;
    status = stream->StickyStatus();
    if (status != PH_SUCCESS) return status;
    if (size == 0) return PH_SUCCESS;
    void* view = nullptr;
    status = PlanFill("ph_memset_async", dst, size, &view);
    if (status != PH_SUCCESS) return status;
    const int byte = value & 0xff;
    return QueueCopy(*stream, TaskKind::kMemset, "ph_memset_async", view,
                     nullptr, byte, size, PH_MEMCPY_HOST_TO_HOST, false);
  });
}

}  // extern "C"
