// Graph capture and replay; see graph.h for the design.
#include "graph.h"

#include <cstdio>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "activity_trace.h"
#include "errors.h"
#include "handle_registry.h"

namespace phantom::fake {
namespace {

struct Member {
  Stream* stream = nullptr;  // null once destroyed
  size_t last_node = SIZE_MAX;
  uint64_t ops = 0;             // recorded calls (nodes and event records)
  bool joined = false;          // joined back since its last recorded call
  std::vector<size_t> pending;  // edges for its next node (event waits)
};

struct Capture {
  uint64_t id = 0;
  ph_capture_mode_t mode = PH_CAPTURE_MODE_GLOBAL;
  std::thread::id owner;
  int device = -1;
  bool invalidated = false;
  std::string why;  // the call that invalidated it
  std::shared_ptr<GraphBody> body = std::make_shared<GraphBody>();
  std::vector<Member> members;  // [0] is the origin

  Member* Find(Stream* stream) {
    for (Member& member : members) {
      if (member.stream == stream) return &member;
    }
    return nullptr;
  }
  int IndexOf(Stream* stream) const {
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].stream == stream) return static_cast<int>(i);
    }
    return -1;
  }
  void Invalidate(std::string reason) {
    if (invalidated) return;
    invalidated = true;
    why = std::move(reason);
    // What was recorded is released when the capture ends (outside the
    // lock: a task's release is user code).
  }
};

std::mutex g_mutex;  // guards everything below
std::unordered_map<Stream*, std::shared_ptr<Capture>> g_by_stream;
std::unordered_map<uint64_t, std::shared_ptr<Capture>> g_by_id;
uint64_t g_next_id = 1;
std::atomic<int> g_active{0};  // captures in progress

std::shared_ptr<Capture> CaptureOfLocked(Stream* stream) {
  auto it = g_by_stream.find(stream);
  return it == g_by_stream.end() ? nullptr : it->second;
}

void EndLocked(const std::shared_ptr<Capture>& capture) {
  for (const Member& member : capture->members) {
    if (member.stream != nullptr) g_by_stream.erase(member.stream);
  }
  g_by_id.erase(capture->id);
  g_active.fetch_sub(1, std::memory_order_relaxed);
}

ph_status_t InvalidatedError(const Capture& capture) {
  return Fail(static_cast<ph_status_t>(PH_ERROR_CAPTURE_INVALIDATED),
              "the stream's graph capture was invalidated earlier by " +
                  capture.why +
                  "; end the capture (it gives no graph) and capture again");
}

ph_status_t Unsupported(Capture& capture, const std::string& call,
                        const std::string& rule) {
  capture.Invalidate(call);
  return Fail(static_cast<ph_status_t>(PH_ERROR_STREAM_CAPTURE_UNSUPPORTED),
              call + " cannot be used while a stream captures a graph: " +
                  rule + "; the capture is now invalidated");
}

// Appends a node for `member`, with its stream order and pending edges.
void AppendLocked(Capture& capture, int index, GraphNode node) {
  Member& member = capture.members[index];
  node.stream_index = index;
  if (member.last_node != SIZE_MAX) node.deps.push_back(member.last_node);
  for (size_t dep : member.pending) node.deps.push_back(dep);
  member.pending.clear();
  capture.body->nodes.push_back(std::move(node));
  member.last_node = capture.body->nodes.size() - 1;
  member.ops += 1;
  member.joined = false;
}

HandleRegistry<GraphHandle>& Graphs() {
  static auto* registry = new HandleRegistry<GraphHandle>(0x6);  // leaked
  return *registry;
}
HandleRegistry<GraphExecHandle>& GraphExecs() {
  static auto* registry = new HandleRegistry<GraphExecHandle>(0x7);
  return *registry;
}

}  // namespace

GraphBody::~GraphBody() {
  for (GraphNode& node : nodes) node.task.Release();
}

bool CaptureActive() {
  return g_active.load(std::memory_order_relaxed) != 0;
}

ph_status_t BeginCapture(Stream& stream, ph_capture_mode_t mode) {
  if (mode != PH_CAPTURE_MODE_GLOBAL && mode != PH_CAPTURE_MODE_THREAD_LOCAL &&
      mode != PH_CAPTURE_MODE_RELAXED) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_stream_begin_capture: unknown capture mode " +
                    std::to_string(static_cast<int>(mode)) +
                    " (use PH_CAPTURE_MODE_GLOBAL, _THREAD_LOCAL or _RELAXED)");
  }
  const ph_status_t sticky = stream.StickyStatus();
  if (sticky != PH_SUCCESS) return sticky;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (CaptureOfLocked(&stream)) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_stream_begin_capture: the stream is already capturing; "
                "end that capture first");
  }
  auto capture = std::make_shared<Capture>();
  capture->id = g_next_id++;
  capture->mode = mode;
  capture->owner = std::this_thread::get_id();
  capture->device = stream.device();
  capture->body->device = stream.device();
  Member origin;
  origin.stream = &stream;
  origin.joined = true;  // the origin needs no joining back
  capture->members.push_back(std::move(origin));
  g_by_stream[&stream] = capture;
  g_by_id[capture->id] = capture;
  g_active.fetch_add(1, std::memory_order_relaxed);
  return PH_SUCCESS;
}

ph_status_t EndCapture(Stream& stream, std::shared_ptr<GraphBody>* out_body) {
  std::shared_ptr<GraphBody> body;  // released outside the lock on failure
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<Capture> capture = CaptureOfLocked(&stream);
  if (!capture) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_stream_end_capture: the stream is not capturing");
  }
  if (capture->members[0].stream != &stream) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_stream_end_capture: the stream joined a capture that "
                "another stream began; end it on that stream");
  }
  EndLocked(capture);
  if (capture->invalidated) {
    body = std::move(capture->body);
    return InvalidatedError(*capture);
  }
  for (size_t i = 1; i < capture->members.size(); ++i) {
    const Member& member = capture->members[i];
    if (member.stream != nullptr && !member.joined) {
      capture->Invalidate("an unjoined stream");
      body = std::move(capture->body);
      return Fail(static_cast<ph_status_t>(PH_ERROR_CAPTURE_INVALIDATED),
                  "ph_stream_end_capture: a stream that joined the capture "
                  "(member " + std::to_string(i) +
                      ") was not joined back: record an event on it after "
                      "its last work and make the origin stream wait on it");
    }
  }
  *out_body = std::move(capture->body);
  return PH_SUCCESS;
}

void GetCaptureInfo(Stream& stream, ph_capture_status_t* out_status,
                    uint64_t* out_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<Capture> capture = CaptureOfLocked(&stream);
  if (!capture) return;
  *out_status = capture->invalidated ? PH_CAPTURE_STATUS_INVALIDATED
                                     : PH_CAPTURE_STATUS_ACTIVE;
  *out_id = capture->id;
}

ph_status_t RecordIfCapturing(Stream& stream, Task& task, bool* recorded) {
  *recorded = false;
  std::unique_lock<std::mutex> lock(g_mutex);
  std::shared_ptr<Capture> capture = CaptureOfLocked(&stream);
  if (!capture) return PH_SUCCESS;
  *recorded = true;
  if (capture->invalidated) {
    const ph_status_t status = InvalidatedError(*capture);
    lock.unlock();
    task.Release();
    return status;
  }
  GraphNode node;
  node.task = std::move(task);
  AppendLocked(*capture, capture->IndexOf(&stream), std::move(node));
  return PH_SUCCESS;
}

ph_status_t RefuseOnCapturingStream(Stream& stream, const char* call) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<Capture> capture = CaptureOfLocked(&stream);
  if (!capture) return PH_SUCCESS;
  return Unsupported(*capture, call,
                     "it would wait for work the capture records instead of "
                     "running");
}

ph_status_t RefuseUnsafeCall(const char* call, int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::thread::id self = std::this_thread::get_id();
  std::shared_ptr<Capture> refusing;
  for (auto& entry : g_by_id) {
    Capture& capture = *entry.second;
    if (device >= 0 && capture.device != device) continue;
    const bool forbidden =
        capture.mode == PH_CAPTURE_MODE_GLOBAL ||
        (capture.mode == PH_CAPTURE_MODE_THREAD_LOCAL && capture.owner == self);
    if (forbidden) refusing = entry.second;
  }
  if (!refusing) return PH_SUCCESS;
  const char* mode = refusing->mode == PH_CAPTURE_MODE_GLOBAL
                         ? "global (refused on every thread)"
                         : "thread-local (refused on the capturing thread)";
  for (auto& entry : g_by_id) {  // every capture that forbids it
    Capture& capture = *entry.second;
    if (device >= 0 && capture.device != device) continue;
    if (capture.mode == PH_CAPTURE_MODE_GLOBAL ||
        (capture.mode == PH_CAPTURE_MODE_THREAD_LOCAL && capture.owner == self)) {
      capture.Invalidate(call);
    }
  }
  return Fail(static_cast<ph_status_t>(PH_ERROR_STREAM_CAPTURE_UNSUPPORTED),
              std::string(call) +
                  " is unsafe while a stream captures a graph (it would wait "
                  "for or free work the capture has recorded but not run), "
                  "and the capture's mode is " + mode +
                  "; the capture is now invalidated. Make the call before or "
                  "after the capture, or capture in relaxed mode");
}

ph_status_t RecordEventIfCapturing(Stream& stream, Event& event,
                                   bool* recorded) {
  *recorded = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<Capture> capture = CaptureOfLocked(&stream);
  if (!capture) {
    if (event.captured.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> event_lock(event.mutex);
      event.capture_mark.reset();
      event.captured.store(false, std::memory_order_release);
    }
    return PH_SUCCESS;
  }
  *recorded = true;
  if (capture->invalidated) return InvalidatedError(*capture);
  if (event.shared) {
    return Unsupported(*capture, "ph_event_record of an interprocess event",
                       "a point inside a graph cannot be shared with "
                       "another process");
  }
  Member& member = *capture->Find(&stream);
  member.ops += 1;
  member.joined = false;
  auto mark = std::make_shared<CaptureMark>();
  mark->capture_id = capture->id;
  mark->stream = &stream;
  mark->node = member.last_node;
  mark->ops = member.ops;
  std::lock_guard<std::mutex> event_lock(event.mutex);
  event.capture_mark = std::move(mark);
  event.captured.store(true, std::memory_order_release);
  return PH_SUCCESS;
}

ph_status_t WaitEventIfCapturing(Stream& stream,
                                 const std::shared_ptr<Event>& event,
                                 bool* handled) {
  *handled = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<CaptureMark> mark;
  if (event->captured.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> event_lock(event->mutex);
    mark = event->capture_mark;
  }
  std::shared_ptr<Capture> capture = CaptureOfLocked(&stream);
  if (!capture) {
    if (!mark) return PH_SUCCESS;  // an ordinary wait
    *handled = true;
    auto it = g_by_id.find(mark->capture_id);
    if (it == g_by_id.end()) {
      return Fail(static_cast<ph_status_t>(PH_ERROR_STREAM_CAPTURE_UNSUPPORTED),
                  "ph_stream_wait_event: the event was last recorded during a "
                  "graph capture that has ended, so it marks a point inside "
                  "a graph; record it again outside the capture");
    }
    // A fork: the stream joins the capture, after the marked point.
    Capture& joined = *it->second;
    if (stream.device() != joined.device) {
      return Unsupported(joined, "ph_stream_wait_event from another device",
                         "a capture's streams must belong to one device");
    }
    Member member;
    member.stream = &stream;
    if (mark->node != SIZE_MAX) member.pending.push_back(mark->node);
    joined.members.push_back(std::move(member));
    g_by_stream[&stream] = it->second;
    return PH_SUCCESS;
  }
  *handled = true;
  if (capture->invalidated) return InvalidatedError(*capture);
  const int index = capture->IndexOf(&stream);
  if (mark) {
    if (mark->capture_id != capture->id) {
      return Unsupported(*capture, "ph_stream_wait_event",
                         "the event was recorded in another capture (or a "
                         "capture that has ended)");
    }
    Member& member = capture->members[index];
    if (mark->node != SIZE_MAX) member.pending.push_back(mark->node);
    member.ops += 1;
    Member* source = capture->Find(mark->stream);
    if (source != nullptr && source != &member && source->ops == mark->ops) {
      source->joined = true;  // nothing recorded on it since the record
    }
    return PH_SUCCESS;
  }
  if (event->shared) {
    return Unsupported(*capture, "ph_stream_wait_event on an interprocess event",
                       "a graph cannot wait for another process");
  }
  if (!event->Latest()) return PH_SUCCESS;  // never recorded: no wait
  GraphNode node;
  node.task.kind = TaskKind::kEventWait;
  node.task.name = "ph_stream_wait_event";
  node.external_wait = event;
  AppendLocked(*capture, index, std::move(node));
  return PH_SUCCESS;
}

ph_status_t RefuseCapturedEvent(Event& event, const char* call) {
  if (!event.captured.load(std::memory_order_acquire)) return PH_SUCCESS;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<CaptureMark> mark;
  {
    std::lock_guard<std::mutex> event_lock(event.mutex);
    mark = event.capture_mark;
  }
  if (!mark) return PH_SUCCESS;
  const std::string rule =
      "the event was last recorded during a graph capture, so it marks a "
      "point inside a graph that no stream runs";
  auto it = g_by_id.find(mark->capture_id);
  if (it != g_by_id.end()) return Unsupported(*it->second, call, rule);
  return Fail(static_cast<ph_status_t>(PH_ERROR_STREAM_CAPTURE_UNSUPPORTED),
              std::string(call) + ": " + rule +
                  "; record it again outside the capture");
}

void ForgetStream(Stream& stream) {
  std::shared_ptr<GraphBody> released;  // outside the lock
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<Capture> capture = CaptureOfLocked(&stream);
  if (!capture) return;
  capture->Invalidate("ph_stream_destroy of a capturing stream");
  if (capture->members[0].stream == &stream) {
    EndLocked(capture);  // no one can end it any more
    released = std::move(capture->body);
    return;
  }
  g_by_stream.erase(&stream);
  for (Member& member : capture->members) {
    if (member.stream == &stream) member.stream = nullptr;
  }
}

ph_status_t LaunchGraph(const std::shared_ptr<GraphBody>& body,
                        Stream& stream) {
  if (CaptureActive()) {
    const ph_status_t refused =
        RefuseOnCapturingStream(stream, "ph_graph_launch on a capturing stream");
    if (refused != PH_SUCCESS) return refused;
  }
  if (body->device >= 0 && body->device != stream.device()) {
    return Fail(PH_ERROR_INVALID_DEVICE,
                "ph_graph_launch: the graph was captured on device " +
                    std::to_string(body->device) +
                    " but the stream belongs to device " +
                    std::to_string(stream.device()));
  }
  // Waits on events recorded outside the capture wait for the record that
  // is the latest at this launch.
  auto snapshots =
      std::make_shared<std::vector<std::shared_ptr<EventRecord>>>(
          body->nodes.size());
  for (size_t i = 0; i < body->nodes.size(); ++i) {
    if (body->nodes[i].external_wait) {
      (*snapshots)[i] = body->nodes[i].external_wait->Latest();
    }
  }
  // While the activity trace is on, each node is a piece of work of the
  // replaying stream, tagged with the op that launched the replay (the
  // replay itself is one too, around them).
  const int device = stream.device();
  const uint64_t trace_id = stream.trace_id();
  const uint64_t correlation = trace::On() ? trace::CurrentCorrelation() : 0;
  Task task;
  task.kind = TaskKind::kHostFunc;
  task.name = "ph_graph_launch";
  task.run = [body, snapshots, device, trace_id, correlation](
                 char* error, size_t error_size) {
    for (size_t i = 0; i < body->nodes.size(); ++i) {
      GraphNode& node = body->nodes[i];
      if (node.external_wait) {
        const std::shared_ptr<EventRecord>& record = (*snapshots)[i];
        if (!record) continue;
        record->WaitReached();
        ph_status_t failure = PH_SUCCESS;
        std::string origin;
        record->Reached(&failure, &origin);
        if (failure != PH_SUCCESS) {
          std::snprintf(error, error_size,
                        "graph node %zu waited for an event whose work "
                        "failed: %s",
                        i, origin.c_str());
          return failure;
        }
        continue;
      }
      char node_error[kTaskErrorBytes] = "";
      const bool traced = trace::On() &&
                          node.task.kind != TaskKind::kEventMarker &&
                          node.task.kind != TaskKind::kEventWait;
      const ph_status_t status =
          traced ? RunTraced(node.task, device, trace_id, correlation,
                             node_error, sizeof node_error)
                 : node.task.Run(node_error, sizeof node_error);
      if (status != PH_SUCCESS) {
        std::snprintf(error, error_size, "graph node %zu ('%s') failed: %s",
                      i, node.task.name, node_error);
        return status;
      }
    }
    return PH_SUCCESS;
  };
  uint64_t generation = 0;
  return stream.Enqueue(std::move(task), true, &generation);
}

ph_status_t DumpGraph(const GraphBody& body, const char* path) {
  std::FILE* file = std::fopen(path, "w");
  if (file == nullptr) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string("ph_graph_debug_dump: cannot write '") + path +
                    "'");
  }
  static const char* kKinds[] = {"kernel", "copy", "fill", "event record",
                                 "event wait"};
  std::fprintf(file, "digraph phantom_graph {\n  // device %d, %zu nodes\n",
               body.device, body.nodes.size());
  for (size_t i = 0; i < body.nodes.size(); ++i) {
    const GraphNode& node = body.nodes[i];
    std::fprintf(file, "  n%zu [label=\"%zu: %s '%s' (stream %d)\"];\n", i, i,
                 kKinds[static_cast<int>(node.task.kind)], node.task.name,
                 node.stream_index);
    for (size_t dep : node.deps) {
      std::fprintf(file, "  n%zu -> n%zu;\n", dep, i);
    }
  }
  std::fprintf(file, "}\n");
  const bool ok = std::fclose(file) == 0;
  if (!ok) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string("ph_graph_debug_dump: writing '") + path +
                    "' failed");
  }
  return PH_SUCCESS;
}

ph_graph_t RegisterGraph(std::shared_ptr<GraphHandle> graph) {
  return reinterpret_cast<ph_graph_t>(Graphs().Add(std::move(graph)));
}
std::shared_ptr<GraphHandle> FindGraph(ph_graph_t handle) {
  return Graphs().Find(reinterpret_cast<uintptr_t>(handle));
}
std::shared_ptr<GraphHandle> UnregisterGraph(ph_graph_t handle) {
  return Graphs().Remove(reinterpret_cast<uintptr_t>(handle));
}
ph_graph_exec_t RegisterGraphExec(std::shared_ptr<GraphExecHandle> exec) {
  return reinterpret_cast<ph_graph_exec_t>(GraphExecs().Add(std::move(exec)));
}
std::shared_ptr<GraphExecHandle> FindGraphExec(ph_graph_exec_t handle) {
  return GraphExecs().Find(reinterpret_cast<uintptr_t>(handle));
}
std::shared_ptr<GraphExecHandle> UnregisterGraphExec(ph_graph_exec_t handle) {
  return GraphExecs().Remove(reinterpret_cast<uintptr_t>(handle));
}

}  // namespace phantom::fake
