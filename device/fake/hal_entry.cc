// The C entry points of phantom/hal.h for the fake driver.
//
// Each function is a thin shell: clear the out parameters, check the
// driver started (configuration valid), validate arguments and handles,
// then delegate to the object that owns the behaviour (DeviceMemory,
// host_memory, Stream, Event, copy_engine). Every error path returns
// through Fail() so the thread's last-error message always matches the
// status, and Guarded() keeps C++ exceptions from crossing the C ABI.
//
// The current device is thread-local, as in CUDA. Stream and event handles
// are registry ids (see handle_registry.h).
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "activity.h"
#include "activity_trace.h"
#include "config.h"
#include "copy_channels.h"
#include "copy_engine.h"
#include "device_memory.h"
#include "errors.h"
#include "event.h"
#include "fault_handler.h"
#include "graph.h"
#include "host_memory.h"
#include "ipc.h"
#include "phantom/hal.h"
#include "stream.h"

namespace phantom::fake {
namespace {

thread_local int t_current_device = 0;

// PH_SUCCESS if the configuration is valid, else PH_ERROR_NOT_INITIALIZED
// with the configuration's sentence.
ph_status_t CheckStarted() {
  const Config& config = GetConfig();
  if (config.ok) return PH_SUCCESS;
  return Fail(PH_ERROR_NOT_INITIALIZED, config.error);
}

ph_status_t CheckDevice(int device) {
  const ph_status_t started = CheckStarted();
  if (started != PH_SUCCESS) return started;
  const int count = GetConfig().device_count;
  if (device >= 0 && device < count) return PH_SUCCESS;
  return Fail(PH_ERROR_INVALID_DEVICE,
              "device index " + std::to_string(device) +
                  " is out of range: there are " + std::to_string(count) +
                  " phantom devices (PHANTOM_DEVICE_COUNT)");
}

ph_status_t NullOut(const char* function, const char* parameter) {
  return Fail(PH_ERROR_INVALID_ARGUMENT,
              std::string(function) + ": " + parameter + " is NULL");
}

ph_status_t InvalidStream(const char* function, ph_stream_t handle) {
  char text[160];
  std::snprintf(text, sizeof text,
                "%s: stream handle %p is null, destroyed or not a stream",
                function, static_cast<void*>(handle));
  return Fail(PH_ERROR_INVALID_HANDLE, text);
}

ph_status_t InvalidEvent(const char* function, ph_event_t handle) {
  char text[160];
  std::snprintf(text, sizeof text,
                "%s: event handle %p is null, destroyed or not an event",
                function, static_cast<void*>(handle));
  return Fail(PH_ERROR_INVALID_HANDLE, text);
}

// Finds a live stream or fails with PH_ERROR_INVALID_HANDLE.
ph_status_t GetStream(const char* function, ph_stream_t handle,
                      std::shared_ptr<Stream>* out) {
  const ph_status_t started = CheckStarted();
  if (started != PH_SUCCESS) return started;
  *out = FindStream(handle);
  return *out ? PH_SUCCESS : InvalidStream(function, handle);
}

ph_status_t GetEvent(const char* function, ph_event_t handle,
                     std::shared_ptr<Event>* out) {
  const ph_status_t started = CheckStarted();
  if (started != PH_SUCCESS) return started;
  *out = FindEvent(handle);
  return *out ? PH_SUCCESS : InvalidEvent(function, handle);
}

ph_status_t WaitsForItself(const char* function, const char* what) {
  return Fail(PH_ERROR_INVALID_ARGUMENT,
              std::string(function) + " was called from work running on " +
                  what + ", which would wait for itself forever");
}

// Queues a copy/fill task. When `blocking`, waits for that task and
// returns the copy's outcome (or the sticky error that skipped it); a
// blocking copy on an idle stream runs on the caller (Stream::RunNow), as
// ph_run_host_func does, which spares two thread hand-offs per copy.
ph_status_t QueueCopy(Stream& stream, TaskKind kind, const char* name,
                      std::function<void()> body, bool blocking, size_t bytes,
                      ph_memcpy_kind_t copy_kind) {
  auto ran = std::make_shared<bool>(false);
  Task task;
  task.kind = kind;
  task.name = name;
  task.bytes = bytes;
  task.copy_kind = copy_kind;
  task.run = [body = std::move(body), ran](char*, size_t) {
    body();
    *ran = true;
    return PH_SUCCESS;
  };
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

const char* ph_status_name(ph_status_t status) {
  return ph_status_name_of(status);
}

const char* ph_last_error_message(void) { return LastErrorMessage(); }

uint32_t ph_abi_version(void) { return PH_HAL_ABI_VERSION; }

/* ---- Devices ----------------------------------------------------------- */

ph_status_t ph_device_count(int* out_count) {
  return Guarded("ph_device_count", [&] {
    if (out_count == nullptr) return NullOut("ph_device_count", "out_count");
    *out_count = 0;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    *out_count = GetConfig().device_count;
    return PH_SUCCESS;
  });
}

ph_status_t ph_get_device(int* out_device) {
  return Guarded("ph_get_device", [&] {
    if (out_device == nullptr) return NullOut("ph_get_device", "out_device");
    *out_device = 0;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    *out_device = t_current_device;
    return PH_SUCCESS;
  });
}

ph_status_t ph_set_device(int device) {
  return Guarded("ph_set_device", [&] {
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    t_current_device = device;
    return PH_SUCCESS;
  });
}

ph_status_t ph_device_get_properties(int device,
                                     ph_device_properties_t* out_props) {
  return Guarded("ph_device_get_properties", [&] {
    if (out_props == nullptr) {
      return NullOut("ph_device_get_properties", "out_props");
    }
    // Versioned by size (hal.h): the fake needs at least the ABI 1003
    // struct and writes only what fits of its own (ABI 1006) one.
    const size_t size = out_props->struct_size;
    if (size < PH_DEVICE_PROPERTIES_MIN_SIZE) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_device_get_properties: struct_size is " +
                      std::to_string(size) + ", smaller than the " +
                      std::to_string(PH_DEVICE_PROPERTIES_MIN_SIZE) +
                      " bytes of the ABI 1003 struct; set it to "
                      "sizeof(ph_device_properties_t)");
    }
    const size_t writable = size < sizeof(ph_device_properties_t)
                                ? size
                                : sizeof(ph_device_properties_t);
    std::memset(reinterpret_cast<char*>(out_props) + sizeof(size_t), 0,
                writable - sizeof(size_t));
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    ph_device_properties_t filled{};
    std::snprintf(filled.name, sizeof filled.name, "%s",
                  "Phantom fake accelerator");
    filled.total_memory = GetConfig().device_memory;
    const unsigned cores = std::thread::hardware_concurrency();
    filled.multiprocessor_count = cores > 0 ? static_cast<int>(cores) : 1;
    filled.stream_priority_low = kStreamPriorityLow;
    filled.stream_priority_high = kStreamPriorityHigh;
    // Copies write pinned blocks through an alias mapping (host_memory.h).
    filled.flags = PinnedAliasesAvailable()
                       ? PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION
                       : 0u;
    std::memcpy(reinterpret_cast<char*>(out_props) + sizeof(size_t),
                reinterpret_cast<const char*>(&filled) + sizeof(size_t),
                writable - sizeof(size_t));
    return PH_SUCCESS;
  });
}

ph_status_t ph_device_get_telemetry(int device,
                                    ph_device_telemetry_t* out_telemetry) {
  return Guarded("ph_device_get_telemetry", [&] {
    if (out_telemetry == nullptr) {
      return NullOut("ph_device_get_telemetry", "out_telemetry");
    }
    // The struct grows at the end (hal.h): fill what lies within the
    // caller's struct_size, never past it.
    const size_t size = out_telemetry->struct_size;
    constexpr size_t kMinimum =
        offsetof(ph_device_telemetry_t, valid) + sizeof(uint32_t);
    if (size < kMinimum) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_device_get_telemetry: struct_size is " +
                      std::to_string(size) + ", smaller than the " +
                      std::to_string(kMinimum) +
                      " bytes up to `valid`; set it to "
                      "sizeof(ph_device_telemetry_t)");
    }
    const size_t writable = size < sizeof(ph_device_telemetry_t)
                                ? size
                                : sizeof(ph_device_telemetry_t);
    std::memset(reinterpret_cast<char*>(out_telemetry) + sizeof(size_t), 0,
                size - sizeof(size_t));
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    // The fake measures how long its workers ran work and copies
    // (activity.h); it has no sensors: no temperature, power or clock.
    const ActivitySample sample = SampleActivity(device);
    ph_device_telemetry_t filled{};
    filled.struct_size = size;
    filled.valid = PH_TELEMETRY_UTILIZATION | PH_TELEMETRY_MEMORY_BUSY;
    filled.utilization_percent = sample.compute_percent;
    filled.memory_busy_percent = sample.memory_percent;
    filled.sample_period_us = sample.period_ns / 1000;
    // A field counts only if the caller's struct holds all of it.
    if (writable < offsetof(ph_device_telemetry_t, memory_busy_percent) +
                       sizeof(uint32_t)) {
      filled.valid &= ~static_cast<uint32_t>(PH_TELEMETRY_MEMORY_BUSY);
    }
    if (writable < offsetof(ph_device_telemetry_t, utilization_percent) +
                       sizeof(uint32_t)) {
      filled.valid &= ~static_cast<uint32_t>(PH_TELEMETRY_UTILIZATION);
    }
    std::memcpy(reinterpret_cast<char*>(out_telemetry) + sizeof(size_t),
                reinterpret_cast<const char*>(&filled) + sizeof(size_t),
                writable - sizeof(size_t));
    return PH_SUCCESS;
  });
}

ph_status_t ph_device_synchronize(int device) {
  return Guarded("ph_device_synchronize", [&] {
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    Stream* current = CurrentStream();
    if (current != nullptr && current->device() == device) {
      return WaitsForItself("ph_device_synchronize",
                            "a stream of the same device");
    }
    if (CaptureActive()) {
      const ph_status_t refused =
          RefuseUnsafeCall("ph_device_synchronize", device);
      if (refused != PH_SUCCESS) return refused;
    }
    ph_status_t first_error = PH_SUCCESS;
    std::string first_message;
    for (const auto& stream : LiveStreams()) {
      if (stream->device() != device) continue;
      const ph_status_t status = stream->Synchronize();
      if (status != PH_SUCCESS && first_error == PH_SUCCESS) {
        first_error = status;
        first_message = LastErrorMessage();
      }
    }
    if (first_error == PH_SUCCESS) return PH_SUCCESS;
    return Fail(first_error, std::move(first_message));
  });
}

/* ---- Memory ------------------------------------------------------------ */

ph_status_t ph_mem_get_info(int device, size_t* out_free, size_t* out_total) {
  return Guarded("ph_mem_get_info", [&] {
    if (out_free == nullptr || out_total == nullptr) {
      return NullOut("ph_mem_get_info",
                     out_free == nullptr ? "out_free" : "out_total");
    }
    *out_free = 0;
    *out_total = 0;
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    GetDeviceMemory(device).GetInfo(out_free, out_total);
    return PH_SUCCESS;
  });
}

ph_status_t ph_malloc(int device, size_t size, void** out_ptr) {
  return Guarded("ph_malloc", [&] {
    if (out_ptr == nullptr) return NullOut("ph_malloc", "out_ptr");
    *out_ptr = nullptr;
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    if (size == 0) return PH_SUCCESS;
    return GetDeviceMemory(device).Allocate(size, out_ptr);
  });
}

ph_status_t ph_free(void* ptr) {
  return Guarded("ph_free", [&] {
    if (ptr == nullptr) return PH_SUCCESS;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    const int device = DeviceOfAddress(reinterpret_cast<uintptr_t>(ptr));
    if (device < 0) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "ph_free: %p is not device memory (host memory is freed "
                    "with ph_host_free or free)",
                    ptr);
      return Fail(PH_ERROR_INVALID_HANDLE, text);
    }
    if (CaptureActive()) {
      const ph_status_t refused = RefuseUnsafeCall("ph_free", device);
      if (refused != PH_SUCCESS) return refused;
    }
    return GetDeviceMemory(device).Free(reinterpret_cast<uintptr_t>(ptr));
  });
}

ph_status_t ph_host_malloc(size_t size, void** out_ptr) {
  return Guarded("ph_host_malloc", [&] {
    if (out_ptr == nullptr) return NullOut("ph_host_malloc", "out_ptr");
    *out_ptr = nullptr;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    if (size == 0) return PH_SUCCESS;
    return AllocatePinned(size, out_ptr);
  });
}

ph_status_t ph_host_free(void* ptr) {
  return Guarded("ph_host_free", [&] {
    if (ptr == nullptr) return PH_SUCCESS;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    return FreePinned(ptr);
  });
}

ph_status_t ph_pointer_get_attributes(const void* ptr,
                                      ph_pointer_attributes_t* out_attr) {
  return Guarded("ph_pointer_get_attributes", [&] {
    if (out_attr == nullptr) {
      return NullOut("ph_pointer_get_attributes", "out_attr");
    }
    *out_attr = ph_pointer_attributes_t{PH_MEMORY_UNREGISTERED, -1, nullptr, 0};
    if (ptr == nullptr) return PH_SUCCESS;
    const DeviceAddressInfo device = LookupDeviceAddress(ptr);
    if (device.device >= 0) {
      out_attr->type = PH_MEMORY_DEVICE;
      out_attr->device = device.device;
      if (device.live) {
        out_attr->base = reinterpret_cast<void*>(device.base);
        out_attr->size = device.size;
      }
      return PH_SUCCESS;
    }
    uintptr_t base = 0;
    size_t size = 0;
    if (LookupPinned(ptr, &base, &size)) {
      out_attr->type = PH_MEMORY_HOST_PINNED;
      out_attr->base = reinterpret_cast<void*>(base);
      out_attr->size = size;
    }
    return PH_SUCCESS;
  });
}

ph_status_t ph_kernel_address(const void* device_ptr, void** out_ptr) {
  return Guarded("ph_kernel_address", [&] {
    if (out_ptr == nullptr) return NullOut("ph_kernel_address", "out_ptr");
    *out_ptr = nullptr;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    if (CurrentStream() == nullptr) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_kernel_address is only valid inside work running on a "
                  "stream (ph_launch_host_func); host code must never touch "
                  "device memory: copy it to the host with ph_memcpy");
    }
    void* view = KernelViewOf(device_ptr);
    if (view == nullptr) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "ph_kernel_address: %p is not device memory", device_ptr);
      return Fail(PH_ERROR_INVALID_ARGUMENT, text);
    }
    *out_ptr = view;
    return PH_SUCCESS;
  });
}

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
    if (!stream) return InvalidStream("ph_stream_destroy", handle);
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
    return QueueCopy(
        *stream, TaskKind::kCopy, "ph_memcpy_async",
        [plan] { ChannelCopy(plan.dst, plan.src, plan.size); },
        plan.pageable_host, size, kind);
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
    return QueueCopy(
        *stream, TaskKind::kMemset, "ph_memset_async",
        [view, byte, size] { std::memset(view, byte, size); }, false, size,
        PH_MEMCPY_HOST_TO_HOST);
  });
}

/* ---- Events ------------------------------------------------------------ */

ph_status_t ph_event_create(unsigned flags, ph_event_t* out_event) {
  return Guarded("ph_event_create", [&] {
    if (out_event == nullptr) return NullOut("ph_event_create", "out_event");
    *out_event = nullptr;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    const unsigned known = PH_EVENT_DISABLE_TIMING | PH_EVENT_INTERPROCESS;
    if ((flags & ~known) != 0) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "ph_event_create: unknown flags 0x%x (use "
                    "PH_EVENT_DEFAULT, PH_EVENT_DISABLE_TIMING or "
                    "PH_EVENT_INTERPROCESS)",
                    flags);
      return Fail(PH_ERROR_INVALID_ARGUMENT, text);
    }
    auto event = std::make_shared<Event>(flags);
    if ((flags & PH_EVENT_INTERPROCESS) != 0) {
      const ph_status_t offered = CheckIpcOffered("ph_event_create");
      if (offered != PH_SUCCESS) return offered;
      if ((flags & PH_EVENT_DISABLE_TIMING) == 0) {
        return Fail(PH_ERROR_INVALID_ARGUMENT,
                    "ph_event_create: PH_EVENT_INTERPROCESS needs "
                    "PH_EVENT_DISABLE_TIMING too (interprocess events do not "
                    "time work)");
      }
      const ph_status_t created = SharedEvent::Create(&event->shared);
      if (created != PH_SUCCESS) return created;
    }
    *out_event = RegisterEvent(std::move(event));
    return PH_SUCCESS;
  });
}

ph_status_t ph_event_destroy(ph_event_t handle) {
  return Guarded("ph_event_destroy", [&] {
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    if (!UnregisterEvent(handle)) return InvalidEvent("ph_event_destroy", handle);
    return PH_SUCCESS;
  });
}

ph_status_t ph_event_record(ph_event_t event_handle,
                            ph_stream_t stream_handle) {
  return Guarded("ph_event_record", [&] {
    std::shared_ptr<Event> event;
    ph_status_t status = GetEvent("ph_event_record", event_handle, &event);
    if (status != PH_SUCCESS) return status;
    std::shared_ptr<Stream> stream;
    status = GetStream("ph_event_record", stream_handle, &stream);
    if (status != PH_SUCCESS) return status;
    if (CaptureActive() || event->captured.load(std::memory_order_acquire)) {
      bool recorded = false;
      status = RecordEventIfCapturing(*stream, *event, &recorded);
      if (recorded) return status;
    }
    if (event->shared) return event->shared->Record(event->shared, stream);
    auto record = std::make_shared<EventRecord>();
    record->stream_identity = stream.get();
    record->device = stream->device();
    Task task;
    task.kind = TaskKind::kEventMarker;
    task.name = "ph_event_record";
    // The time is taken when the marker runs; the record counts as reached
    // only after the stream has counted the marker complete, so a query of
    // the stream right after the event is reached already says idle.
    task.run = [record](char*, size_t) {
      record->MarkTime();
      return PH_SUCCESS;
    };
    task.on_complete = [record](ph_status_t failure,
                                const std::string& origin) {
      record->MarkReached(failure, origin);  // what came before the marker
    };
    task.runs_when_sticky = true;
    // Publish under the event's lock so concurrent records of one event
    // leave `latest` pointing at whichever marker was queued last.
    std::lock_guard<std::mutex> lock(event->mutex);
    uint64_t generation = 0;
    status = stream->Enqueue(std::move(task), false, &generation);
    if (status != PH_SUCCESS) return status;
    event->latest = std::move(record);
    return PH_SUCCESS;
  });
}

ph_status_t ph_event_query(ph_event_t handle) {
  return Guarded("ph_event_query", [&] {
    std::shared_ptr<Event> event;
    const ph_status_t found = GetEvent("ph_event_query", handle, &event);
    if (found != PH_SUCCESS) return found;
    const ph_status_t captured = RefuseCapturedEvent(*event, "ph_event_query");
    if (captured != PH_SUCCESS) return captured;
    if (event->shared) return event->shared->Query();
    std::shared_ptr<EventRecord> record = event->Latest();
    if (!record) return PH_SUCCESS;
    ph_status_t failure = PH_SUCCESS;
    std::string origin;
    if (!record->Reached(&failure, &origin)) return PH_NOT_READY;
    if (failure == PH_SUCCESS) return PH_SUCCESS;
    return Fail(failure, CarriedByEvent(*record, origin));
  });
}

ph_status_t ph_event_synchronize(ph_event_t handle) {
  return Guarded("ph_event_synchronize", [&] {
    std::shared_ptr<Event> event;
    const ph_status_t found = GetEvent("ph_event_synchronize", handle, &event);
    if (found != PH_SUCCESS) return found;
    const ph_status_t captured =
        RefuseCapturedEvent(*event, "ph_event_synchronize");
    if (captured != PH_SUCCESS) return captured;
    if (event->shared) return event->shared->Synchronize();
    std::shared_ptr<EventRecord> record = event->Latest();
    if (!record) return PH_SUCCESS;
    ph_status_t failure = PH_SUCCESS;
    std::string origin;
    if (!record->Reached(&failure, &origin) &&
        CurrentStream() == record->stream_identity) {
      return WaitsForItself("ph_event_synchronize",
                            "the stream that recorded the event");
    }
    record->WaitReached();
    record->Reached(&failure, &origin);
    if (failure == PH_SUCCESS) return PH_SUCCESS;
    return Fail(failure, CarriedByEvent(*record, origin));
  });
}

ph_status_t ph_event_elapsed_time(ph_event_t start_handle,
                                  ph_event_t end_handle, float* out_ms) {
  return Guarded("ph_event_elapsed_time", [&] {
    if (out_ms == nullptr) return NullOut("ph_event_elapsed_time", "out_ms");
    *out_ms = 0.0f;
    std::shared_ptr<Event> start;
    std::shared_ptr<Event> end;
    ph_status_t status = GetEvent("ph_event_elapsed_time", start_handle, &start);
    if (status != PH_SUCCESS) return status;
    status = GetEvent("ph_event_elapsed_time", end_handle, &end);
    if (status != PH_SUCCESS) return status;
    if (((start->flags | end->flags) & PH_EVENT_DISABLE_TIMING) != 0) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_event_elapsed_time: an event was created with "
                  "PH_EVENT_DISABLE_TIMING");
    }
    std::shared_ptr<EventRecord> first = start->Latest();
    std::shared_ptr<EventRecord> second = end->Latest();
    if (!first || !second) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  std::string("ph_event_elapsed_time: the ") +
                      (!first ? "start" : "end") +
                      " event was never recorded");
    }
    std::chrono::steady_clock::time_point t0;
    std::chrono::steady_clock::time_point t1;
    {
      std::lock_guard<std::mutex> lock(first->mutex);
      if (!first->reached.load()) return PH_NOT_READY;
      t0 = first->time;
    }
    {
      std::lock_guard<std::mutex> lock(second->mutex);
      if (!second->reached.load()) return PH_NOT_READY;
      t1 = second->time;
    }
    *out_ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
    return PH_SUCCESS;
  });
}

}  // extern "C"
