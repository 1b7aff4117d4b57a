// Thread-local last-error storage; see errors.h for the design.
#include "errors.h"

#include <cstdio>
#include <utility>

namespace phantom::fake {
namespace {
thread_local std::string t_last_error;
}  // namespace

ph_status_t Fail(ph_status_t status, std::string message) {
  try {
    t_last_error = std::move(message);
  } catch (...) {
    // Keeping the status is more important than keeping the sentence.
  }
  return status;
}

const char* LastErrorMessage() { return t_last_error.c_str(); }

std::string FormatBytes(size_t bytes) {
  static const char* const kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0) {
    std::snprintf(buffer, sizeof buffer, "%zu bytes", bytes);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.2f %s", value, kUnits[unit]);
  }
  return buffer;
}

}  // namespace phantom::fake
