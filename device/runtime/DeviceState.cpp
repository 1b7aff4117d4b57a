// See phantom/DeviceState.h.
#include <phantom/Device.h>
#include <phantom/DeviceState.h>
#include <phantom/Exception.h>

#include <c10/util/Exception.h>

namespace phantom {

DeviceProperties deviceProperties(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  ph_device_properties_t props{};
  props.struct_size = sizeof props;
  PHANTOM_CHECK(ph_device_get_properties(device, &props));
  DeviceProperties result;
  props.name[sizeof props.name - 1] = '\0';  // a driver's name may fill it
  result.name = props.name;
  result.total_memory = props.total_memory;
  result.multi_processor_count = props.multiprocessor_count;
  const uint32_t version = ph_abi_version();
  result.major = static_cast<int>(version / 1000);
  result.minor = static_cast<int>(version % 1000);
  result.stream_priority_low = props.stream_priority_low;
  result.stream_priority_high = props.stream_priority_high;
  return result;
}

c10::DeviceCapability deviceCapability() {
  c10::DeviceCapability capability;  // every dtype, then the exceptions
  auto& types = capability.capability_data.supported_scalar_types;
  // No quantized tensors on phantom (README, "Limits").
  types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = 0;
  types.has_QUInt4x2 = types.has_QUInt2x4 = 0;
  // Storage-only dtypes that no CPU kernel converts: a phantom tensor
  // could hold them, but copying one to another dtype fails on the CPU.
  types.has_Bits1x8 = types.has_Bits2x4 = types.has_Bits4x2 = 0;
  types.has_Bits8 = types.has_Bits16 = 0;
  types.has_UInt1 = types.has_UInt2 = types.has_UInt3 = types.has_UInt4 = 0;
  types.has_UInt5 = types.has_UInt6 = types.has_UInt7 = 0;
  types.has_Int1 = types.has_Int2 = types.has_Int3 = types.has_Int4 = 0;
  types.has_Int5 = types.has_Int6 = types.has_Int7 = 0;
  types.has_Float4_e2m1fn_x2 = 0;
  return capability;
}

DeviceTelemetry deviceTelemetry(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  DeviceTelemetry result;
  // A driver without telemetry (its table member NULL, e.g. one of a minor
  // before 1002) answers PH_ERROR_UNIMPLEMENTED through the dispatch.
  ph_device_telemetry_t telemetry{};
  telemetry.struct_size = sizeof telemetry;
  const ph_status_t status = ph_device_get_telemetry(device, &telemetry);
  if (status == PH_ERROR_UNIMPLEMENTED) {
    return result;
  }
  PHANTOM_CHECK(status);
  result.driver_reports = true;
  result.sample_period_us = telemetry.sample_period_us;
  const auto has = [&](uint32_t bit) { return (telemetry.valid & bit) != 0; };
  if (has(PH_TELEMETRY_UTILIZATION)) {
    result.utilization_percent = telemetry.utilization_percent;
  }
  if (has(PH_TELEMETRY_MEMORY_BUSY)) {
    result.memory_busy_percent = telemetry.memory_busy_percent;
  }
  if (has(PH_TELEMETRY_TEMPERATURE)) {
    result.temperature_c = telemetry.temperature_c;
  }
  if (has(PH_TELEMETRY_POWER)) {
    result.power_draw_mw = telemetry.power_draw_mw;
  }
  if (has(PH_TELEMETRY_CLOCK)) {
    result.clock_mhz = telemetry.clock_mhz;
  }
  return result;
}

size_t deviceMemoryUsed(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  size_t free_bytes = 0;
  size_t total = 0;
  PHANTOM_CHECK(ph_mem_get_info(device, &free_bytes, &total));
  return total - free_bytes;
}

}  // namespace phantom
