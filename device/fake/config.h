// Configuration of the fake driver, read from the environment.
//
// The environment is read once per process, at the first HAL call that needs
// it (std::call_once, so concurrent first calls are safe), and never again:
// a device count that changed halfway through a process would invalidate
// every handle above the HAL. An invalid value does not abort and is not
// silently replaced by a default: the driver refuses to start, every call
// returns PH_ERROR_NOT_INITIALIZED, and the message names the variable, its
// value, what is accepted and how to fix it.
//
// Variables (an empty value counts as unset):
//   PHANTOM_DEVICE_COUNT   whole number 0..64, default 2.
//   PHANTOM_DEVICE_MEMORY  bytes per device, 1 MiB..1 TiB, default 8 GiB.
//                          Plain bytes ("1048576") or a binary suffix K, M,
//                          G or T, optionally followed by "iB" or "B", any
//                          case ("512MiB", "4G", "2gb"). Suffixes are powers
//                          of 1024 whatever the spelling.
//   PHANTOM_FAKE_NO_IPC    test-only: 1 makes the fake answer
//                          PH_ERROR_UNIMPLEMENTED to every interprocess
//                          sharing call, as a driver without that
//                          capability does; 0 or unset: sharing works.
//
// The parse functions are exposed (to the fake's own tests, not above the
// HAL) so every accepted and refused spelling is unit-tested without
// starting a process per case.
#ifndef PHANTOM_FAKE_CONFIG_H_
#define PHANTOM_FAKE_CONFIG_H_

#include <cstddef>
#include <string>

namespace phantom::fake {

constexpr int kMaxDevices = 64;                     // PHANTOM_DEVICE_COUNT max
constexpr int kDefaultDeviceCount = 2;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kTiB = size_t{1} << 40;
constexpr size_t kMinDeviceMemory = kMiB;           // smallest capacity
constexpr size_t kMaxDeviceMemory = kTiB;           // largest capacity
constexpr size_t kDefaultDeviceMemory = 8 * kGiB;

struct Config {
  bool ok = false;        // false: the driver refuses to start
  std::string error;      // why, when !ok
  int device_count = 0;
  size_t device_memory = 0;  // capacity of each device in bytes
  bool ipc = true;  // interprocess sharing offered (PHANTOM_FAKE_NO_IPC)
};

// The process's configuration, parsed from the environment at first call.
const Config& GetConfig();

// Parses a PHANTOM_DEVICE_COUNT value. On failure returns false and sets
// *error to a sentence naming the value. `text` must not be null.
bool ParseDeviceCount(const char* text, int* out_count, std::string* error);

// Parses a PHANTOM_DEVICE_MEMORY value; same conventions.
bool ParseDeviceMemory(const char* text, size_t* out_bytes, std::string* error);

// Builds a Config from explicit values (null = unset), as GetConfig() does
// from the environment.
Config MakeConfig(const char* device_count, const char* device_memory,
                  const char* no_ipc = nullptr);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_CONFIG_H_
