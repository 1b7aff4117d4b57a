// The fake driver's one entry point: ph_driver_get_table (phantom/hal.h,
// "The driver table").
//
// The runtime loads the fake at run time like any driver: it opens
// libphantom_fake.so, calls ph_driver_get_table and reaches every HAL call
// through the table below, whose members are the fake's own ph_*
// functions (hal_entry.cc, ipc_entry.cc). The library also exports those
// functions by name, so tests and tools can link the fake directly or
// load it with ctypes; it is linked with -Bsymbolic (CMakeLists.txt), so
// the addresses taken here, and the fake's calls among its own functions,
// bind inside the library and never to the runtime's forwarding ph_*
// functions of the same names.
#include "activity_trace.h"
#include "config.h"
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
    &ph_kernel_address,
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
    // ABI 1002
    &ph_device_get_telemetry,
    &ph_ipc_get_mem_handle,
    &ph_ipc_open_mem_handle,
    &ph_ipc_close_mem_handle,
    &ph_ipc_get_event_handle,
    &ph_ipc_open_event_handle,
    // ABI 1004
    &ph_stream_begin_capture,
    &ph_stream_end_capture,
    &ph_stream_get_capture_info,
    &ph_graph_get_node_count,
    &ph_graph_instantiate,
    &ph_graph_launch,
    &ph_graph_exec_destroy,
    &ph_graph_destroy,
    &ph_graph_debug_dump,
    // ABI 1005 (NULL in a build without the activity trace,
    // activity_trace.h: the OPTIONAL section absent)
    phantom::fake::trace::kBuiltIn ? &ph_activity_enable : nullptr,
    phantom::fake::trace::kBuiltIn ? &ph_activity_disable : nullptr,
    phantom::fake::trace::kBuiltIn ? &ph_activity_get_timestamp : nullptr,
    phantom::fake::trace::kBuiltIn ? &ph_activity_push_correlation : nullptr,
    phantom::fake::trace::kBuiltIn ? &ph_activity_pop_correlation : nullptr,
    phantom::fake::trace::kBuiltIn ? &ph_activity_flush : nullptr,
};

// The table without ph_kernel_address: PHANTOM_FAKE_NO_KERNEL_VIEW=1
// plays the driver of a discrete device, whose memory the host cannot
// address (config.h).
ph_driver_table_t TableWithoutKernelView() {
  ph_driver_table_t table = kTable;
  table.kernel_address = nullptr;
  return table;
}

}  // namespace

// Every runtime of major 1 is served: the fake implements every member
// (all but the kernel view under PHANTOM_FAKE_NO_KERNEL_VIEW=1, all but
// the activity section in a build without it).
const ph_driver_table_t* ph_driver_get_table(uint32_t runtime_abi_version) {
  (void)runtime_abi_version;
  const phantom::fake::Config& config = phantom::fake::GetConfig();
  if (config.ok && !config.kernel_view) {
    static const ph_driver_table_t without = TableWithoutKernelView();
    return &without;
  }
  return &kTable;
}
