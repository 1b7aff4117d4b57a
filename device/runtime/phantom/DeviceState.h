// What the runtime can say about a device beyond running work on it: its
// properties (torch.phantom.get_device_properties), the dtypes it supports
// (torch.accelerator.get_device_capability) and the state its driver
// measures (torch.phantom.utilization and friends).
//
// Properties come from ph_device_get_properties. The HAL has no compute
// capability numbering of its own, so (major, minor) is the HAL ABI version
// the driver implements (1002 is (1, 2)): that version, not a chip
// generation, decides what the device does through phantom.
//
// Telemetry comes from the OPTIONAL ph_device_get_telemetry. A driver
// without it (PH_ERROR_UNIMPLEMENTED, or one built against an ABI before
// 1002, which has no such entry point) measures nothing: every field is
// empty, and the Python functions raise saying so. Memory in use on the
// device is ph_mem_get_info's total minus free, which every driver has.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceCapability.h>

#include <cstdint>
#include <optional>
#include <string>

namespace phantom {

struct DeviceProperties {
  std::string name;
  size_t total_memory = 0;
  int multi_processor_count = 0;
  int major = 0;  // the driver's HAL ABI version / 1000
  int minor = 0;  // ... % 1000
  int stream_priority_low = 0;
  int stream_priority_high = 0;
};

// Throws for an invalid index.
DeviceProperties deviceProperties(c10::DeviceIndex device);

// The dtypes a phantom tensor can hold and convert between: every dtype
// the CPU converts, since the device computes with the CPU's kernels, but
// not the quantized ones (phantom has no quantized tensors).
c10::DeviceCapability deviceCapability();

struct DeviceTelemetry {
  bool driver_reports = false;  // the driver implements the query
  std::optional<uint32_t> utilization_percent;
  std::optional<uint32_t> memory_busy_percent;
  std::optional<int32_t> temperature_c;
  std::optional<uint32_t> power_draw_mw;
  std::optional<uint32_t> clock_mhz;
  uint64_t sample_period_us = 0;
};

// Throws for an invalid index or a driver error other than "unimplemented".
DeviceTelemetry deviceTelemetry(c10::DeviceIndex device);

// Bytes of the device's memory in use, as the driver sees it: tensors,
// the caching allocator's cache, and whatever else allocated there.
size_t deviceMemoryUsed(c10::DeviceIndex device);

}  // namespace phantom
