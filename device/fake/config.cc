// Environment parsing; see config.h for the accepted syntax and why the
// environment is read exactly once.
#include "config.h"

#include <cctype>
#include <cstdlib>
#include <mutex>

namespace phantom::fake {
namespace {

// Parses a non-empty run of decimal digits into *out, refusing overflow.
// Returns the number of characters consumed (0 if none or overflow).
size_t ParseDigits(const char* text, size_t* out) {
  size_t value = 0;
  size_t i = 0;
  for (; std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const size_t digit = static_cast<size_t>(text[i] - '0');
    if (value > (SIZE_MAX - digit) / 10) return 0;
    value = value * 10 + digit;
  }
  *out = value;
  return i;
}

bool EqualsIgnoringCase(const char* a, const char* b) {
  for (; *a && *b; ++a, ++b) {
    if (std::tolower(static_cast<unsigned char>(*a)) !=
        std::tolower(static_cast<unsigned char>(*b))) {
      return false;
    }
  }
  return *a == *b;
}

}  // namespace

bool ParseDeviceCount(const char* text, int* out_count, std::string* error) {
  size_t value = 0;
  const size_t used = ParseDigits(text, &value);
  if (used == 0 || text[used] != '\0' || value > kMaxDevices) {
    *error = std::string("PHANTOM_DEVICE_COUNT='") + text +
             "' is not a whole number from 0 to 64; unset it or set e.g. "
             "PHANTOM_DEVICE_COUNT=2";
    return false;
  }
  *out_count = static_cast<int>(value);
  return true;
}

bool ParseDeviceMemory(const char* text, size_t* out_bytes,
                       std::string* error) {
  auto refuse = [&] {
    *error = std::string("PHANTOM_DEVICE_MEMORY='") + text +
             "' is not a size from 1MiB to 1TiB (bytes, or a number with a "
             "K/M/G/T suffix); unset it or set e.g. PHANTOM_DEVICE_MEMORY=8GiB";
    return false;
  };
  size_t number = 0;
  const size_t used = ParseDigits(text, &number);
  if (used == 0) return refuse();
  const char* suffix = text + used;
  int shift = 0;
  if (*suffix != '\0') {
    switch (std::toupper(static_cast<unsigned char>(*suffix))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return refuse();
    }
    const char* rest = suffix + 1;
    if (*rest != '\0' && !EqualsIgnoringCase(rest, "iB") &&
        !EqualsIgnoringCase(rest, "B")) {
      return refuse();
    }
  }
  if (shift > 0 && number > (SIZE_MAX >> shift)) return refuse();
  const size_t bytes = number << shift;
  if (bytes < kMinDeviceMemory || bytes > kMaxDeviceMemory) return refuse();
  *out_bytes = bytes;
  return true;
}

Config MakeConfig(const char* device_count, const char* device_memory,
                  const char* no_ipc) {
  Config config;
  config.device_count = kDefaultDeviceCount;
  config.device_memory = kDefaultDeviceMemory;
  if (device_count != nullptr && *device_count != '\0' &&
      !ParseDeviceCount(device_count, &config.device_count, &config.error)) {
    config.device_count = 0;
    return config;
  }
  if (device_memory != nullptr && *device_memory != '\0' &&
      !ParseDeviceMemory(device_memory, &config.device_memory,
                         &config.error)) {
    config.device_count = 0;
    return config;
  }
  if (no_ipc != nullptr && *no_ipc != '\0') {
    const std::string value = no_ipc;
    if (value != "0" && value != "1") {
      config.error = "PHANTOM_FAKE_NO_IPC='" + value +
                     "' is not 0 or 1; unset it (it is a test-only switch: "
                     "1 makes the fake refuse interprocess sharing)";
      config.device_count = 0;
      return config;
    }
    config.ipc = value == "0";
  }
  config.ok = true;
  return config;
}

const Config& GetConfig() {
  // Leaked on purpose: worker threads may still consult it during exit.
  // A function-local static (one inline guard check per call) rather than
  // std::call_once, whose thread-local set-up runs on every call: this is
  // on the path of every driver call.
  static const Config* const config =
      new Config(MakeConfig(std::getenv("PHANTOM_DEVICE_COUNT"),
                            std::getenv("PHANTOM_DEVICE_MEMORY"),
                            std::getenv("PHANTOM_FAKE_NO_IPC")));
  return *config;
}

}  // namespace phantom::fake
