// The C entry points of phantom/hal.h for the fake driver: status, devices
// and memory (streams, host work and copies are in stream_entry.cc, events
// in event_entry.cc, graphs in graph_entry.cc, IPC in ipc_entry.cc, the
// activity trace in activity_entry.cc).
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
#include "entry_checks.h"
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
                       ? static_cast<uint32_t>(PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION)
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

}  // extern "C"
