// The C entry points of hal.h's "Activity trace" section
// (phantom/hal_activity.h) for the fake driver: thin shells over
// activity_trace.h.
#include <string>

#include "activity.h"
#include "activity_trace.h"
#include "config.h"
#include "entry_checks.h"
#include "errors.h"
#include "phantom/hal.h"

using namespace phantom::fake;  // NOLINT: this file is a C shell

extern "C" {

ph_status_t ph_activity_enable(void) {
  return Guarded("ph_activity_enable", [&] {
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    return trace::Enable();
  });
}

ph_status_t ph_activity_disable(void) {
  return Guarded("ph_activity_disable", [&] { return trace::Disable(); });
}

ph_status_t ph_activity_get_timestamp(uint64_t* out_ns) {
  return Guarded("ph_activity_get_timestamp", [&] {
    if (!trace::kBuiltIn) return trace::NotBuiltIn("ph_activity_get_timestamp");
    if (out_ns == nullptr) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_activity_get_timestamp: out_ns is NULL");
    }
    *out_ns = NowNs();
    return PH_SUCCESS;
  });
}

ph_status_t ph_activity_push_correlation(uint64_t id) {
  return Guarded("ph_activity_push_correlation",
                 [&] { return trace::PushCorrelation(id); });
}

ph_status_t ph_activity_pop_correlation(void) {
  return Guarded("ph_activity_pop_correlation",
                 [&] { return trace::PopCorrelation(); });
}

ph_status_t ph_activity_flush(void* records, size_t record_size,
                              size_t capacity, size_t* out_count,
                              uint64_t* out_dropped) {
  if (out_count != nullptr) *out_count = 0;
  if (out_dropped != nullptr) *out_dropped = 0;
  return Guarded("ph_activity_flush", [&] {
    return trace::Flush(records, record_size, capacity, out_count,
                        out_dropped);
  });
}

}  // extern "C"
