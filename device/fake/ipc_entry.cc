// The C entry points of hal.h's "Interprocess sharing" section for the fake
// driver: thin shells, as in hal_entry.cc (clear the out parameters, check
// the driver started and offers sharing, validate, delegate to ipc.h).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "config.h"
#include "entry_checks.h"
#include "errors.h"
#include "event.h"
#include "ipc.h"
#include "phantom/hal.h"

namespace phantom::fake {
namespace {

// The driver started (valid configuration) and offers sharing.
ph_status_t CheckSharing(const char* function) {
  const ph_status_t started = CheckStarted();
  if (started != PH_SUCCESS) return started;
  return CheckIpcOffered(function);
}

}  // namespace
}  // namespace phantom::fake

using namespace phantom::fake;  // NOLINT: this file is the C shell

extern "C" {

ph_status_t ph_ipc_get_mem_handle(const void* device_ptr,
                                  ph_ipc_mem_handle_t* out_handle) {
  return Guarded("ph_ipc_get_mem_handle", [&] {
    if (out_handle == nullptr) {
      return NullOut("ph_ipc_get_mem_handle", "out_handle");
    }
    std::memset(out_handle, 0, sizeof *out_handle);
    const ph_status_t status = CheckSharing("ph_ipc_get_mem_handle");
    if (status != PH_SUCCESS) return status;
    return ExportMemory(device_ptr, out_handle);
  });
}

ph_status_t ph_ipc_open_mem_handle(const ph_ipc_mem_handle_t* handle,
                                   void** out_ptr) {
  return Guarded("ph_ipc_open_mem_handle", [&] {
    if (out_ptr == nullptr) return NullOut("ph_ipc_open_mem_handle", "out_ptr");
    *out_ptr = nullptr;
    if (handle == nullptr) return NullOut("ph_ipc_open_mem_handle", "handle");
    const ph_status_t status = CheckSharing("ph_ipc_open_mem_handle");
    if (status != PH_SUCCESS) return status;
    return OpenMemory(*handle, out_ptr);
  });
}

ph_status_t ph_ipc_close_mem_handle(void* device_ptr) {
  return Guarded("ph_ipc_close_mem_handle", [&] {
    const ph_status_t status = CheckSharing("ph_ipc_close_mem_handle");
    if (status != PH_SUCCESS) return status;
    return CloseMemory(device_ptr);
  });
}

ph_status_t ph_ipc_get_event_handle(ph_event_t event_handle,
                                    ph_ipc_event_handle_t* out_handle) {
  return Guarded("ph_ipc_get_event_handle", [&] {
    if (out_handle == nullptr) {
      return NullOut("ph_ipc_get_event_handle", "out_handle");
    }
    std::memset(out_handle, 0, sizeof *out_handle);
    const ph_status_t status = CheckSharing("ph_ipc_get_event_handle");
    if (status != PH_SUCCESS) return status;
    std::shared_ptr<Event> event = FindEvent(event_handle);
    if (!event) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "ph_ipc_get_event_handle: event handle %p is null, "
                    "destroyed or not an event",
                    static_cast<void*>(event_handle));
      return Fail(PH_ERROR_INVALID_HANDLE, text);
    }
    if (!event->shared) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_ipc_get_event_handle: the event was not created with "
                  "PH_EVENT_INTERPROCESS, so it cannot be shared");
    }
    event->shared->Handle(out_handle);
    return PH_SUCCESS;
  });
}

ph_status_t ph_ipc_open_event_handle(const ph_ipc_event_handle_t* handle,
                                     ph_event_t* out_event) {
  return Guarded("ph_ipc_open_event_handle", [&] {
    if (out_event == nullptr) {
      return NullOut("ph_ipc_open_event_handle", "out_event");
    }
    *out_event = nullptr;
    if (handle == nullptr) return NullOut("ph_ipc_open_event_handle", "handle");
    ph_status_t status = CheckSharing("ph_ipc_open_event_handle");
    if (status != PH_SUCCESS) return status;
    auto event = std::make_shared<Event>(PH_EVENT_INTERPROCESS |
                                         PH_EVENT_DISABLE_TIMING);
    status = SharedEvent::Open(*handle, &event->shared);
    if (status != PH_SUCCESS) return status;
    *out_event = RegisterEvent(std::move(event));
    return PH_SUCCESS;
  });
}

}  // extern "C"
