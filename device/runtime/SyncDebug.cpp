// See phantom/SyncDebug.h.
#include <phantom/SyncDebug.h>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <string>

namespace phantom {
namespace detail {

std::atomic<int> sync_debug_mode{0};

void reportHostWait(const char* what, const char* why) {
  const int mode = sync_debug_mode.load(std::memory_order_relaxed);
  const std::string reason =
      why != nullptr ? std::string(": ") + why : std::string();
  if (mode == static_cast<int>(SyncDebugMode::kError)) {
    TORCH_CHECK(false, c10::get_privateuse1_backend(), ": ", what,
                " would make the host wait for the device", reason, ". torch.",
                c10::get_privateuse1_backend(),
                ".set_sync_debug_mode(\"error\") forbids "
                "that: keep the value on the device or read it less often, "
                "or set_sync_debug_mode(\"default\") to allow waiting");
  }
  if (mode == static_cast<int>(SyncDebugMode::kWarn)) {
    TORCH_WARN(c10::get_privateuse1_backend(), ": ", what,
               " made the host wait for the device", reason,
               ". (Reported because torch.", c10::get_privateuse1_backend(),
               ".set_sync_debug_mode is \"warn\".)");
  }
}

}  // namespace detail

void setSyncDebugMode(SyncDebugMode mode) {
  const int value = static_cast<int>(mode);
  TORCH_CHECK_VALUE(value >= 0 && value <= 2, "invalid sync debug mode ",
                    value,
                    "; expected 0 (\"default\"), 1 (\"warn\") or 2 (\"error\")");
  detail::sync_debug_mode.store(value, std::memory_order_relaxed);
}

SyncDebugMode syncDebugMode() noexcept {
  return static_cast<SyncDebugMode>(
      detail::sync_debug_mode.load(std::memory_order_relaxed));
}

}  // namespace phantom
