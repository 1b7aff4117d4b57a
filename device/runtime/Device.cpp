// See phantom/Device.h.
#include <phantom/Device.h>
#include <phantom/Exception.h>
#include <phantom/Settings.h>

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <mutex>

namespace phantom {
namespace {

// Set, in the child, by the pthread_atfork handler that the first real use
// of the runtime registers (see Device.h). A plain bool: the child is single
// threaded when the handler runs, and the flag never changes afterwards.
bool in_bad_fork = false;

void markChildAsBadFork() {
  in_bad_fork = true;
}

// Registers the fork handler once, on the first use of the device (not at
// import or for device_count(), so a process may still fork before it uses
// phantom and use it in the children, as with CUDA).
void registerForkHandlerOnce() {
  static const bool registered = [] {
    return pthread_atfork(nullptr, nullptr, &markChildAsBadFork) == 0;
  }();
  (void)registered;
}

struct DriverInfo {
  c10::DeviceIndex count = 0;
  std::string error;
  // False when the driver did not start, has no device, or a setting the
  // runtime reads is malformed (phantom/Settings.h): one flag keeps the
  // check on every device call a single branch.
  bool usable = false;
};

const DriverInfo& driverInfo() noexcept {
  static const DriverInfo info = [] {
    DriverInfo result;
    // A driver that could not be loaded, or of another ABI major, is
    // refused here with the loader's sentence (DriverLoader.cpp).
    int count = 0;
    const ph_status_t status = ph_device_count(&count);
    if (status != PH_SUCCESS) {
      result.error = ph_last_error_message();
      if (result.error.empty()) {
        result.error = ph_status_name(status);
      }
      return result;
    }
    result.count = static_cast<c10::DeviceIndex>(count);
    result.usable = count > 0 && runtimeSettingsError().empty();
    return result;
  }();
  return info;
}

}  // namespace

c10::DeviceIndex deviceCountNoThrow() noexcept {
  return driverInfo().count;
}

const std::string& driverStartupError() noexcept {
  return driverInfo().error;
}

bool inBadFork() noexcept {
  return in_bad_fork;
}

void throwBadFork() {
  const std::string name = c10::get_privateuse1_backend();
  TORCH_CHECK(false, "cannot use the ", name,
              " device in a forked child process: the parent had initialised "
              "it, and the device's worker threads do not exist in the child "
              "(cannot re-initialize ", name,
              " in forked subprocess). Use the 'spawn' or 'forkserver' start "
              "method (torch.multiprocessing.set_start_method('spawn')), or do "
              "not touch ", name,
              " in the child (e.g. DataLoader workers should load CPU tensors; "
              "move them to ", name, " in the main process)");
}

c10::DeviceIndex deviceCountOrThrow() {
  if (C10_UNLIKELY(in_bad_fork)) {
    throwBadFork();
  }
  const DriverInfo& info = driverInfo();
  if (C10_UNLIKELY(!info.usable)) {
    // A malformed runtime setting (PHANTOM_DRIVER among them, which also
    // leaves no driver) is a c10::ValueError naming the setting.
    checkRuntimeSettings();
    throw c10::AcceleratorError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        PH_ERROR_NOT_INITIALIZED,
        info.error.empty()
            ? "no " + c10::get_privateuse1_backend() +
                  " devices: the driver reports no devices"
            : "phantom driver failed to start: " + info.error);
  }
  registerForkHandlerOnce();
  return info.count;
}

void checkDeviceIndex(c10::DeviceIndex index) {
  const c10::DeviceIndex count = deviceCountOrThrow();
  if (C10_LIKELY(index >= 0 && index < count)) return;
  const std::string name = c10::get_privateuse1_backend();
  TORCH_CHECK(false, name, " device index ", static_cast<int>(index),
              " is out of range: there ",
              count == 1 ? "is 1 " + name + " device"
                         : "are " + std::to_string(count) + " " + name +
                               " devices",
              " (valid indices 0..", count - 1, ")");
}

c10::DeviceIndex currentDevice() {
  deviceCountOrThrow();
  int device = 0;
  PHANTOM_CHECK(ph_get_device(&device));
  return static_cast<c10::DeviceIndex>(device);
}

void setCurrentDevice(c10::DeviceIndex index) {
  checkDeviceIndex(index);
  PHANTOM_CHECK(ph_set_device(index));
}

c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) {
  const c10::DeviceIndex previous = currentDevice();
  if (previous != index) {
    setCurrentDevice(index);
  }
  return previous;
}

}  // namespace phantom
