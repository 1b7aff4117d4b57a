// Configuration of the fake driver, read from the environment.
//
// The environment is read once per process, at the first HAL call that needs
// it, and never again: a device count that changed halfway through a process
// would invalidate every handle above the HAL. An invalid value does not
// abort and is not silently replaced by a default: the driver refuses to
// start, every call returns PH_ERROR_NOT_INITIALIZED, and the message
// (ph_last_error_message) is the settings parser's sentence, naming the
// variable, its value, what is accepted and the default.
//
// Variables (phantom/common/settings.h describes them and the rules every
// PHANTOM_* value follows; the README lists them all):
//   PHANTOM_DEVICE_COUNT   whole number 0..64, default 2.
//   PHANTOM_DEVICE_MEMORY  bytes per device, 1 MiB..1 TiB, default 8 GiB.
//   PHANTOM_FAKE_NO_IPC    test-only: 1 makes the fake answer
//                          PH_ERROR_UNIMPLEMENTED to every interprocess
//                          sharing call, as a driver without that
//                          capability does; 0 or unset: sharing works.
//   PHANTOM_FAKE_NO_KERNEL_VIEW  test-only: 1 makes the driver table
//                          (driver_table.cc) leave ph_kernel_address NULL,
//                          as the driver of a discrete device does: the
//                          runtime then has no kernel view and ops take
//                          the copying CPU fallback. The exported
//                          ph_kernel_address itself is unchanged.
#ifndef PHANTOM_FAKE_CONFIG_H_
#define PHANTOM_FAKE_CONFIG_H_

#include <phantom/common/settings.h>

#include <cstddef>
#include <string>

namespace phantom::fake {

// The most devices PHANTOM_DEVICE_COUNT may ask for (fixed-size tables).
constexpr int kMaxDevices = static_cast<int>(settings::kDeviceCount.max);

struct Config {
  bool ok = false;        // false: the driver refuses to start
  std::string error;      // why, when !ok
  int device_count = 0;
  size_t device_memory = 0;  // capacity of each device in bytes
  bool ipc = true;  // interprocess sharing offered (PHANTOM_FAKE_NO_IPC)
  // ph_kernel_address in the table (PHANTOM_FAKE_NO_KERNEL_VIEW)
  bool kernel_view = true;
};

// The process's configuration, parsed from the environment at first call.
const Config& GetConfig();

// Builds a Config from explicit values (null = unset), as GetConfig() does
// from the environment; exposed for the fake's own tests.
Config MakeConfig(const char* device_count, const char* device_memory,
                  const char* no_ipc = nullptr,
                  const char* no_kernel_view = nullptr);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_CONFIG_H_
