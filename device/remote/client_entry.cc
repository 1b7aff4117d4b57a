// The C entry points of phantom/hal.h for the remote driver.
//
// Each function is a thin shell, as in the fake: clear the out parameters,
// start the session (client_link.h), validate what can be validated here
// (handles, device indices, copy ranges against the allocation mirror),
// then send one request to the server, or a few for a staged copy. The
// semantics (ordering, sticky errors, events) live in the server
// (server_stream.h); the client adds the checks only it can make: that a
// call comes from host work running on the stream it would wait for.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "client_link.h"
#include "client_memory.h"
#include "client_streams.h"
#include "phantom/hal.h"
#include "wire.h"

namespace phantom::remote {
namespace {

thread_local int t_current_device = 0;

ph_status_t NullOut(const char* function, const char* parameter) {
  return Fail(PH_ERROR_INVALID_ARGUMENT,
              std::string(function) + ": " + parameter + " is NULL");
}

ph_status_t CheckDevice(int device) {
  const ph_status_t started = Start();
  if (started != PH_SUCCESS) return started;
  const int count = Info().device_count;
  if (device >= 0 && device < count) return PH_SUCCESS;
  return Fail(PH_ERROR_INVALID_DEVICE,
              "device index " + std::to_string(device) +
                  " is out of range: there are " + std::to_string(count) +
                  " phantom devices (PHANTOM_DEVICE_COUNT)");
}

ph_status_t InvalidStream(const char* function, ph_stream_t handle) {
  char text[160];
  std::snprintf(text, sizeof text,
                "%s: stream handle %p is null, destroyed or not a stream",
                function, static_cast<void*>(handle));
  return Fail(PH_ERROR_INVALID_HANDLE, text);
}

ph_status_t GetStream(const char* function, ph_stream_t handle,
                      std::shared_ptr<ClientStream>* out) {
  const ph_status_t started = Start();
  if (started != PH_SUCCESS) return started;
  *out = FindStream(handle);
  return *out ? PH_SUCCESS : InvalidStream(function, handle);
}

ph_status_t GetEvent(const char* function, ph_event_t handle, uint64_t* out) {
  const ph_status_t started = Start();
  if (started != PH_SUCCESS) return started;
  *out = EventId(handle);
  if (*out != 0) return PH_SUCCESS;
  char text[160];
  std::snprintf(text, sizeof text,
                "%s: event handle %p is null, destroyed or not an event",
                function, static_cast<void*>(handle));
  return Fail(PH_ERROR_INVALID_HANDLE, text);
}

ph_status_t WaitsForItself(const char* function, const char* what) {
  return Fail(PH_ERROR_INVALID_ARGUMENT,
              std::string(function) + " was called from work running on " +
                  what + ", which would wait for itself forever");
}

// A message naming the failing call, for errors the server words plainly.
ph_status_t Named(const char* function, ph_status_t status) {
  if (status == PH_SUCCESS || status == PH_NOT_READY) return status;
  if (status == PH_ERROR_INVALID_HANDLE) {
    return Fail(status, std::string(function) + ": " + LastErrorMessage());
  }
  return status;
}

// The sticky error of `stream`, or PH_SUCCESS (for zero-byte work).
ph_status_t StickyOf(const ClientStream& stream) {
  Message request;
  request.a[0] = stream.id();
  const ph_status_t status = Call(Op::kStreamQuery, request);
  return status == PH_NOT_READY ? PH_SUCCESS : status;
}

uint64_t PlaceOf(const Side& side) {
  return static_cast<uint64_t>(side.device ? Place::kDevice : Place::kPinned);
}

// A copy whose sides the server can reach (device or pinned), on `stream`
// (0: now).
ph_status_t DirectCopy(uint64_t stream, const CopyPlan& plan) {
  Message request;
  request.a[0] = stream;
  request.a[1] = PlaceOf(plan.dst);
  request.a[2] = plan.dst.server;
  request.a[3] = PlaceOf(plan.src);
  request.a[4] = plan.src.server;
  request.a[5] = plan.size;
  return Call(Op::kCopy, request);
}

// A copy with one pageable host side, through the calling thread's staging
// block, chunk by chunk; each chunk is waited for (on `stream`, in order).
ph_status_t StagedCopy(uint64_t stream, const CopyPlan& plan) {
  size_t staging_size = 0;
  char* staging = Staging(&staging_size);
  if (staging == nullptr) return static_cast<ph_status_t>(PH_ERROR_OUT_OF_MEMORY);
  const bool to_device = plan.src.host != nullptr && !plan.src.pinned;
  const Side& device = to_device ? plan.dst : plan.src;
  for (size_t done = 0; done < plan.size;) {
    const size_t chunk =
        plan.size - done < staging_size ? plan.size - done : staging_size;
    Message request;
    request.a[0] = stream;
    const uint64_t blocking = stream != 0 ? kCopyBlocking : 0;
    if (to_device) {
      std::memcpy(staging, static_cast<const char*>(plan.src.host) + done, chunk);
      request.a[1] = PlaceOf(device) | blocking;
      request.a[2] = device.server + done;
      request.a[3] = static_cast<uint64_t>(Place::kStaging);
      request.a[4] = 0;
    } else {
      request.a[1] = static_cast<uint64_t>(Place::kStaging) | blocking;
      request.a[2] = 0;
      request.a[3] = PlaceOf(device);
      request.a[4] = device.server + done;
    }
    request.a[5] = chunk;
    const ph_status_t status = Call(Op::kCopy, request);
    if (status != PH_SUCCESS) return status;
    if (!to_device) {
      std::memcpy(static_cast<char*>(plan.dst.host) + done, staging, chunk);
    }
    done += chunk;
  }
  return PH_SUCCESS;
}

// ph_launch_host_func and ph_run_host_func: validate, register, launch.
// On any error return the task has been released (hal.h).
ph_status_t Submit(const char* function, ph_stream_t handle,
                   const ph_host_task_t* host_task, bool wait) {
  if (host_task == nullptr) return NullOut(function, "task");
  const ph_host_task_t task = *host_task;
  auto release = [&task] {
    if (task.release != nullptr) task.release(task.user_data);
  };
  if (task.run == nullptr) {
    release();
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": task '" +
                    (task.name != nullptr ? task.name : "(unnamed)") +
                    "' has a NULL run function");
  }
  std::shared_ptr<ClientStream> stream;
  ph_status_t status = GetStream(function, handle, &stream);
  if (status != PH_SUCCESS) {
    const std::string message = LastErrorMessage();
    release();
    return Fail(status, message);
  }
  if (wait && CurrentStream() == stream->id()) {
    release();
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": called from work running on the "
                                        "same stream, which would wait for itself");
  }
  const uint64_t id = stream->AddTask(task);
  Message request;
  request.a[0] = stream->id();
  request.a[1] = id;
  request.a[2] = wait ? 1 : 0;  // run: the server answers once it has run
  status = Call(Op::kLaunch, request);
  if (status != PH_SUCCESS) {
    const std::string message = LastErrorMessage();
    stream->ReleaseTask(id);  // if it is still ours
    return Fail(status, message);
  }
  return PH_SUCCESS;
}

}  // namespace
}  // namespace phantom::remote

using namespace phantom::remote;  // NOLINT: this file is the C shell

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
    return DeviceCount(out_count);
  });
}

ph_status_t ph_get_device(int* out_device) {
  return Guarded("ph_get_device", [&] {
    if (out_device == nullptr) return NullOut("ph_get_device", "out_device");
    *out_device = 0;
    const ph_status_t started = Start();
    if (started != PH_SUCCESS) return started;
    *out_device = t_current_device;
    return PH_SUCCESS;
  });
}

ph_status_t ph_set_device(int device) {
  return Guarded("ph_set_device", [&] {
    const ph_status_t valid = CheckDevice(device);
    if (valid == PH_SUCCESS) t_current_device = device;
    return valid;
  });
}

ph_status_t ph_device_get_properties(int device,
                                     ph_device_properties_t* out_props) {
  return Guarded("ph_device_get_properties", [&] {
    if (out_props == nullptr) {
      return NullOut("ph_device_get_properties", "out_props");
    }
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
    ph_status_t status = CheckDevice(device);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = static_cast<uint64_t>(device);
    Message reply;
    std::string name;
    status = Call(Op::kDeviceProperties, request, &reply, &name);
    if (status != PH_SUCCESS) return status;
    ph_device_properties_t filled{};
    std::snprintf(filled.name, sizeof filled.name, "%s", name.c_str());
    filled.total_memory = reply.a[0];
    filled.multiprocessor_count = static_cast<int>(reply.a[1]);
    filled.stream_priority_low = static_cast<int>(static_cast<int64_t>(reply.a[2]));
    filled.stream_priority_high = static_cast<int>(static_cast<int64_t>(reply.a[3]));
    std::memcpy(reinterpret_cast<char*>(out_props) + sizeof(size_t),
                reinterpret_cast<const char*>(&filled) + sizeof(size_t),
                writable - sizeof(size_t));
    return PH_SUCCESS;
  });
}

ph_status_t ph_device_synchronize(int device) {
  return Guarded("ph_device_synchronize", [&] {
    const ph_status_t valid = CheckDevice(device);
    if (valid != PH_SUCCESS) return valid;
    if (CurrentStream() != 0 && CurrentStreamDevice() == device) {
      return WaitsForItself("ph_device_synchronize",
                            "a stream of the same device");
    }
    Message request;
    request.a[0] = static_cast<uint64_t>(device);
    return Call(Op::kDeviceSynchronize, request);
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
    ph_status_t status = CheckDevice(device);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = static_cast<uint64_t>(device);
    Message reply;
    status = Call(Op::kMemInfo, request, &reply);
    if (status != PH_SUCCESS) return status;
    *out_free = reply.a[0];
    *out_total = reply.a[1];
    return PH_SUCCESS;
  });
}

ph_status_t ph_malloc(int device, size_t size, void** out_ptr) {
  return Guarded("ph_malloc", [&] {
    if (out_ptr == nullptr) return NullOut("ph_malloc", "out_ptr");
    *out_ptr = nullptr;
    ph_status_t status = CheckDevice(device);
    if (status != PH_SUCCESS || size == 0) return status;
    Message request;
    request.a[0] = static_cast<uint64_t>(device);
    request.a[1] = size;
    Message reply;
    status = Call(Op::kMalloc, request, &reply);
    if (status != PH_SUCCESS) return status;
    void* ptr = DeviceAddress(device, reply.a[0]);
    AddAllocation(ptr, size, device);
    *out_ptr = ptr;
    return PH_SUCCESS;
  });
}

ph_status_t ph_free(void* ptr) {
  return Guarded("ph_free", [&] {
    if (ptr == nullptr) return PH_SUCCESS;
    const ph_status_t started = Start();
    if (started != PH_SUCCESS) return started;
    const AllocationInfo info = LookupAllocation(ptr);
    if (!info.live || info.base != reinterpret_cast<uintptr_t>(ptr)) {
      char text[200];
      std::snprintf(text, sizeof text,
                    info.device < 0
                        ? "ph_free: %p is not device memory (host memory is "
                          "freed with ph_host_free or free)"
                        : "ph_free: %p is not the start of a live device "
                          "allocation (freed twice, or inside one)",
                    ptr);
      return Fail(PH_ERROR_INVALID_HANDLE, text);
    }
    RemoveAllocation(ptr);
    const uint64_t address = ServerAddress(ptr);
    Message request;
    request.a[0] = address >> kDeviceShift;
    request.a[1] = address & kOffsetMask;
    return Call(Op::kFree, request);
  });
}

ph_status_t ph_host_malloc(size_t size, void** out_ptr) {
  return Guarded("ph_host_malloc", [&] {
    if (out_ptr == nullptr) return NullOut("ph_host_malloc", "out_ptr");
    *out_ptr = nullptr;
    const ph_status_t started = Start();
    if (started != PH_SUCCESS || size == 0) return started;
    return AllocatePinned(size, out_ptr);
  });
}

ph_status_t ph_host_free(void* ptr) {
  return Guarded("ph_host_free", [&] {
    if (ptr == nullptr) return PH_SUCCESS;
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
    const AllocationInfo device = LookupAllocation(ptr);
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

/* ---- Streams ----------------------------------------------------------- */

ph_status_t ph_stream_create(int device, int priority, ph_stream_t* out_stream) {
  return Guarded("ph_stream_create", [&] {
    if (out_stream == nullptr) return NullOut("ph_stream_create", "out_stream");
    *out_stream = nullptr;
    ph_status_t status = CheckDevice(device);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = static_cast<uint64_t>(device);
    request.a[1] = static_cast<uint64_t>(static_cast<int64_t>(priority));
    Message reply;
    status = Call(Op::kStreamCreate, request, &reply);
    if (status != PH_SUCCESS) return status;
    const uint64_t id = reply.a[0];
    auto stream = std::make_shared<ClientStream>(
        id, device, static_cast<int>(static_cast<int64_t>(reply.a[1])));
    const int fd = OpenConnection(Op::kHelloCallback, id);
    if (fd < 0) {
      const std::string message = LastErrorMessage();
      Message destroy;
      destroy.a[0] = id;
      Call(Op::kStreamDestroy, destroy);
      return Fail(Lost() ? PH_ERROR_DEVICE : PH_ERROR_NOT_INITIALIZED, message);
    }
    stream->StartCallbacks(fd);
    RegisterStream(stream);
    *out_stream = StreamHandle(id);
    return PH_SUCCESS;
  });
}

ph_status_t ph_stream_destroy(ph_stream_t handle) {
  return Guarded("ph_stream_destroy", [&] {
    std::shared_ptr<ClientStream> stream;
    const ph_status_t found = GetStream("ph_stream_destroy", handle, &stream);
    if (found != PH_SUCCESS) {
      // A lost device still frees the client's half of the stream (its
      // callback thread and the tasks it holds), then reports the loss.
      std::shared_ptr<ClientStream> orphan = FindStream(handle);
      if (orphan && found != PH_ERROR_INVALID_HANDLE) {
        UnregisterStream(orphan->id());
        orphan->StopCallbacks();
      }
      return found;
    }
    if (CurrentStream() == stream->id()) {
      return WaitsForItself("ph_stream_destroy", "that stream");
    }
    Message request;
    request.a[0] = stream->id();
    stream->SetDestroying(true);
    const ph_status_t status = Call(Op::kStreamDestroy, request);
    if (status == PH_ERROR_INVALID_HANDLE) {
      stream->SetDestroying(false);
      return InvalidStream("ph_stream_destroy", handle);  // raced another
    }
    const std::string message = LastErrorMessage();
    UnregisterStream(stream->id());
    stream->StopCallbacks();
    return status == PH_SUCCESS ? status : Fail(status, message);
  });
}

ph_status_t ph_stream_query(ph_stream_t handle) {
  return Guarded("ph_stream_query", [&] {
    std::shared_ptr<ClientStream> stream;
    const ph_status_t found = GetStream("ph_stream_query", handle, &stream);
    if (found != PH_SUCCESS) return found;
    Message request;
    request.a[0] = stream->id();
    return Named("ph_stream_query", Call(Op::kStreamQuery, request));
  });
}

ph_status_t ph_stream_synchronize(ph_stream_t handle) {
  return Guarded("ph_stream_synchronize", [&] {
    std::shared_ptr<ClientStream> stream;
    const ph_status_t found =
        GetStream("ph_stream_synchronize", handle, &stream);
    if (found != PH_SUCCESS) return found;
    if (CurrentStream() == stream->id()) {
      return WaitsForItself("ph_stream_synchronize", "that stream");
    }
    Message request;
    request.a[0] = stream->id();
    return Named("ph_stream_synchronize", Call(Op::kStreamSynchronize, request));
  });
}

ph_status_t ph_stream_get_device(ph_stream_t handle, int* out_device) {
  return Guarded("ph_stream_get_device", [&] {
    if (out_device == nullptr) return NullOut("ph_stream_get_device", "out_device");
    *out_device = 0;
    std::shared_ptr<ClientStream> stream;
    const ph_status_t found = GetStream("ph_stream_get_device", handle, &stream);
    if (found == PH_SUCCESS) *out_device = stream->device();
    return found;
  });
}

ph_status_t ph_stream_get_priority(ph_stream_t handle, int* out_priority) {
  return Guarded("ph_stream_get_priority", [&] {
    if (out_priority == nullptr) {
      return NullOut("ph_stream_get_priority", "out_priority");
    }
    *out_priority = 0;
    std::shared_ptr<ClientStream> stream;
    const ph_status_t found =
        GetStream("ph_stream_get_priority", handle, &stream);
    if (found == PH_SUCCESS) *out_priority = stream->priority();
    return found;
  });
}

ph_status_t ph_stream_wait_event(ph_stream_t stream_handle,
                                 ph_event_t event_handle) {
  return Guarded("ph_stream_wait_event", [&] {
    std::shared_ptr<ClientStream> stream;
    ph_status_t status = GetStream("ph_stream_wait_event", stream_handle, &stream);
    if (status != PH_SUCCESS) return status;
    uint64_t event = 0;
    status = GetEvent("ph_stream_wait_event", event_handle, &event);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = stream->id();
    request.a[1] = event;
    return Named("ph_stream_wait_event", Call(Op::kStreamWaitEvent, request));
  });
}

ph_status_t ph_launch_host_func(ph_stream_t handle, const ph_host_task_t* task) {
  return Guarded("ph_launch_host_func", [&] {
    return Submit("ph_launch_host_func", handle, task, false);
  });
}

ph_status_t ph_run_host_func(ph_stream_t handle, const ph_host_task_t* task) {
  return Guarded("ph_run_host_func", [&] {
    return Submit("ph_run_host_func", handle, task, true);
  });
}

/* ---- Copies ------------------------------------------------------------ */

ph_status_t ph_memcpy(void* dst, const void* src, size_t size,
                      ph_memcpy_kind_t kind) {
  return Guarded("ph_memcpy", [&] {
    const ph_status_t started = Start();
    if (started != PH_SUCCESS) return started;
    if (size == 0) return PH_SUCCESS;
    CopyPlan plan;
    const ph_status_t planned = PlanCopy("ph_memcpy", dst, src, size, kind, &plan);
    if (planned != PH_SUCCESS) return planned;
    if (!plan.dst.device && !plan.src.device) {
      std::memmove(dst, src, size);
      return PH_SUCCESS;
    }
    return plan.pageable ? StagedCopy(0, plan) : DirectCopy(0, plan);
  });
}

ph_status_t ph_memcpy_async(void* dst, const void* src, size_t size,
                            ph_memcpy_kind_t kind, ph_stream_t handle) {
  return Guarded("ph_memcpy_async", [&] {
    std::shared_ptr<ClientStream> stream;
    ph_status_t status = GetStream("ph_memcpy_async", handle, &stream);
    if (status != PH_SUCCESS) return status;
    if (size == 0) return StickyOf(*stream);
    CopyPlan plan;
    status = PlanCopy("ph_memcpy_async", dst, src, size, kind, &plan);
    if (status != PH_SUCCESS) return status;
    if (plan.pageable && CurrentStream() == stream->id()) {
      return WaitsForItself("ph_memcpy_async with pageable host memory",
                            "the stream it copies on");
    }
    if (!plan.dst.device && !plan.src.device) {
      if (!plan.pageable) return DirectCopy(stream->id(), plan);
      // Host to host with pageable memory: wait for the stream, then copy.
      Message request;
      request.a[0] = stream->id();
      status = Call(Op::kBarrier, request);
      if (status == PH_SUCCESS) std::memmove(dst, src, size);
      return status;
    }
    return plan.pageable ? StagedCopy(stream->id(), plan)
                         : DirectCopy(stream->id(), plan);
  });
}

ph_status_t ph_memset_async(void* dst, int value, size_t size,
                            ph_stream_t handle) {
  return Guarded("ph_memset_async", [&] {
    std::shared_ptr<ClientStream> stream;
    ph_status_t status = GetStream("ph_memset_async", handle, &stream);
    if (status != PH_SUCCESS) return status;
    if (size == 0) return StickyOf(*stream);
    uint64_t address = 0;
    status = PlanFill("ph_memset_async", dst, size, &address);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = stream->id();
    request.a[1] = address >> kDeviceShift;
    request.a[2] = address & kOffsetMask;
    request.a[3] = static_cast<uint64_t>(value & 0xff);
    request.a[4] = size;
    return Call(Op::kMemset, request);
  });
}

/* ---- Events ------------------------------------------------------------ */

ph_status_t ph_event_create(unsigned flags, ph_event_t* out_event) {
  return Guarded("ph_event_create", [&] {
    if (out_event == nullptr) return NullOut("ph_event_create", "out_event");
    *out_event = nullptr;
    ph_status_t status = Start();
    if (status != PH_SUCCESS) return status;
    if ((flags & ~unsigned{PH_EVENT_DISABLE_TIMING | PH_EVENT_INTERPROCESS}) != 0) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "ph_event_create: unknown flags 0x%x (use "
                    "PH_EVENT_DEFAULT or PH_EVENT_DISABLE_TIMING)",
                    flags);
      return Fail(PH_ERROR_INVALID_ARGUMENT, text);
    }
    if ((flags & PH_EVENT_INTERPROCESS) != 0) {
      return Fail(PH_ERROR_UNIMPLEMENTED,
                  "ph_event_create: this driver cannot share device memory "
                  "or events with other processes (PH_EVENT_INTERPROCESS; the "
                  "phantom remote driver offers no ph_ipc_* calls)");
    }
    Message request;
    request.a[0] = flags;
    Message reply;
    status = Call(Op::kEventCreate, request, &reply);
    if (status == PH_SUCCESS) *out_event = EventHandle(reply.a[0]);
    return status;
  });
}

ph_status_t ph_event_destroy(ph_event_t handle) {
  return Guarded("ph_event_destroy", [&] {
    uint64_t event = 0;
    const ph_status_t status = GetEvent("ph_event_destroy", handle, &event);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = event;
    return Named("ph_event_destroy", Call(Op::kEventDestroy, request));
  });
}

ph_status_t ph_event_record(ph_event_t event_handle, ph_stream_t stream_handle) {
  return Guarded("ph_event_record", [&] {
    uint64_t event = 0;
    ph_status_t status = GetEvent("ph_event_record", event_handle, &event);
    if (status != PH_SUCCESS) return status;
    std::shared_ptr<ClientStream> stream;
    status = GetStream("ph_event_record", stream_handle, &stream);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = event;
    request.a[1] = stream->id();
    return Named("ph_event_record", Call(Op::kEventRecord, request));
  });
}

ph_status_t ph_event_query(ph_event_t handle) {
  return Guarded("ph_event_query", [&] {
    uint64_t event = 0;
    const ph_status_t status = GetEvent("ph_event_query", handle, &event);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = event;
    return Named("ph_event_query", Call(Op::kEventQuery, request));
  });
}

ph_status_t ph_event_synchronize(ph_event_t handle) {
  return Guarded("ph_event_synchronize", [&] {
    uint64_t event = 0;
    const ph_status_t status = GetEvent("ph_event_synchronize", handle, &event);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = event;
    return Named("ph_event_synchronize", Call(Op::kEventSynchronize, request));
  });
}

ph_status_t ph_event_elapsed_time(ph_event_t start_handle, ph_event_t end_handle,
                                  float* out_ms) {
  return Guarded("ph_event_elapsed_time", [&] {
    if (out_ms == nullptr) return NullOut("ph_event_elapsed_time", "out_ms");
    *out_ms = 0.0f;
    uint64_t start = 0;
    uint64_t end = 0;
    ph_status_t status = GetEvent("ph_event_elapsed_time", start_handle, &start);
    if (status != PH_SUCCESS) return status;
    status = GetEvent("ph_event_elapsed_time", end_handle, &end);
    if (status != PH_SUCCESS) return status;
    Message request;
    request.a[0] = start;
    request.a[1] = end;
    Message reply;
    status = Named("ph_event_elapsed_time",
                   Call(Op::kEventElapsed, request, &reply));
    if (status != PH_SUCCESS) return status;
    const uint32_t bits = static_cast<uint32_t>(reply.a[0]);
    std::memcpy(out_ms, &bits, sizeof bits);
    return PH_SUCCESS;
  });
}

}  // extern "C"
