// The remote driver's one entry point: ph_driver_get_table (phantom/hal.h,
// "The driver table").
//
// Members are the driver's own ph_* functions (client_entry.cc); the
// library is linked -Bsymbolic so these addresses bind inside it, never to
// the runtime's forwarding functions of the same names. NULL members are
// the OPTIONAL capabilities it does not offer (unsupported.cc says why);
// the runtime uses each one's documented fallback.
#include "phantom/hal.h"

namespace {

constexpr ph_driver_table_t kTable = {
    sizeof(ph_driver_table_t),
    PH_HAL_ABI_VERSION,
    // ABI 1000
    &ph_status_name,
    &ph_last_error_message,
    &ph_device_count,
    &ph_get_device,
    &ph_set_device,
    &ph_device_get_properties,
    &ph_device_synchronize,
    &ph_mem_get_info,
    &ph_malloc,
    &ph_free,
    &ph_host_malloc,
    &ph_host_free,
    &ph_pointer_get_attributes,
    nullptr,  // kernel_address: no kernel view
    &ph_stream_create,
    &ph_stream_destroy,
    &ph_stream_query,
    &ph_stream_synchronize,
    &ph_stream_get_device,
    &ph_stream_get_priority,
    &ph_stream_wait_event,
    &ph_launch_host_func,
    &ph_memcpy,
    &ph_memcpy_async,
    &ph_memset_async,
    &ph_event_create,
    &ph_event_destroy,
    &ph_event_record,
    &ph_event_query,
    &ph_event_synchronize,
    &ph_event_elapsed_time,
    // ABI 1001
    &ph_run_host_func,
    // ABI 1002: telemetry and interprocess sharing
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
    // ABI 1004: graph capture
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
    nullptr,
    // ABI 1005: activity trace
    nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

const ph_driver_table_t* ph_driver_get_table(uint32_t runtime_abi_version) {
  (void)runtime_abi_version;  // every runtime of major 1 is served
  return &kTable;
}
