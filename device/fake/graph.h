// Graph capture and replay in the fake driver (phantom/hal_graph.h).
//
// A capture is a list of recorded Tasks (the same Task a stream would have
// run) in the order the host made the calls, plus bookkeeping for the
// streams that joined it. hal_entry.cc asks this file, before it queues
// anything, whether the stream captures (CaptureActive() is one relaxed
// atomic load, so a program that never captures pays nothing more); if so,
// the task becomes a node instead of being queued. Call order is a valid
// order for every stream order and event wait of the capture (a wait can
// only name a record made earlier), so a replay simply runs the nodes in
// that order: ph_graph_launch queues ONE task on the target stream whose
// run walks the node list on that stream's worker. That is the whole
// saving graphs are for: one hand-off per graph instead of one per op.
//
// Events recorded during a capture are not queued: they mark a node
// position (CaptureMark on the Event). Waiting on such a mark from a stream
// that does not capture makes that stream join the capture (fork); a wait
// from a member stream adds an edge and, if the recording stream did
// nothing since, counts that stream as joined back. Edges only feed the
// debug dump: the replay is serial. A wait on an event recorded outside
// any capture becomes a node that, at each launch, waits for the event's
// latest record at the time of the launch.
//
// Nodes own their tasks: a GraphBody releases every task exactly once when
// the last of the capture, the graph, its instantiations and the launches
// queued with them lets go of it (shared_ptr), which is how destroying a
// graph while a replay is queued is safe.
//
// Locking: one mutex (graph.cc) guards every capture and the stream → capture
// map; it is never held while a task runs or a stream lock is taken, and
// it is taken before an Event's mutex, never after.
#ifndef PHANTOM_FAKE_GRAPH_H_
#define PHANTOM_FAKE_GRAPH_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "event.h"
#include "phantom/hal.h"
#include "stream.h"

namespace phantom::fake {

struct GraphNode {
  Task task;                   // run once per replay, released once
  int stream_index = 0;        // member stream that recorded it (0: origin)
  std::vector<size_t> deps;    // earlier nodes it follows (for the dump)
  std::shared_ptr<Event> external_wait;  // a wait on a non-captured event
};

// The recorded work; releases every node's task when destroyed.
struct GraphBody {
  std::vector<GraphNode> nodes;
  int device = -1;
  ~GraphBody();
};

// Where a record made during a capture points (Event::capture_mark).
struct CaptureMark {
  uint64_t capture_id = 0;
  Stream* stream = nullptr;  // the member stream that recorded it
  size_t node = SIZE_MAX;    // its last node at the record, or SIZE_MAX
  uint64_t ops = 0;          // its count of recorded calls at the record
};

// True while any capture is in progress (the fast path's only check).
bool CaptureActive();

ph_status_t BeginCapture(Stream& stream, ph_capture_mode_t mode);
// Ends the capture `stream` originated; *out_body is its graph.
ph_status_t EndCapture(Stream& stream, std::shared_ptr<GraphBody>* out_body);
void GetCaptureInfo(Stream& stream, ph_capture_status_t* out_status,
                    uint64_t* out_id);

// If `stream` captures: records `task` (or releases it and returns
// PH_ERROR_CAPTURE_INVALIDATED) and sets *recorded. Otherwise leaves the
// task alone and returns PH_SUCCESS with *recorded false.
ph_status_t RecordIfCapturing(Stream& stream, Task& task, bool* recorded);

// For calls illegal on a capturing stream (synchronize, query, waited
// work, destroy): PH_SUCCESS if `stream` does not capture, else
// invalidates its capture and returns PH_ERROR_STREAM_CAPTURE_UNSUPPORTED
// with a message naming `call`.
ph_status_t RefuseOnCapturingStream(Stream& stream, const char* call);

// For unsafe calls (ph_memcpy, ph_device_synchronize, ph_free): refused,
// with every capture whose mode forbids the call on this thread
// invalidated, if there is one. `device` < 0 means any device.
ph_status_t RefuseUnsafeCall(const char* call, int device);

// ph_event_record on a capturing stream: marks the event and sets
// *recorded. On a stream that does not capture, clears the event's mark.
ph_status_t RecordEventIfCapturing(Stream& stream, Event& event,
                                   bool* recorded);

// ph_stream_wait_event when either side involves a capture: a fork, a
// join, an edge or an external-wait node. *handled false: wait as usual.
ph_status_t WaitEventIfCapturing(Stream& stream, const std::shared_ptr<Event>& event,
                                 bool* handled);

// ph_event_query / ph_event_synchronize: refused for an event whose latest
// record was made during a capture.
ph_status_t RefuseCapturedEvent(Event& event, const char* call);

// ph_stream_destroy: the capture of a destroyed member is invalidated, and
// a capture whose origin is destroyed ends.
void ForgetStream(Stream& stream);

// Queues one replay of `body` on `stream`.
ph_status_t LaunchGraph(const std::shared_ptr<GraphBody>& body, Stream& stream);

// Writes `body` as Graphviz dot to `path`.
ph_status_t DumpGraph(const GraphBody& body, const char* path);

// Handles.
struct GraphHandle {
  std::shared_ptr<GraphBody> body;
};
struct GraphExecHandle {
  std::shared_ptr<GraphBody> body;
};
ph_graph_t RegisterGraph(std::shared_ptr<GraphHandle> graph);
std::shared_ptr<GraphHandle> FindGraph(ph_graph_t handle);
std::shared_ptr<GraphHandle> UnregisterGraph(ph_graph_t handle);
ph_graph_exec_t RegisterGraphExec(std::shared_ptr<GraphExecHandle> exec);
std::shared_ptr<GraphExecHandle> FindGraphExec(ph_graph_exec_t handle);
std::shared_ptr<GraphExecHandle> UnregisterGraphExec(ph_graph_exec_t handle);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_GRAPH_H_
