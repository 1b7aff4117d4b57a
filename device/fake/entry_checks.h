// The checks every C entry point of the fake driver starts with
// (hal_entry.cc, stream_entry.cc, event_entry.cc, graph_entry.cc,
// activity_entry.cc): the driver started, a device index in range, an out
// parameter given, a handle that names a live stream or event. Each
// failure returns through Fail() (errors.h), so the thread's last-error
// message says what was wrong.
#pragma once

#include <memory>

#include "event.h"
#include "phantom/hal.h"
#include "stream.h"

namespace phantom::fake {

// PH_SUCCESS if the configuration is valid, else PH_ERROR_NOT_INITIALIZED
// with the configuration's sentence.
ph_status_t CheckStarted();

// CheckStarted, then PH_ERROR_INVALID_DEVICE unless 0 <= device < count.
ph_status_t CheckDevice(int device);

// PH_ERROR_INVALID_ARGUMENT: `parameter` of `function` is NULL.
ph_status_t NullOut(const char* function, const char* parameter);

// PH_ERROR_INVALID_HANDLE: `handle`, given to `function`, is null,
// destroyed or not a `what` ("stream", "event", "graph", ...).
ph_status_t InvalidHandle(const char* function, const char* what,
                          const void* handle);

// Finds a live stream or event (after CheckStarted), or fails with
// PH_ERROR_INVALID_HANDLE.
ph_status_t GetStream(const char* function, ph_stream_t handle,
                      std::shared_ptr<Stream>* out);
ph_status_t GetEvent(const char* function, ph_event_t handle,
                     std::shared_ptr<Event>* out);

// PH_ERROR_INVALID_ARGUMENT: `function` was called from work running on
// `what` ("that stream", ...), which would wait for itself forever.
ph_status_t WaitsForItself(const char* function, const char* what);

}  // namespace phantom::fake
