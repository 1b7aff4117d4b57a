// The C entry points of hal.h's "Graph capture and replay" section for the
// fake driver: thin shells, as in hal_entry.cc (clear the out parameters,
// check the driver started, validate handles, delegate to graph.h).
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "config.h"
#include "entry_checks.h"
#include "errors.h"
#include "graph.h"
#include "phantom/hal.h"
#include "stream.h"


using namespace phantom::fake;  // NOLINT: this file is the C shell

extern "C" {

ph_status_t ph_stream_begin_capture(ph_stream_t handle,
                                    ph_capture_mode_t mode) {
  return Guarded("ph_stream_begin_capture", [&] {
    std::shared_ptr<Stream> stream;
    const ph_status_t found =
        GetStream("ph_stream_begin_capture", handle, &stream);
    if (found != PH_SUCCESS) return found;
    return BeginCapture(*stream, mode);
  });
}

ph_status_t ph_stream_end_capture(ph_stream_t handle, ph_graph_t* out_graph) {
  return Guarded("ph_stream_end_capture", [&] {
    if (out_graph == nullptr) return NullOut("ph_stream_end_capture", "out_graph");
    *out_graph = nullptr;
    std::shared_ptr<Stream> stream;
    const ph_status_t found = GetStream("ph_stream_end_capture", handle, &stream);
    if (found != PH_SUCCESS) return found;
    std::shared_ptr<GraphBody> body;
    const ph_status_t ended = EndCapture(*stream, &body);
    if (ended != PH_SUCCESS) return ended;
    auto graph = std::make_shared<GraphHandle>();
    graph->body = std::move(body);
    *out_graph = RegisterGraph(std::move(graph));
    return PH_SUCCESS;
  });
}

ph_status_t ph_stream_get_capture_info(ph_stream_t handle,
                                       ph_capture_status_t* out_status,
                                       uint64_t* out_capture_id) {
  return Guarded("ph_stream_get_capture_info", [&] {
    if (out_status == nullptr) {
      return NullOut("ph_stream_get_capture_info", "out_status");
    }
    *out_status = PH_CAPTURE_STATUS_NONE;
    if (out_capture_id != nullptr) *out_capture_id = 0;
    std::shared_ptr<Stream> stream;
    const ph_status_t found =
        GetStream("ph_stream_get_capture_info", handle, &stream);
    if (found != PH_SUCCESS) return found;
    if (!CaptureActive()) return PH_SUCCESS;
    uint64_t id = 0;
    GetCaptureInfo(*stream, out_status, &id);
    if (out_capture_id != nullptr) *out_capture_id = id;
    return PH_SUCCESS;
  });
}

ph_status_t ph_graph_get_node_count(ph_graph_t handle, size_t* out_count) {
  return Guarded("ph_graph_get_node_count", [&] {
    if (out_count == nullptr) return NullOut("ph_graph_get_node_count", "out_count");
    *out_count = 0;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    std::shared_ptr<GraphHandle> graph = FindGraph(handle);
    if (!graph) return InvalidHandle("ph_graph_get_node_count", "graph", handle);
    *out_count = graph->body->nodes.size();
    return PH_SUCCESS;
  });
}

ph_status_t ph_graph_instantiate(ph_graph_t handle, ph_graph_exec_t* out_exec) {
  return Guarded("ph_graph_instantiate", [&] {
    if (out_exec == nullptr) return NullOut("ph_graph_instantiate", "out_exec");
    *out_exec = nullptr;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    std::shared_ptr<GraphHandle> graph = FindGraph(handle);
    if (!graph) return InvalidHandle("ph_graph_instantiate", "graph", handle);
    // The fake's executable graph is the node list itself (read-only once
    // captured), shared with the graph.
    auto exec = std::make_shared<GraphExecHandle>();
    exec->body = graph->body;
    *out_exec = RegisterGraphExec(std::move(exec));
    return PH_SUCCESS;
  });
}

ph_status_t ph_graph_launch(ph_graph_exec_t exec_handle,
                            ph_stream_t stream_handle) {
  return Guarded("ph_graph_launch", [&] {
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    std::shared_ptr<GraphExecHandle> exec = FindGraphExec(exec_handle);
    if (!exec) return InvalidHandle("ph_graph_launch", "executable graph", exec_handle);
    std::shared_ptr<Stream> stream;
    const ph_status_t found = GetStream("ph_graph_launch", stream_handle, &stream);
    if (found != PH_SUCCESS) return found;
    return LaunchGraph(exec->body, *stream);
  });
}

ph_status_t ph_graph_exec_destroy(ph_graph_exec_t handle) {
  return Guarded("ph_graph_exec_destroy", [&] {
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    if (!UnregisterGraphExec(handle)) {
      return InvalidHandle("ph_graph_exec_destroy", "executable graph", handle);
    }
    return PH_SUCCESS;
  });
}

ph_status_t ph_graph_destroy(ph_graph_t handle) {
  return Guarded("ph_graph_destroy", [&] {
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    if (!UnregisterGraph(handle)) return InvalidHandle("ph_graph_destroy", "graph", handle);
    return PH_SUCCESS;
  });
}

ph_status_t ph_graph_debug_dump(ph_graph_t handle, const char* path) {
  return Guarded("ph_graph_debug_dump", [&] {
    if (path == nullptr) return NullOut("ph_graph_debug_dump", "path");
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    std::shared_ptr<GraphHandle> graph = FindGraph(handle);
    if (!graph) return InvalidHandle("ph_graph_debug_dump", "graph", handle);
    return DumpGraph(*graph->body, path);
  });
}

}  // extern "C"
