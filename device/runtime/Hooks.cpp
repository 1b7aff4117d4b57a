// PrivateUse1 hooks: how ATen's device-generic code reaches phantom
// (availability, device selection, generators, pinned memory, pointers).
// Registered, together with the backend's name, when the library loads, so
// a plain C++ program that links libphantom gets a working device.
#include <phantom/Device.h>
#include <phantom/Generator.h>
#include <phantom/HostAllocator.h>
#include <phantom/Storage.h>
#include <phantom/hal.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#ifndef PHANTOM_BACKEND_NAME
#error "PHANTOM_BACKEND_NAME must be defined by the build (CMakeLists.txt)"
#endif

namespace phantom {
namespace {

struct PhantomHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }

  bool isAvailable() const override { return deviceCountNoThrow() > 0; }

  bool hasPrimaryContext(c10::DeviceIndex device) const override {
    return device >= 0 && device < deviceCountNoThrow();
  }

  void init() const override { deviceCountOrThrow(); }

  c10::DeviceIndex deviceCount() const override { return deviceCountNoThrow(); }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    phantom::setCurrentDevice(device);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return phantom::currentDevice();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return phantom::exchangeDevice(device);
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return phantom::exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex device) const override {
    return defaultGenerator(device);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return newGenerator(device);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    ph_pointer_attributes_t attributes{};
    TORCH_CHECK(ph_pointer_get_attributes(data, &attributes) == PH_SUCCESS &&
                    attributes.type == PH_MEMORY_DEVICE,
                "pointer ", data, " is not ", c10::get_privateuse1_backend(),
                " device memory");
    return {c10::DeviceType::PrivateUse1,
            static_cast<c10::DeviceIndex>(attributes.device)};
  }

  bool isPinnedPtr(const void* data) const override {
    return isPinnedPointer(data);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return pinnedHostAllocator();
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t nbytes) const override {
    resizeStorageBytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};

}  // namespace

static struct RegisterBackend {
  RegisterBackend() {
    c10::register_privateuse1_backend(PHANTOM_BACKEND_NAME);
    // Leaked on purpose: hooks live as long as the process.
    at::RegisterPrivateUse1HooksInterface(new PhantomHooks());
  }
} register_backend;

}  // namespace phantom
