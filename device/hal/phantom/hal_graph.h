/* Phantom HAL, OPTIONAL section "Graph capture and replay" (since ABI 1004).
 *
 * Included by phantom/hal.h; never include it alone. The section's
 * statuses, types, rules and functions are declared here only.
 */
#ifndef PHANTOM_HAL_GRAPH_H_
#define PHANTOM_HAL_GRAPH_H_

#ifndef PHANTOM_HAL_H_
#error "include <phantom/hal.h>, not <phantom/hal_graph.h>"
#endif

/*
 * A stream can record the work queued on it into a graph instead of running
 * it, and the graph can then be run again and again with one launch, as
 * CUDA graphs, HPU graphs and aclgraph do. This removes the host's cost per
 * piece of work from small-op workloads. This section is self-contained:
 * its types, statuses and functions are declared here only.
 *
 * Capability. A driver without graphs returns PH_ERROR_UNIMPLEMENTED from
 * ph_stream_begin_capture (and from every function of this section); the
 * runtime then raises, at the user's capture call, that the device cannot
 * capture graphs. ph_stream_get_capture_info must still answer
 * PH_CAPTURE_STATUS_NONE for a driver without graphs if it implements it;
 * the runtime treats PH_ERROR_UNIMPLEMENTED from it as "not capturing".
 *
 * Recording. Between ph_stream_begin_capture and ph_stream_end_capture on a
 * stream, these calls on that stream are recorded, in call order, as nodes
 * of the capture's graph and return PH_SUCCESS without running anything:
 * ph_launch_host_func, ph_memcpy_async (pinned host or device memory on
 * both sides), ph_memset_async, ph_event_record, ph_stream_wait_event.
 * A recorded host task's `run` is called once per replay (so it must be
 * safe to run more than once) and its `release` exactly once, when the
 * last of the graph and its instantiations is destroyed (or at once, if
 * the call returns an error). Copies and fills read and write the
 * addresses given at capture time on every replay.
 *
 * Fork and join (as CUDA). An event recorded on a capturing stream marks a
 * point inside the capture. A stream that is not capturing and waits on
 * such an event joins the capture: its later work is recorded into the
 * same graph, ordered after the point. Before the capture ends, every
 * joined stream must be joined back: its last recorded call must be an
 * ph_event_record that the origin stream (the one ph_stream_begin_capture
 * was called on), or a stream that is itself joined back, has waited on.
 * ph_stream_end_capture on the origin stream then ends the capture of
 * every joined stream. Waiting on an event recorded outside any capture
 * records a wait for that event's latest record at the time the graph is
 * launched.
 *
 * Modes (CUDA's meanings). Some calls are unsafe while a capture is in
 * progress because they would wait for, or free, work the capture has
 * recorded and not run: ph_memcpy (blocking, unordered), ph_device_synchronize
 * and ph_free. With PH_CAPTURE_MODE_GLOBAL they are refused on any thread
 * while the capture is in progress; with PH_CAPTURE_MODE_THREAD_LOCAL only
 * on the thread that began the capture; with PH_CAPTURE_MODE_RELAXED they
 * are allowed. (A driver that cannot tell which memory a host task uses,
 * such as the fake, refuses every ph_free; one that can may refuse only
 * memory the graph uses.)
 *
 * Illegal calls, in every mode, because they contradict capture itself:
 *  - ph_stream_synchronize or ph_stream_query of a capturing stream;
 *  - ph_run_host_func on a capturing stream (it waits for its task);
 *  - ph_memcpy_async with pageable host memory on a capturing stream (it
 *    blocks until the copy is done);
 *  - ph_event_query or ph_event_synchronize of an event whose latest record
 *    was made during a capture (the point lies inside a graph);
 *  - ph_stream_wait_event, from a stream capturing into one graph, on an
 *    event recorded in another capture;
 *  - ph_stream_destroy of a capturing stream.
 * An illegal call, and an unsafe call refused by the mode, returns
 * PH_ERROR_STREAM_CAPTURE_UNSUPPORTED with a message naming the call and
 * the rule, does nothing else, and invalidates the capture concerned
 * (ph_stream_destroy still destroys the stream). On an invalidated capture,
 * every further recording call returns PH_ERROR_CAPTURE_INVALIDATED and
 * records nothing (a host task is released), and ph_stream_end_capture
 * returns PH_ERROR_CAPTURE_INVALIDATED, gives no graph, and ends the
 * capture: the streams run work again, and the driver has released
 * everything the capture held.
 *
 * Replay. ph_graph_instantiate turns a graph into an executable one;
 * ph_graph_launch queues it on any stream of the device, as one piece of
 * work in that stream's order: its nodes run in an order that respects
 * every stream order and event wait of the capture (the fake runs them in
 * capture order, on the target stream's worker, with one hand-off for the
 * whole graph). A failing node makes the target stream sticky as a failing
 * host task does, and the rest of that replay does not run. Launching an
 * executable graph that is still running from an earlier launch is
 * allowed; the launches run one after the other on a stream, and are
 * unordered across streams unless ordered by events.
 *
 * Lifetime. ph_graph_destroy and ph_graph_exec_destroy may be called while
 * a launch is queued or running: the nodes live until the last launch
 * that uses them has finished. Destroying a graph does not destroy its
 * instantiations.
 */

/* Statuses of this section (values of ph_status_t). */
enum {
  /* The call cannot be made while a stream captures (see the rules
   * above); the capture concerned is now invalidated. */
  PH_ERROR_STREAM_CAPTURE_UNSUPPORTED = 9,
  /* The stream's capture was invalidated by an earlier illegal call; end
   * it (which returns this status too) and capture again. */
  PH_ERROR_CAPTURE_INVALIDATED = 10,
};


typedef struct ph_graph* ph_graph_t;           /* a captured graph */
typedef struct ph_graph_exec* ph_graph_exec_t; /* an instantiated graph */

typedef enum ph_capture_mode {
  PH_CAPTURE_MODE_GLOBAL = 0,
  PH_CAPTURE_MODE_THREAD_LOCAL = 1,
  PH_CAPTURE_MODE_RELAXED = 2,
  PH_CAPTURE_MODE_MAX_ENUM = 0x7fffffff,
} ph_capture_mode_t;

typedef enum ph_capture_status {
  PH_CAPTURE_STATUS_NONE = 0,        /* the stream runs its work */
  PH_CAPTURE_STATUS_ACTIVE = 1,      /* the stream records its work */
  PH_CAPTURE_STATUS_INVALIDATED = 2, /* capturing, but invalidated */
  PH_CAPTURE_STATUS_MAX_ENUM = 0x7fffffff,
} ph_capture_status_t;

/* OPTIONAL. Starts capturing on `stream`, which becomes the capture's
 * origin. PH_ERROR_INVALID_ARGUMENT if the stream is already capturing or
 * `mode` is unknown; the stream's sticky error if it has one. Work queued
 * before the call is unaffected and still runs. */
PH_API ph_status_t ph_stream_begin_capture(ph_stream_t stream,
                                           ph_capture_mode_t mode);

/* OPTIONAL. Ends the capture that `stream` originated and gives its graph
 * (*out_graph, to be destroyed with ph_graph_destroy). An empty capture
 * gives an empty graph. PH_ERROR_INVALID_ARGUMENT if the stream is not
 * capturing or joined a capture it did not begin (the capture goes on);
 * PH_ERROR_CAPTURE_INVALIDATED if the capture was invalidated, or if a
 * joined stream was not joined back (the capture is then over and gives
 * no graph). */
PH_API ph_status_t ph_stream_end_capture(ph_stream_t stream,
                                         ph_graph_t* out_graph);

/* OPTIONAL. Whether `stream` is capturing, and a process-unique id of its
 * capture (0 when not capturing). Never blocks and is legal during
 * capture. */
PH_API ph_status_t ph_stream_get_capture_info(ph_stream_t stream,
                                              ph_capture_status_t* out_status,
                                              uint64_t* out_capture_id);

/* OPTIONAL. Number of recorded nodes in `graph` (for tests and tools). */
PH_API ph_status_t ph_graph_get_node_count(ph_graph_t graph,
                                           size_t* out_count);

/* OPTIONAL. An executable graph of `graph`'s nodes. The graph may be
 * instantiated several times and destroyed afterwards. */
PH_API ph_status_t ph_graph_instantiate(ph_graph_t graph,
                                        ph_graph_exec_t* out_exec);

/* OPTIONAL. Queues one run of `exec` on `stream` (see "Replay" above) and
 * returns at once. The stream's sticky error if it has one;
 * PH_ERROR_STREAM_CAPTURE_UNSUPPORTED if `stream` is capturing (a graph
 * inside a graph is not supported); PH_ERROR_INVALID_DEVICE if `stream`
 * belongs to another device than the captured streams. */
PH_API ph_status_t ph_graph_launch(ph_graph_exec_t exec, ph_stream_t stream);

/* OPTIONAL. Destroy an executable graph / a graph (see "Lifetime"). */
PH_API ph_status_t ph_graph_exec_destroy(ph_graph_exec_t exec);
PH_API ph_status_t ph_graph_destroy(ph_graph_t graph);

/* OPTIONAL. Writes a readable description of `graph` (its nodes in order,
 * with their kinds, names and dependencies) to the file `path`, in a
 * format of the driver's choosing (the fake writes Graphviz dot).
 * PH_ERROR_INVALID_ARGUMENT if the file cannot be written. */
PH_API ph_status_t ph_graph_debug_dump(ph_graph_t graph, const char* path);

#endif /* PHANTOM_HAL_GRAPH_H_ */
