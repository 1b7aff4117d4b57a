// The driver under test: loaded by path, reached through its table.
//
// Design. PHANTOM_DRIVER names the driver library, as it does for the
// runtime (a path, or a file name the dynamic loader finds); unset, the
// suite loads the library CMake compiled in as
// PHANTOM_HAL_TEST_DEFAULT_DRIVER. The library is
// opened on the first HAL call (so listing the tests loads nothing), its
// ph_driver_get_table is asked for the table of this header's ABI, and
// every ph_* function below forwards to the table member of the same name.
// Nothing else happens in between: what the tests see is what the driver
// does. A NULL OPTIONAL member answers PH_ERROR_UNIMPLEMENTED with a
// sentence of its own, which ph_last_error_message returns until the next
// failing forwarded call. Drivers bind their own ph_* references inside
// themselves (-Bsymbolic, hal.h "The driver table"), so the names defined
// here do not capture the driver's internal calls.
//
// A driver that cannot be loaded, or gives no usable table, is a broken
// test set-up rather than a failing test: the program says why and exits.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hal_test_support.h"

#ifndef PHANTOM_HAL_TEST_DEFAULT_DRIVER
#define PHANTOM_HAL_TEST_DEFAULT_DRIVER "libphantom_fake.so"
#endif

namespace hal_test {
namespace {

struct Loaded {
  std::string path;
  ph_driver_table_t table{};
};

[[noreturn]] void Refuse(const std::string& sentence) {
  std::fprintf(stderr,
               "HAL conformance: %s; set PHANTOM_DRIVER to the path "
               "of a phantom driver library\n",
               sentence.c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

Loaded Load() {
  Loaded loaded;
  const char* chosen = std::getenv("PHANTOM_DRIVER");
  loaded.path = chosen != nullptr && chosen[0] != '\0'
                    ? chosen
                    : PHANTOM_HAL_TEST_DEFAULT_DRIVER;
  void* library = dlopen(loaded.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    Refuse("cannot load the driver '" + loaded.path +
           "': " + (why != nullptr ? why : "dlopen failed"));
  }
  auto get_table = reinterpret_cast<ph_driver_get_table_fn>(
      dlsym(library, PH_DRIVER_ENTRY_POINT));
  if (get_table == nullptr) {
    Refuse("'" + loaded.path + "' does not export " PH_DRIVER_ENTRY_POINT);
  }
  const ph_driver_table_t* table = get_table(PH_HAL_ABI_VERSION);
  if (table == nullptr) {
    Refuse("the driver '" + loaded.path + "' refused HAL ABI " +
           std::to_string(PH_HAL_ABI_VERSION) +
           " (ph_driver_get_table returned NULL)");
  }
  if (table->abi_version / 1000 != PH_HAL_ABI_VERSION / 1000) {
    Refuse("the driver '" + loaded.path + "' implements HAL ABI " +
           std::to_string(table->abi_version) + ", not major " +
           std::to_string(PH_HAL_ABI_VERSION / 1000));
  }
  // A table of an older minor leaves the newer members NULL.
  const size_t size = table->struct_size < sizeof(ph_driver_table_t)
                          ? table->struct_size
                          : sizeof(ph_driver_table_t);
  std::memcpy(&loaded.table, table, size);
  return loaded;
}

const Loaded& TheDriver() {
  static const Loaded loaded = Load();
  return loaded;
}

// The forwarding layer's own failure message, while it is the latest.
thread_local std::string t_message;
thread_local bool t_message_is_latest = false;

ph_status_t Absent(const char* call) {
  t_message = std::string(call) + ": the driver '" + TheDriver().path +
              "' leaves this OPTIONAL call NULL in its table";
  t_message_is_latest = true;
  return PH_ERROR_UNIMPLEMENTED;
}

inline ph_status_t Forwarded(ph_status_t status) {
  if (status != PH_SUCCESS && status != PH_NOT_READY) {
    t_message_is_latest = false;
  }
  return status;
}

}  // namespace

const ph_driver_table_t& Driver() { return TheDriver().table; }
const std::string& DriverPath() { return TheDriver().path; }

}  // namespace hal_test

using hal_test::Absent;
using hal_test::Driver;
using hal_test::Forwarded;

// Defines ph_<member>(params) as a forward to the table's `member`.
#define PH_FORWARD(member, params, args)                  \
  extern "C" ph_status_t ph_##member params {             \
    const auto function = Driver().member;                \
    if (function == nullptr) return Absent("ph_" #member); \
    return Forwarded(function args);                      \
  }

extern "C" const char* ph_status_name(ph_status_t status) {
  return Driver().status_name(status);
}

extern "C" const char* ph_last_error_message(void) {
  if (hal_test::t_message_is_latest) return hal_test::t_message.c_str();
  return Driver().last_error_message();
}

extern "C" uint32_t ph_abi_version(void) { return Driver().abi_version; }

PH_FORWARD(device_count, (int* out_count), (out_count))
PH_FORWARD(get_device, (int* out_device), (out_device))
PH_FORWARD(set_device, (int device), (device))
PH_FORWARD(device_get_properties,
           (int device, ph_device_properties_t* out_props),
           (device, out_props))
PH_FORWARD(device_synchronize, (int device), (device))
PH_FORWARD(device_get_telemetry,
           (int device, ph_device_telemetry_t* out_telemetry),
           (device, out_telemetry))
PH_FORWARD(mem_get_info, (int device, size_t* out_free, size_t* out_total),
           (device, out_free, out_total))
PH_FORWARD(malloc, (int device, size_t size, void** out_ptr),
           (device, size, out_ptr))
PH_FORWARD(free, (void* ptr), (ptr))
PH_FORWARD(host_malloc, (size_t size, void** out_ptr), (size, out_ptr))
PH_FORWARD(host_free, (void* ptr), (ptr))
PH_FORWARD(pointer_get_attributes,
           (const void* ptr, ph_pointer_attributes_t* out_attr),
           (ptr, out_attr))
PH_FORWARD(kernel_address, (const void* device_ptr, void** out_ptr),
           (device_ptr, out_ptr))
PH_FORWARD(stream_create, (int device, int priority, ph_stream_t* out_stream),
           (device, priority, out_stream))
PH_FORWARD(stream_destroy, (ph_stream_t stream), (stream))
PH_FORWARD(stream_query, (ph_stream_t stream), (stream))
PH_FORWARD(stream_synchronize, (ph_stream_t stream), (stream))
PH_FORWARD(stream_get_device, (ph_stream_t stream, int* out_device),
           (stream, out_device))
PH_FORWARD(stream_get_priority, (ph_stream_t stream, int* out_priority),
           (stream, out_priority))
PH_FORWARD(stream_wait_event, (ph_stream_t stream, ph_event_t event),
           (stream, event))
PH_FORWARD(launch_host_func, (ph_stream_t stream, const ph_host_task_t* task),
           (stream, task))
PH_FORWARD(run_host_func, (ph_stream_t stream, const ph_host_task_t* task),
           (stream, task))
PH_FORWARD(memcpy,
           (void* dst, const void* src, size_t size, ph_memcpy_kind_t kind),
           (dst, src, size, kind))
PH_FORWARD(memcpy_async,
           (void* dst, const void* src, size_t size, ph_memcpy_kind_t kind,
            ph_stream_t stream),
           (dst, src, size, kind, stream))
PH_FORWARD(memset_async,
           (void* dst, int value, size_t size, ph_stream_t stream),
           (dst, value, size, stream))
PH_FORWARD(event_create, (unsigned flags, ph_event_t* out_event),
           (flags, out_event))
PH_FORWARD(event_destroy, (ph_event_t event), (event))
PH_FORWARD(event_record, (ph_event_t event, ph_stream_t stream),
           (event, stream))
PH_FORWARD(event_query, (ph_event_t event), (event))
PH_FORWARD(event_synchronize, (ph_event_t event), (event))
PH_FORWARD(event_elapsed_time,
           (ph_event_t start, ph_event_t end, float* out_ms),
           (start, end, out_ms))
PH_FORWARD(ipc_get_mem_handle,
           (const void* device_ptr, ph_ipc_mem_handle_t* out_handle),
           (device_ptr, out_handle))
PH_FORWARD(ipc_open_mem_handle,
           (const ph_ipc_mem_handle_t* handle, void** out_ptr),
           (handle, out_ptr))
PH_FORWARD(ipc_close_mem_handle, (void* device_ptr), (device_ptr))
PH_FORWARD(ipc_get_event_handle,
           (ph_event_t event, ph_ipc_event_handle_t* out_handle),
           (event, out_handle))
PH_FORWARD(ipc_open_event_handle,
           (const ph_ipc_event_handle_t* handle, ph_event_t* out_event),
           (handle, out_event))
PH_FORWARD(stream_begin_capture, (ph_stream_t stream, ph_capture_mode_t mode),
           (stream, mode))
PH_FORWARD(stream_end_capture, (ph_stream_t stream, ph_graph_t* out_graph),
           (stream, out_graph))
PH_FORWARD(stream_get_capture_info,
           (ph_stream_t stream, ph_capture_status_t* out_status,
            uint64_t* out_id),
           (stream, out_status, out_id))
PH_FORWARD(graph_get_node_count, (ph_graph_t graph, size_t* out_count),
           (graph, out_count))
PH_FORWARD(graph_instantiate, (ph_graph_t graph, ph_graph_exec_t* out_exec),
           (graph, out_exec))
PH_FORWARD(graph_launch, (ph_graph_exec_t exec, ph_stream_t stream),
           (exec, stream))
PH_FORWARD(graph_exec_destroy, (ph_graph_exec_t exec), (exec))
PH_FORWARD(graph_destroy, (ph_graph_t graph), (graph))
PH_FORWARD(graph_debug_dump, (ph_graph_t graph, const char* path),
           (graph, path))
PH_FORWARD(activity_enable, (void), ())
PH_FORWARD(activity_disable, (void), ())
PH_FORWARD(activity_get_timestamp, (uint64_t* out_ns), (out_ns))
PH_FORWARD(activity_push_correlation, (uint64_t id), (id))
PH_FORWARD(activity_pop_correlation, (void), ())
PH_FORWARD(activity_flush,
           (void* records, size_t record_size, size_t capacity,
            size_t* out_count, uint64_t* out_dropped),
           (records, record_size, capacity, out_count, out_dropped))
