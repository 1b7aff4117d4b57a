// The OPTIONAL calls the remote driver does not offer.
//
// Its table leaves their members NULL (driver_table.cc), which is how the
// runtime learns it and uses each call's fallback (hal.h). They are still
// defined, answering PH_ERROR_UNIMPLEMENTED with their out parameters
// cleared, because the library also exports every ph_* name, so programs
// written against hal.h (tests/hal) link it as they link the fake.
//  - ph_kernel_address: device memory lives in another process; there is
//    no address at which host code here could reach it.
//  - telemetry, interprocess sharing, graph capture: not implemented.
#include <cstring>
#include <string>

#include "client_link.h"
#include "phantom/hal.h"

using phantom::remote::Fail;

namespace {

ph_status_t Unsupported(const char* function, const char* why) {
  return Fail(PH_ERROR_UNIMPLEMENTED,
              std::string(function) + ": the phantom remote driver " + why);
}

}  // namespace

extern "C" {

ph_status_t ph_kernel_address(const void*, void** out_ptr) {
  if (out_ptr != nullptr) *out_ptr = nullptr;
  return Unsupported("ph_kernel_address",
                     "has no kernel view: device memory lives in the server "
                     "process and is never mapped here");
}

ph_status_t ph_device_get_telemetry(int, ph_device_telemetry_t* out) {
  if (out != nullptr && out->struct_size > sizeof(size_t)) {
    const size_t size = out->struct_size < sizeof *out ? out->struct_size
                                                       : sizeof *out;
    std::memset(reinterpret_cast<char*>(out) + sizeof(size_t), 0,
                size - sizeof(size_t));
  }
  return Unsupported("ph_device_get_telemetry", "measures no telemetry");
}

ph_status_t ph_ipc_get_mem_handle(const void*, ph_ipc_mem_handle_t* out) {
  if (out != nullptr) std::memset(out, 0, sizeof *out);
  return Unsupported("ph_ipc_get_mem_handle", "cannot share memory");
}

ph_status_t ph_ipc_open_mem_handle(const ph_ipc_mem_handle_t*, void** out) {
  if (out != nullptr) *out = nullptr;
  return Unsupported("ph_ipc_open_mem_handle", "cannot share memory");
}

ph_status_t ph_ipc_close_mem_handle(void*) {
  return Unsupported("ph_ipc_close_mem_handle", "cannot share memory");
}

ph_status_t ph_ipc_get_event_handle(ph_event_t, ph_ipc_event_handle_t* out) {
  if (out != nullptr) std::memset(out, 0, sizeof *out);
  return Unsupported("ph_ipc_get_event_handle", "cannot share events");
}

ph_status_t ph_ipc_open_event_handle(const ph_ipc_event_handle_t*,
                                     ph_event_t* out) {
  if (out != nullptr) *out = nullptr;
  return Unsupported("ph_ipc_open_event_handle", "cannot share events");
}

ph_status_t ph_stream_begin_capture(ph_stream_t, ph_capture_mode_t) {
  return Unsupported("ph_stream_begin_capture", "cannot capture graphs");
}

ph_status_t ph_stream_end_capture(ph_stream_t, ph_graph_t* out) {
  if (out != nullptr) *out = nullptr;
  return Unsupported("ph_stream_end_capture", "cannot capture graphs");
}

ph_status_t ph_stream_get_capture_info(ph_stream_t, ph_capture_status_t* status,
                                       uint64_t* id) {
  if (status != nullptr) *status = PH_CAPTURE_STATUS_NONE;
  if (id != nullptr) *id = 0;
  return Unsupported("ph_stream_get_capture_info", "cannot capture graphs");
}

ph_status_t ph_graph_get_node_count(ph_graph_t, size_t* out) {
  if (out != nullptr) *out = 0;
  return Unsupported("ph_graph_get_node_count", "cannot capture graphs");
}

ph_status_t ph_graph_instantiate(ph_graph_t, ph_graph_exec_t* out) {
  if (out != nullptr) *out = nullptr;
  return Unsupported("ph_graph_instantiate", "cannot capture graphs");
}

ph_status_t ph_graph_launch(ph_graph_exec_t, ph_stream_t) {
  return Unsupported("ph_graph_launch", "cannot capture graphs");
}

ph_status_t ph_graph_exec_destroy(ph_graph_exec_t) {
  return Unsupported("ph_graph_exec_destroy", "cannot capture graphs");
}

ph_status_t ph_graph_destroy(ph_graph_t) {
  return Unsupported("ph_graph_destroy", "cannot capture graphs");
}

ph_status_t ph_graph_debug_dump(ph_graph_t, const char*) {
  return Unsupported("ph_graph_debug_dump", "cannot capture graphs");
}

}  // extern "C"
