/* Phantom HAL, OPTIONAL section "Activity trace" (since ABI 1005).
 *
 * What CUPTI's activity API is to CUDA: while tracing is on, the driver
 * keeps one record per piece of device work it ran (host work launched on
 * a stream, a copy, a fill) with its device, stream, start and end time,
 * and the correlation id the launching thread had set, so a profiler can
 * draw a timeline per stream and tie each piece of work to the host call
 * that queued it. The runtime drains the records with ph_activity_flush
 * and hands them to PyTorch's profiler.
 *
 * Included by phantom/hal.h; never include it alone. Every function here
 * is OPTIONAL: a driver without the section leaves the table members NULL
 * (or returns PH_ERROR_UNIMPLEMENTED), and the profiler then shows host
 * activity only, with one warning saying the driver records no device
 * activity.
 *
 * Rules:
 *  - Records cover work that *starts* while tracing is on. Work still
 *    queued when tracing is turned off is recorded if it starts before;
 *    the runtime waits for the devices before it stops tracing.
 *  - Times are nanoseconds on the driver's own clock, the one
 *    ph_activity_get_timestamp reads; the runtime translates them to the
 *    host profiler's clock.
 *  - Correlation: each host thread has a stack of correlation ids
 *    (ph_activity_push_correlation / ph_activity_pop_correlation). Work
 *    queued by a thread carries the id on top of that thread's stack at
 *    the call that queued it (0 when the stack is empty).
 *  - A graph replay (ph_graph_launch) leaves a record for each node it
 *    runs other than event records and waits (a copy, a fill or host
 *    work, as the captured call would have left), on the replaying
 *    stream's device and stream, in node order, carrying the correlation
 *    id of the ph_graph_launch call. The driver may also record the
 *    replay as a whole, as host work around them.
 *  - Records wait in the driver until flushed, oldest first. The driver
 *    may bound how many it keeps; past the bound it drops new records and
 *    counts them.
 *  - Thread safety: any thread may call any of these. Recording must not
 *    block the device's work on a lock the host holds for long.
 */
#ifndef PHANTOM_HAL_ACTIVITY_H_
#define PHANTOM_HAL_ACTIVITY_H_

#ifndef PHANTOM_HAL_H_
#error "include <phantom/hal.h>, not <phantom/hal_activity.h>"
#endif

typedef enum ph_activity_kind {
  /* Work queued with ph_launch_host_func or ph_run_host_func (a kernel,
   * on the fake); `name` is the task's name. */
  PH_ACTIVITY_HOST_WORK = 0,
  PH_ACTIVITY_MEMCPY = 1, /* ph_memcpy_async, ph_memcpy */
  PH_ACTIVITY_MEMSET = 2, /* ph_memset_async */
  PH_ACTIVITY_KIND_MAX_ENUM = 0x7fffffff,
} ph_activity_kind_t;

typedef struct ph_activity_record {
  ph_activity_kind_t kind;
  int device;              /* the device whose stream ran it */
  /* The driver's number for the stream, unique among the process's
   * streams and never reused; 0 for a blocking ph_memcpy, which runs on
   * no stream. */
  uint64_t stream_id;
  uint64_t start_ns;       /* driver clock (ph_activity_get_timestamp) */
  uint64_t end_ns;
  uint64_t correlation_id; /* see "Correlation" above */
  /* Host work: the task's name (a static string). Copies, fills: NULL. */
  const char* name;
  uint64_t bytes;          /* copies and fills; 0 for host work */
  ph_memcpy_kind_t copy_kind; /* copies; PH_MEMCPY_HOST_TO_HOST otherwise */
} ph_activity_record_t;

/* Starts recording on every device. Calls nest: tracing stays on until as
 * many ph_activity_disable calls. PH_ERROR_NOT_INITIALIZED before the
 * device started. */
PH_API ph_status_t ph_activity_enable(void);

/* Undoes one ph_activity_enable. Records already made stay until flushed.
 * PH_ERROR_INVALID_ARGUMENT when tracing is not on. */
PH_API ph_status_t ph_activity_disable(void);

/* The driver's clock now, in nanoseconds. PH_ERROR_INVALID_ARGUMENT if
 * out_ns is NULL. */
PH_API ph_status_t ph_activity_get_timestamp(uint64_t* out_ns);

/* Pushes `id` on the calling thread's correlation stack; work the thread
 * queues from now on carries it. */
PH_API ph_status_t ph_activity_push_correlation(uint64_t id);

/* Pops the calling thread's correlation stack.
 * PH_ERROR_INVALID_ARGUMENT when it is empty. */
PH_API ph_status_t ph_activity_pop_correlation(void);

/* Moves up to `capacity` finished records, oldest first, into `records`,
 * an array of elements `record_size` bytes apart (the caller's
 * sizeof(ph_activity_record_t)): the driver writes the fields that lie
 * wholly within record_size and zeroes the rest of each element, so a
 * caller built against an older, shorter record reads correctly.
 * *out_count receives how many were written; call again while it equals
 * capacity. *out_dropped (may be NULL) receives the records dropped
 * since the previous flush because the driver's buffer was full.
 * PH_ERROR_INVALID_ARGUMENT if records or out_count is NULL while capacity
 * is non-zero, or record_size is smaller than the record up to and
 * including `correlation_id`. */
PH_API ph_status_t ph_activity_flush(void* records, size_t record_size,
                                     size_t capacity, size_t* out_count,
                                     uint64_t* out_dropped);

#endif /* PHANTOM_HAL_ACTIVITY_H_ */
