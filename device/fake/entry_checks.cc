// See entry_checks.h.
#include "entry_checks.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "config.h"
#include "errors.h"

namespace phantom::fake {

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

ph_status_t InvalidHandle(const char* function, const char* what,
                          const void* handle) {
  const bool vowel = std::strchr("aeiou", what[0]) != nullptr;
  char text[200];
  std::snprintf(text, sizeof text, "%s: %s handle %p is null, destroyed or not %s %s",
                function, what, handle, vowel ? "an" : "a", what);
  return Fail(PH_ERROR_INVALID_HANDLE, text);
}

ph_status_t GetStream(const char* function, ph_stream_t handle,
                      std::shared_ptr<Stream>* out) {
  const ph_status_t started = CheckStarted();
  if (started != PH_SUCCESS) return started;
  *out = FindStream(handle);
  return *out ? PH_SUCCESS : InvalidHandle(function, "stream", handle);
}

ph_status_t GetEvent(const char* function, ph_event_t handle,
                     std::shared_ptr<Event>* out) {
  const ph_status_t started = CheckStarted();
  if (started != PH_SUCCESS) return started;
  *out = FindEvent(handle);
  return *out ? PH_SUCCESS : InvalidHandle(function, "event", handle);
}

ph_status_t WaitsForItself(const char* function, const char* what) {
  return Fail(PH_ERROR_INVALID_ARGUMENT,
              std::string(function) + " was called from work running on " +
                  what + ", which would wait for itself forever");
}

}  // namespace phantom::fake
