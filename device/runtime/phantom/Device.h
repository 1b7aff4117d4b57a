// Devices: count, selection and validation of indices.
//
// The device count is read from the driver once and cached; a driver that
// fails to start (for example because PHANTOM_DEVICE_COUNT is malformed)
// counts as zero devices, and the driver's reason is kept so that every
// attempt to use the device raises it instead of a vague "no device".
// The current device is per thread, as in CUDA, and is kept by the driver.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace phantom {

// Number of devices; 0 if the driver could not start. Never throws.
c10::DeviceIndex deviceCountNoThrow() noexcept;

// Why the driver could not start, or "" when it did.
const std::string& driverStartupError() noexcept;

// Number of devices; throws with the driver's reason when there are none.
c10::DeviceIndex deviceCountOrThrow();

// Throws a clear error unless 0 <= index < deviceCount().
void checkDeviceIndex(c10::DeviceIndex index);

c10::DeviceIndex currentDevice();
void setCurrentDevice(c10::DeviceIndex index);
// Sets the current device and returns the previous one.
c10::DeviceIndex exchangeDevice(c10::DeviceIndex index);

// Blocks until all work on every stream of the device has finished, then
// raises the first error any of that work raised (see Stream.h: a stream
// whose error has been reported is usable again). Defined in Stream.cpp.
void synchronizeDevice(c10::DeviceIndex index);

}  // namespace phantom
