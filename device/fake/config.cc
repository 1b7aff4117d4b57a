// Environment parsing; see config.h for why the environment is read exactly
// once, and phantom/common/settings.h for the syntax.
#include "config.h"

#include <cstdlib>

namespace phantom::fake {

Config MakeConfig(const char* device_count, const char* device_memory,
                  const char* no_ipc, const char* no_kernel_view) {
  Config config;
  settings::Value count;
  settings::Value memory;
  settings::Value no_ipc_switch;
  settings::Value no_kernel_view_switch;
  if (!settings::Parse(settings::kDeviceCount, device_count, &count,
                       &config.error) ||
      !settings::Parse(settings::kDeviceMemory, device_memory, &memory,
                       &config.error) ||
      !settings::Parse(settings::kFakeNoIpc, no_ipc, &no_ipc_switch,
                       &config.error) ||
      !settings::Parse(settings::kFakeNoKernelView, no_kernel_view,
                       &no_kernel_view_switch, &config.error)) {
    return config;  // device_count stays 0
  }
  config.device_count = static_cast<int>(count.number);
  config.device_memory = static_cast<size_t>(memory.number);
  config.ipc = no_ipc_switch.number == 0;
  config.kernel_view = no_kernel_view_switch.number == 0;
  config.ok = true;
  return config;
}

const Config& GetConfig() {
  // Leaked on purpose: worker threads may still consult it during exit.
  // A function-local static (one inline guard check per call) rather than
  // std::call_once, whose thread-local set-up runs on every call: this is
  // on the path of every driver call.
  static const Config* const config = new Config(
      MakeConfig(std::getenv(settings::kDeviceCount.name),
                 std::getenv(settings::kDeviceMemory.name),
                 std::getenv(settings::kFakeNoIpc.name),
                 std::getenv(settings::kFakeNoKernelView.name)));
  return *config;
}

}  // namespace phantom::fake
