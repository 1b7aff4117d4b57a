/*
 * phantom/hal.h — the hardware abstraction layer of the Phantom backend.
 *
 * This is the one header a device vendor implements. Everything above it
 * (device guard, streams, events, allocators, generator, operator dispatch,
 * the Python module) is written against these functions alone, so a driver
 * that passes the conformance suite in tests/hal runs the whole backend.
 *
 * Conventions
 *  - Every fallible call returns a ph_status_t. PH_SUCCESS is 0.
 *    PH_NOT_READY is an answer ("work still pending"), not an error.
 *  - Output parameters come last, are named out_*, and are cleared on entry
 *    (set to 0/NULL) so a failed call never leaves a stale value behind.
 *  - After any call that returns an error, ph_last_error_message() on the
 *    same thread returns a sentence saying what was wrong. The message is
 *    thread-local and stays valid until the next failing call on that thread.
 *  - Handles (ph_stream_t, ph_event_t) are opaque. Passing a destroyed or
 *    foreign handle returns PH_ERROR_INVALID_HANDLE where the driver can
 *    detect it; it never crashes the driver.
 *  - Device memory is not host-addressable: a device pointer may be passed
 *    to the functions below, but host code must not dereference it.
 *  - Device errors (the error model). Queued work that fails (a host task
 *    returning an error) makes its stream *sticky*: the launch that queued
 *    it returned PH_SUCCESS; the failure's status and a message naming the
 *    failed work and its device are returned by every later query,
 *    synchronize, launch, copy and fill on that stream; work queued behind
 *    it is released without running (event records still mark their
 *    point). A failure reaches exactly the work that depends on it:
 *      - an event recorded after failed work carries the failure, as it
 *        was at the record's place in the queue, to ph_event_query (once
 *        reached), ph_event_synchronize and ph_stream_wait_event, until the
 *        event is recorded again (destroying the recording stream does not
 *        clear it); a record made before the failure carries nothing;
 *      - a stream that waits on a record carrying a failure becomes sticky
 *        with it at the wait's place in its queue: its work queued before
 *        the wait runs, its work queued after does not, and it reports the
 *        original status, with a message that says the failure was
 *        inherited through an event and then gives the original message.
 *        So a failure travels along every chain of waits, across streams
 *        and devices, and whatever ran after such a wait (a kernel, a copy
 *        to another device or to the host) reports it instead of
 *        succeeding on data that was never computed;
 *      - work on streams that never waited, directly or through other
 *        streams, on a record after the failure is not affected.
 *    ph_device_synchronize returns the first sticky error among the
 *    device's streams. ph_stream_destroy discards a stream's sticky error
 *    and a new stream starts clean: after reporting an error, a program
 *    goes on with fresh streams (and re-records the events it reuses).
 *  - Unless stated otherwise every function is thread-safe.
 *
 * Optional entry points are marked OPTIONAL; a driver that does not provide
 * the capability leaves its member of the driver table NULL or returns
 * PH_ERROR_UNIMPLEMENTED (the two mean the same), and the runtime has a
 * fallback documented next to the function.
 *
 * A driver is a shared library the runtime opens at start-up and reaches
 * through one exported entry point, ph_driver_get_table, which returns the
 * table of the functions below ("The driver table" at the end). The ph_*
 * functions declared here are what callers above the HAL call: the runtime
 * defines them and forwards each through the table.
 */
#ifndef PHANTOM_HAL_H_
#define PHANTOM_HAL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PH_API __declspec(dllexport)
#else
#define PH_API __attribute__((visibility("default")))
#endif

/* The ABI version of this header: major * 1000 + minor.
 *
 * Version rule. The runtime loads a driver through its table (see "The
 * driver table" at the end) and refuses one whose abi_version differs in
 * the major part (version / 1000) from the runtime's, with a sentence
 * naming the library and both versions. A driver of an older minor loads:
 * the table members past the driver's struct_size (those later minors
 * added) count as NULL, i.e. "not supported", and the runtime uses the
 * fallback documented next to each. A driver of a newer minor also loads;
 * the runtime reads only the members its own header declares. A minor
 * only ever adds: table members and struct fields at the end, OPTIONAL
 * calls, flags. Anything else is a new major. */
#define PH_HAL_ABI_VERSION 1006

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

typedef enum ph_status {
  PH_SUCCESS = 0,
  /* Queued work has not finished yet. Not an error. */
  PH_NOT_READY = 1,
  /* An argument is out of range or malformed (null out pointer, zero-sized
   * request where one is not allowed, unknown enum value, ...). */
  PH_ERROR_INVALID_ARGUMENT = 2,
  /* A device index is negative or >= the device count. */
  PH_ERROR_INVALID_DEVICE = 3,
  /* A stream, event or pointer handle is null, destroyed or foreign. */
  PH_ERROR_INVALID_HANDLE = 4,
  /* The device (or pinned host pool) cannot satisfy an allocation. */
  PH_ERROR_OUT_OF_MEMORY = 5,
  /* Work running on the device failed. Sticky on its stream. */
  PH_ERROR_DEVICE = 6,
  /* The driver does not implement this capability. */
  PH_ERROR_UNIMPLEMENTED = 7,
  /* The driver could not start: bad configuration or no devices. */
  PH_ERROR_NOT_INITIALIZED = 8,
  /* Not a status: makes every int a valid value of the type, so a C++
   * driver may inspect a value a C caller passed (e.g. to
   * ph_status_name) without undefined behaviour. */
  PH_STATUS_MAX_ENUM = 0x7fffffff,
} ph_status_t;

/* A static, human-readable name for a status ("PH_ERROR_OUT_OF_MEMORY").
 * Unknown values give "PH_STATUS_UNKNOWN". Never fails. */
PH_API const char* ph_status_name(ph_status_t status);

/* The message of the last failing call on the calling thread, or "" if no
 * call on this thread has failed. Never fails. */
PH_API const char* ph_last_error_message(void);

/* PH_HAL_ABI_VERSION of the header the driver was built with: the
 * abi_version of its table. The runtime answers it from the table; a
 * driver need not define it. */
PH_API uint32_t ph_abi_version(void);

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

/* Versioned by size, as ph_device_telemetry_t: the caller sets
 * struct_size to sizeof(ph_device_properties_t) as its header declares it;
 * the driver writes only the fields that lie wholly within struct_size
 * (and within its own struct), so fields added at the end by a later
 * minor neither break an older driver nor an older caller. Since ABI 1003
 * (before it the struct began at `name`). */
typedef struct ph_device_properties {
  size_t struct_size;       /* in: sizeof the caller's struct */
  char name[64];            /* e.g. "Phantom fake accelerator" */
  size_t total_memory;      /* bytes of device memory */
  int multiprocessor_count; /* compute units; informational */
  int stream_priority_low;  /* numerically greatest (lowest) priority */
  int stream_priority_high; /* numerically least (highest) priority */
  /* PH_DEVICE_* capability bits (since ABI 1006; 0 from older drivers). */
  uint32_t flags;
} ph_device_properties_t;

/* Bits of ph_device_properties_t.flags. */
enum {
  /* The device's copies into pinned host memory (ph_memcpy_async to a
   * ph_host_malloc block) write the memory whatever protection the host
   * process has set on its own mapping of those pages (mprotect): a DMA
   * engine writes physical pages. The runtime relies on it to protect a
   * non_blocking device-to-host copy's destination from host reads until
   * the host has seen the copy finish (the race detector); without the
   * bit it never protects pinned memory. */
  PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION = 1u << 0,
};

/* Number of devices. Returns PH_ERROR_NOT_INITIALIZED (with *out_count = 0)
 * if the driver could not start, e.g. because its configuration is invalid;
 * the message says which setting was wrong. */
PH_API ph_status_t ph_device_count(int* out_count);

/* The calling thread's current device (initially 0). */
PH_API ph_status_t ph_get_device(int* out_device);

/* Makes `device` current for the calling thread.
 * PH_ERROR_INVALID_DEVICE if out of range. */
PH_API ph_status_t ph_set_device(int device);

/* Fills *out_props for `device`. The caller sets out_props->struct_size
 * first; the driver clears the rest of the caller's struct (up to
 * struct_size) on entry, then fills what fits. PH_ERROR_INVALID_ARGUMENT
 * if out_props is NULL or struct_size is smaller than
 * PH_DEVICE_PROPERTIES_MIN_SIZE (the struct as of ABI 1003);
 * PH_ERROR_INVALID_DEVICE if out of range. */
#define PH_DEVICE_PROPERTIES_MIN_SIZE \
  (offsetof(ph_device_properties_t, stream_priority_high) + sizeof(int))
PH_API ph_status_t ph_device_get_properties(int device,
                                            ph_device_properties_t* out_props);

/* Blocks until all work queued on every stream of `device` has finished.
 * Returns the first sticky error among the device's streams, if any,
 * inherited ones included (see "Device errors" above).
 * PH_ERROR_INVALID_ARGUMENT if called from work running on a stream of the
 * same device (it would wait for itself). */
PH_API ph_status_t ph_device_synchronize(int device);

/* ------------------------------------------------------------------------ */
/* Device telemetry (OPTIONAL)                                              */
/* ------------------------------------------------------------------------ */

/* Bits of ph_device_telemetry_t.valid: which measurements the driver
 * filled in. A measurement the device cannot take (a sensor it does not
 * have) keeps its bit clear and its field 0. */
enum {
  PH_TELEMETRY_UTILIZATION = 1u << 0, /* utilization_percent */
  PH_TELEMETRY_MEMORY_BUSY = 1u << 1, /* memory_busy_percent */
  PH_TELEMETRY_TEMPERATURE = 1u << 2, /* temperature_c */
  PH_TELEMETRY_POWER = 1u << 3,       /* power_draw_mw */
  PH_TELEMETRY_CLOCK = 1u << 4,       /* clock_mhz */
};

/* What the device reports about its own state (what a vendor's
 * management tool shows). Versioned by size: the caller sets struct_size
 * to sizeof(ph_device_telemetry_t) as its header declares it; the driver
 * writes only the fields that lie wholly within struct_size, so a caller
 * built against an older, shorter struct and a driver built against a
 * newer one (or the reverse) still agree. Fields are only ever added at
 * the end. */
typedef struct ph_device_telemetry {
  size_t struct_size;           /* in: sizeof the caller's struct */
  uint32_t valid;               /* out: PH_TELEMETRY_* bits */
  /* Percent (0..100) of the sample period during which work launched on
   * at least one of the device's streams was running. */
  uint32_t utilization_percent;
  /* Percent (0..100) of the sample period during which device memory was
   * being read or written by a copy or fill. */
  uint32_t memory_busy_percent;
  int32_t temperature_c;        /* degrees Celsius */
  uint32_t power_draw_mw;       /* milliwatts, averaged over the period */
  uint32_t clock_mhz;           /* compute clock, megahertz */
  /* The period the two percentages cover, in microseconds, ending at
   * the call. */
  uint64_t sample_period_us;
} ph_device_telemetry_t;

/* OPTIONAL. Fills *out_telemetry for `device`. The caller sets
 * out_telemetry->struct_size first; the driver clears the rest of the
 * caller's struct (up to struct_size) on entry, as with every out
 * parameter, then fills what it measures. PH_ERROR_INVALID_ARGUMENT if
 * out_telemetry is NULL or struct_size is smaller than the struct up to
 * and including `valid`; PH_ERROR_INVALID_DEVICE if out of range.
 * A driver without telemetry returns PH_ERROR_UNIMPLEMENTED; the runtime
 * then reports every measurement as unavailable (torch.phantom.utilization()
 * and friends raise, saying so), and device_memory_used() still works from
 * ph_mem_get_info. Since ABI 1002. */
PH_API ph_status_t ph_device_get_telemetry(int device,
                                           ph_device_telemetry_t* out_telemetry);

/* ------------------------------------------------------------------------ */
/* Memory                                                                   */
/* ------------------------------------------------------------------------ */

/* Free and total device memory in bytes, as seen by the driver. */
PH_API ph_status_t ph_mem_get_info(int device, size_t* out_free,
                                   size_t* out_total);

/* Allocates `size` bytes of device memory, aligned to at least 256 bytes.
 * size == 0 gives *out_ptr == NULL and PH_SUCCESS.
 * PH_ERROR_OUT_OF_MEMORY if the device has no free range that large;
 * PH_ERROR_INVALID_DEVICE if out of range. The memory's contents are
 * unspecified. The pointer is not host-addressable. */
PH_API ph_status_t ph_malloc(int device, size_t size, void** out_ptr);

/* Returns device memory from ph_malloc to the driver at once. The caller
 * must ensure no queued work still uses it (synchronize first).
 * NULL is a no-op. PH_ERROR_INVALID_HANDLE if `ptr` is not the start of a
 * live device allocation. */
PH_API ph_status_t ph_free(void* ptr);

/* Allocates page-aligned, host-addressable ("pinned") memory that the copy
 * engine can read and write asynchronously. size == 0 gives NULL. */
PH_API ph_status_t ph_host_malloc(size_t size, void** out_ptr);

/* Frees memory from ph_host_malloc. NULL is a no-op.
 * PH_ERROR_INVALID_HANDLE if `ptr` is not the start of a pinned block. */
PH_API ph_status_t ph_host_free(void* ptr);

typedef enum ph_memory_type {
  PH_MEMORY_UNREGISTERED = 0, /* ordinary (pageable) host memory */
  PH_MEMORY_HOST_PINNED = 1,  /* inside a ph_host_malloc block */
  PH_MEMORY_DEVICE = 2,       /* inside a ph_malloc block */
} ph_memory_type_t;

typedef struct ph_pointer_attributes {
  ph_memory_type_t type;
  int device;      /* device index for PH_MEMORY_DEVICE, else -1 */
  void* base;      /* start of the enclosing allocation, or NULL */
  size_t size;     /* size of the enclosing allocation, or 0 */
} ph_pointer_attributes_t;

/* Classifies any pointer. Never fails for a non-NULL out parameter: an
 * unknown pointer is PH_MEMORY_UNREGISTERED. */
PH_API ph_status_t ph_pointer_get_attributes(const void* ptr,
                                             ph_pointer_attributes_t* out_attr);

/* OPTIONAL. Inside work launched with ph_launch_host_func, the address at
 * which that work may read and write the device memory `device_ptr` points
 * into. This is what lets host-code kernels (the fake device computes with
 * the CPU's kernels) run over device memory without copying.
 * PH_ERROR_INVALID_ARGUMENT when `device_ptr` is not device memory or when
 * called outside work running on a stream (host code must never touch
 * device memory). Drivers of real hardware return PH_ERROR_UNIMPLEMENTED;
 * the operator layer then has no zero-copy generic path. */
PH_API ph_status_t ph_kernel_address(const void* device_ptr, void** out_ptr);

/* ------------------------------------------------------------------------ */
/* Streams                                                                  */
/* ------------------------------------------------------------------------ */

/* A stream is an in-order queue of work on one device. Work on different
 * streams is unordered unless ordered by events. */
typedef struct ph_stream* ph_stream_t;
/* An event marks a point in a stream's queue. */
typedef struct ph_event* ph_event_t;

/* Creates a stream on `device`. `priority` is clamped to the range in
 * ph_device_properties_t. PH_ERROR_INVALID_DEVICE if out of range. */
PH_API ph_status_t ph_stream_create(int device, int priority,
                                    ph_stream_t* out_stream);

/* Waits for the stream's queued work to finish, then destroys it. A sticky
 * error on the stream is discarded; events recorded on the stream keep the
 * failure they carry. PH_ERROR_INVALID_HANDLE for an unknown
 * handle; PH_ERROR_INVALID_ARGUMENT if called from work on that stream. */
PH_API ph_status_t ph_stream_destroy(ph_stream_t stream);

/* PH_SUCCESS if every piece of work queued so far has finished,
 * PH_NOT_READY if some is queued or still running, or the stream's
 * sticky error (its own work's, or inherited through an event wait).
 * Never blocks. */
PH_API ph_status_t ph_stream_query(ph_stream_t stream);

/* Blocks until all work queued so far has finished. Returns PH_SUCCESS or
 * the stream's sticky error (its own work's, or inherited through an event
 * wait). PH_ERROR_INVALID_ARGUMENT if called from work running on the same
 * stream. */
PH_API ph_status_t ph_stream_synchronize(ph_stream_t stream);

PH_API ph_status_t ph_stream_get_device(ph_stream_t stream, int* out_device);
PH_API ph_status_t ph_stream_get_priority(ph_stream_t stream, int* out_priority);

/* Work queued on `stream` after this call does not start until the point
 * `event` marked when it was last recorded *before this call* has been
 * reached; a later re-record of the event does not affect this wait.
 * An event never recorded imposes no wait. The event may belong to another
 * device. If that record carries a failure, `stream` becomes sticky with it
 * once the wait is reached in its queue, and work queued after the wait
 * does not run ("Device errors" above); the call itself returns
 * PH_SUCCESS, also on a stream that is already sticky. */
PH_API ph_status_t ph_stream_wait_event(ph_stream_t stream, ph_event_t event);

/* Host work queued on a stream. `run` executes on the stream's worker, in
 * order with the stream's other work; while it runs, ph_kernel_address
 * is valid for device memory. It returns PH_SUCCESS, or an error status
 * after writing a sentence into `error` (at most `error_size` bytes,
 * NUL-terminated); the stream then becomes sticky with that status and a
 * message naming the task. `release` (may be NULL) is called exactly once
 * for every task accepted by ph_launch_host_func: after `run`, or instead
 * of it when the stream already has a sticky error or is destroyed. */
typedef struct ph_host_task {
  const char* name; /* static string naming the work, e.g. the op */
  ph_status_t (*run)(void* user_data, char* error, size_t error_size);
  void (*release)(void* user_data);
  void* user_data;
} ph_host_task_t;

/* Queues `task` on `stream` and returns at once. If the stream already has
 * a sticky error, the task is released without running and the error is
 * returned. A launch must not wait for the stream's own work: it may come
 * from that work, or from a thread holding a lock that work needs (the
 * runtime records events under its allocator's mutex, and device work
 * allocates). A driver whose hardware queue is bounded keeps the excess
 * on the host, as the fake does beyond its 1,024-slot ring. On any error
 * return, `release` has been called. */
PH_API ph_status_t ph_launch_host_func(ph_stream_t stream,
                                       const ph_host_task_t* task);

/* Runs `task` in `stream`'s order and returns once it has completed: what
 * ph_launch_host_func followed by waiting for that one task would do (work
 * other threads queue after it is not waited for). Returns PH_SUCCESS if
 * the task ran and succeeded; otherwise the stream's sticky error (the
 * task's own failure, or an earlier task's that made the stream skip it),
 * with the message set. When the stream is idle the driver may run the
 * task on the calling thread, as the fake driver does (no thread hand-off:
 * this is what keeps a host-computed op that must wait for its result
 * cheap), so `run` must not depend on the thread it runs on.
 * PH_ERROR_INVALID_ARGUMENT when called from work running on `stream`
 * itself (it would wait for itself). A driver without a cheaper way may
 * implement it as launch + wait; one that cannot run host work at all
 * returns PH_ERROR_UNIMPLEMENTED after releasing the task. On any error
 * return, `release` has been called. Since ABI 1001.
 * Fallback: when the table member is NULL, or the driver returns
 * PH_ERROR_UNIMPLEMENTED for it (the runtime then stops asking), the
 * runtime queues the task with ph_launch_host_func and blocks until it has
 * run or been released, then reports the task's failure or the stream's
 * sticky error as above. The fallback cannot tell a call made from work
 * running on `stream` itself (which would wait for itself); the runtime
 * never makes one. */
PH_API ph_status_t ph_run_host_func(ph_stream_t stream,
                                    const ph_host_task_t* task);

/* ------------------------------------------------------------------------ */
/* Copies                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum ph_memcpy_kind {
  PH_MEMCPY_HOST_TO_HOST = 0,
  PH_MEMCPY_HOST_TO_DEVICE = 1,
  PH_MEMCPY_DEVICE_TO_HOST = 2,
  PH_MEMCPY_DEVICE_TO_DEVICE = 3, /* also between two devices */
  /* Not a kind: keeps out-of-range values well-defined (see
   * PH_STATUS_MAX_ENUM); they are refused with PH_ERROR_INVALID_ARGUMENT. */
  PH_MEMCPY_KIND_MAX_ENUM = 0x7fffffff,
} ph_memcpy_kind_t;

/* Copies `size` bytes and returns when the copy is complete. Not ordered
 * with any stream: synchronize the streams that use the memory first.
 * PH_ERROR_INVALID_ARGUMENT if a pointer's memory type contradicts `kind`
 * or a range runs past the end of its allocation. */
PH_API ph_status_t ph_memcpy(void* dst, const void* src, size_t size,
                             ph_memcpy_kind_t kind);

/* Queues a copy on `stream`, after the stream's earlier work. When the host
 * side is pinned (or the copy is device to device) the call returns at once.
 * When the host side is pageable, the call blocks until the copy is done,
 * as a DMA engine cannot read pageable memory after the call returns.
 * On a sticky stream the call returns the sticky error and copies nothing;
 * a blocking copy that was skipped because the stream became sticky while
 * it waited (its own earlier work failed, or a wait inherited a failure)
 * returns that error and leaves the destination untouched. */
PH_API ph_status_t ph_memcpy_async(void* dst, const void* src, size_t size,
                                   ph_memcpy_kind_t kind, ph_stream_t stream);

/* Queues a fill of `size` bytes of device memory with the byte `value`.
 * On a sticky stream the call returns the sticky error. */
PH_API ph_status_t ph_memset_async(void* dst, int value, size_t size,
                                   ph_stream_t stream);

/* ------------------------------------------------------------------------ */
/* Events                                                                   */
/* ------------------------------------------------------------------------ */

enum {
  PH_EVENT_DEFAULT = 0,
  PH_EVENT_DISABLE_TIMING = 1, /* elapsed_time is refused */
};

/* Creates an event with PH_EVENT_* flags. */
PH_API ph_status_t ph_event_create(unsigned flags, ph_event_t* out_event);

/* Destroys the event. Waits already queued on it still complete correctly. */
PH_API ph_status_t ph_event_destroy(ph_event_t event);

/* Marks the current end of `stream`'s queue. Each record starts a new
 * generation; queries and waits refer to the latest record at their call.
 * Accepted on a sticky stream: the record then carries that failure. */
PH_API ph_status_t ph_event_record(ph_event_t event, ph_stream_t stream);

/* PH_SUCCESS if the recorded point has been reached (or the event was never
 * recorded), PH_NOT_READY if not yet, or, once reached, the failure of work
 * before the point ("Device errors" above). Never blocks. */
PH_API ph_status_t ph_event_query(ph_event_t event);

/* Blocks until the recorded point has been reached. Returns PH_SUCCESS or
 * the failure the record carries: that of work before the point on the
 * recording stream (its own, or inherited), not of work queued after it. */
PH_API ph_status_t ph_event_synchronize(ph_event_t event);

/* Milliseconds between two reached records. PH_ERROR_INVALID_ARGUMENT if
 * either was created with PH_EVENT_DISABLE_TIMING or never recorded;
 * PH_NOT_READY if either has not been reached yet. */
PH_API ph_status_t ph_event_elapsed_time(ph_event_t start, ph_event_t end,
                                         float* out_ms);

/* ------------------------------------------------------------------------ */
/* Interprocess sharing (OPTIONAL, since ABI 1002)                          */
/* ------------------------------------------------------------------------ */
/*
 * Another process on the same machine can use a device allocation, and
 * wait for an event, as CUDA's cudaIpc* functions allow. The exporting
 * process turns the allocation (or event) into a handle: a fixed-size
 * block of bytes with no pointers in it, which it sends by any means (a
 * pipe, a socket, a file). The importing process opens the handle and gets
 * a device pointer (an event) of its own that reaches the same bytes (the
 * same sequence of records).
 *
 * Capability. A driver that cannot share device memory returns
 * PH_ERROR_UNIMPLEMENTED from all three ph_ipc_*_mem_handle functions, and
 * one that cannot share events returns it from ph_ipc_get_event_handle and
 * ph_ipc_open_event_handle and refuses PH_EVENT_INTERPROCESS in
 * ph_event_create. For the runtime, PH_ERROR_UNIMPLEMENTED from
 * ph_ipc_get_mem_handle means "this memory cannot leave the process": it
 * refuses, at the call that sends a tensor to another process, with a
 * sentence saying to send tensor.cpu() instead.
 *
 * Handles are valid in processes of the same user on the same machine
 * while the exporting process is alive; a handle is refused with
 * PH_ERROR_INVALID_HANDLE (and a sentence saying why) when its exporter has
 * exited or freed what it names and the driver can tell. Opening a handle in
 * the process that exported it is refused with PH_ERROR_INVALID_ARGUMENT:
 * that process uses its own pointer or event.
 *
 * Memory: ownership and lifetime.
 *  - A handle names the whole live allocation that contains the exported
 *    pointer (the `base` and `size` ph_pointer_get_attributes reports), and
 *    the importer's pointer is that allocation's start. The caller sends the
 *    offset of the part it means: a caching allocator hands out pieces of
 *    one ph_malloc allocation.
 *  - The exporter keeps ownership: the allocation stays its own, and it
 *    must not ph_free it while an importer may still use it (the runtime
 *    counts importers' uses across processes for that). What an importer
 *    reads or writes there after the exporter has freed it is undefined.
 *  - Every successful ph_ipc_open_mem_handle is matched by one
 *    ph_ipc_close_mem_handle. Opening a handle that this process already
 *    has open returns the same pointer and counts one more open; the last
 *    close unmaps it. Closing never frees the exporter's memory.
 *  - The importer's pointer is device memory of the device index the
 *    handle names, in the importing process (the same index as in the
 *    exporter), as good as its own allocations for copies, fills, work on
 *    streams and ph_kernel_address, never host-addressable. It is not a
 *    ph_malloc allocation: ph_free refuses it, and it does not count
 *    against the importer's ph_mem_get_info.
 *  - Nothing orders the two processes' work: exporting does not wait for
 *    work queued on the memory. Record an interprocess event after that
 *    work and make the importer wait for it.
 */

#define PH_IPC_HANDLE_SIZE 64

typedef struct ph_ipc_mem_handle {
  unsigned char reserved[PH_IPC_HANDLE_SIZE];
} ph_ipc_mem_handle_t;

typedef struct ph_ipc_event_handle {
  unsigned char reserved[PH_IPC_HANDLE_SIZE];
} ph_ipc_event_handle_t;

/* OPTIONAL. A handle to the live allocation containing `device_ptr` (any
 * address inside it). PH_ERROR_INVALID_ARGUMENT if `device_ptr` is not
 * inside a live ph_malloc allocation (an imported pointer cannot be
 * exported again: send the handle it was opened from);
 * PH_ERROR_UNIMPLEMENTED if the driver cannot share memory; it may also
 * fail with PH_ERROR_OUT_OF_MEMORY when it needs host resources to share
 * the allocation and has none. */
PH_API ph_status_t ph_ipc_get_mem_handle(const void* device_ptr,
                                         ph_ipc_mem_handle_t* out_handle);

/* OPTIONAL. Opens a handle exported by another process: *out_ptr is the
 * start of the allocation in this process (see above). Errors:
 * PH_ERROR_INVALID_HANDLE for bytes that are not a handle or name what no
 * longer exists, PH_ERROR_INVALID_ARGUMENT when this process exported it,
 * PH_ERROR_INVALID_DEVICE when this process has no device of that index,
 * PH_ERROR_OUT_OF_MEMORY when the device's address range has no room to
 * map it. */
PH_API ph_status_t ph_ipc_open_mem_handle(const ph_ipc_mem_handle_t* handle,
                                          void** out_ptr);

/* OPTIONAL. Undoes one ph_ipc_open_mem_handle of `device_ptr` (the pointer
 * it returned). The caller must ensure no queued work of this process
 * still uses it (synchronize first). PH_ERROR_INVALID_HANDLE if `ptr` is
 * not an open import. */
PH_API ph_status_t ph_ipc_close_mem_handle(void* device_ptr);

/* Flag of ph_event_create: the event may be shared with
 * ph_ipc_get_event_handle. Must be combined with PH_EVENT_DISABLE_TIMING
 * (as CUDA requires), else PH_ERROR_INVALID_ARGUMENT;
 * PH_ERROR_UNIMPLEMENTED from a driver that cannot share events. */
enum { PH_EVENT_INTERPROCESS = 2 };

/* OPTIONAL. A handle to `event`, which was created with
 * PH_EVENT_INTERPROCESS (else PH_ERROR_INVALID_ARGUMENT) or opened from a
 * handle. */
PH_API ph_status_t ph_ipc_get_event_handle(ph_event_t event,
                                           ph_ipc_event_handle_t* out_handle);

/* OPTIONAL. Opens an event exported by another process. The new event
 * behaves as one created here with PH_EVENT_INTERPROCESS |
 * PH_EVENT_DISABLE_TIMING, and shares its records with the exporter's:
 * a record in either process is the latest record for queries,
 * synchronizes and stream waits in both. Destroy it with ph_event_destroy
 * (the exporter's event lives on). If the work recorded before the latest
 * record failed on its device, query and synchronize in the other process
 * return PH_ERROR_DEVICE, and work waiting for it fails with that status,
 * with a sentence naming the exporting process; the original message stays
 * in the process that ran the work. After the exporter destroys its event,
 * the importer's queries see it as reached. */
PH_API ph_status_t ph_ipc_open_event_handle(
    const ph_ipc_event_handle_t* handle, ph_event_t* out_event);

/* ------------------------------------------------------------------------ */
/* Graph capture and replay (OPTIONAL, ABI 1004): phantom/hal_graph.h       */
/* ------------------------------------------------------------------------ */
#include "hal_graph.h"

/* The one table of status names: what ph_status_name returns for each
 * status of this header (drivers and the runtime answer with it, so the
 * names cannot drift apart), "PH_STATUS_UNKNOWN" for any other value. */
static inline const char* ph_status_name_of(ph_status_t status) {
  switch ((int)status) {
    case PH_SUCCESS: return "PH_SUCCESS";
    case PH_NOT_READY: return "PH_NOT_READY";
    case PH_ERROR_INVALID_ARGUMENT: return "PH_ERROR_INVALID_ARGUMENT";
    case PH_ERROR_INVALID_DEVICE: return "PH_ERROR_INVALID_DEVICE";
    case PH_ERROR_INVALID_HANDLE: return "PH_ERROR_INVALID_HANDLE";
    case PH_ERROR_OUT_OF_MEMORY: return "PH_ERROR_OUT_OF_MEMORY";
    case PH_ERROR_DEVICE: return "PH_ERROR_DEVICE";
    case PH_ERROR_UNIMPLEMENTED: return "PH_ERROR_UNIMPLEMENTED";
    case PH_ERROR_NOT_INITIALIZED: return "PH_ERROR_NOT_INITIALIZED";
    case PH_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return "PH_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case PH_ERROR_CAPTURE_INVALIDATED: return "PH_ERROR_CAPTURE_INVALIDATED";
    default: return "PH_STATUS_UNKNOWN";
  }
}

/* ------------------------------------------------------------------------ */
/* Activity trace (OPTIONAL, ABI 1005): phantom/hal_activity.h              */
/* ------------------------------------------------------------------------ */
#include "hal_activity.h"

/* ------------------------------------------------------------------------ */
/* The driver table (since ABI 1003)                                        */
/* ------------------------------------------------------------------------ */
/*
 * Loading. The runtime links no driver. At its first use of the device it
 * opens the library the setting PHANTOM_DRIVER names (a path, or a file
 * name searched as the dynamic loader searches from the runtime library,
 * whose run path holds its own folder; by default the driver the build
 * chose, the fake, installed next to the runtime), looks up
 * ph_driver_get_table, calls it with the runtime's PH_HAL_ABI_VERSION and
 * checks the table once: its major version (see PH_HAL_ABI_VERSION), and
 * that every member not marked OPTIONAL is set. A library that cannot be
 * opened, has no entry point, returns NULL, has another major or lacks a
 * required member is refused with a sentence naming the file and what to
 * do; every ph_* call then returns PH_ERROR_NOT_INITIALIZED with that
 * sentence, as from a driver that could not start.
 *
 * Members. One per ph_* function above, with its signature, grouped by the
 * ABI that added them and only ever appended. Required ones must be set.
 * OPTIONAL ones may be NULL ("not supported": the runtime uses the
 * function's documented fallback, as for PH_ERROR_UNIMPLEMENTED). Members
 * past the driver's struct_size are treated as NULL, so a table built
 * against an older minor is read correctly.
 *
 * Symbols. The library must export ph_driver_get_table. It may export
 * other symbols, including its own ph_* functions (the fake does, so tests
 * can link it directly), but the runtime defines the ph_* names too: the
 * driver must bind its own references inside itself (link with
 * -Wl,-Bsymbolic, or give its implementations internal names), else its
 * calls to its own ph_* functions reach the runtime's.
 *
 * Lifetime. The table is static: it stays valid and unchanged while the
 * library is loaded (the runtime never unloads it).
 */
typedef struct ph_driver_table {
  /* sizeof(ph_driver_table_t) as the driver's header declares it. */
  size_t struct_size;
  /* PH_HAL_ABI_VERSION of the driver's header. */
  uint32_t abi_version;

  /* ABI 1000 */
  const char* (*status_name)(ph_status_t status);
  const char* (*last_error_message)(void);
  ph_status_t (*device_count)(int* out_count);
  ph_status_t (*get_device)(int* out_device);
  ph_status_t (*set_device)(int device);
  ph_status_t (*device_get_properties)(int device,
                                       ph_device_properties_t* out_props);
  ph_status_t (*device_synchronize)(int device);
  ph_status_t (*mem_get_info)(int device, size_t* out_free,
                              size_t* out_total);
  ph_status_t (*malloc)(int device, size_t size, void** out_ptr);
  ph_status_t (*free)(void* ptr);
  ph_status_t (*host_malloc)(size_t size, void** out_ptr);
  ph_status_t (*host_free)(void* ptr);
  ph_status_t (*pointer_get_attributes)(const void* ptr,
                                        ph_pointer_attributes_t* out_attr);
  /* OPTIONAL: without it the operator layer has no zero-copy generic
   * path (see ph_kernel_address). */
  ph_status_t (*kernel_address)(const void* device_ptr, void** out_ptr);
  ph_status_t (*stream_create)(int device, int priority,
                               ph_stream_t* out_stream);
  ph_status_t (*stream_destroy)(ph_stream_t stream);
  ph_status_t (*stream_query)(ph_stream_t stream);
  ph_status_t (*stream_synchronize)(ph_stream_t stream);
  ph_status_t (*stream_get_device)(ph_stream_t stream, int* out_device);
  ph_status_t (*stream_get_priority)(ph_stream_t stream, int* out_priority);
  ph_status_t (*stream_wait_event)(ph_stream_t stream, ph_event_t event);
  ph_status_t (*launch_host_func)(ph_stream_t stream,
                                  const ph_host_task_t* task);
  ph_status_t (*memcpy)(void* dst, const void* src, size_t size,
                        ph_memcpy_kind_t kind);
  ph_status_t (*memcpy_async)(void* dst, const void* src, size_t size,
                              ph_memcpy_kind_t kind, ph_stream_t stream);
  ph_status_t (*memset_async)(void* dst, int value, size_t size,
                              ph_stream_t stream);
  ph_status_t (*event_create)(unsigned flags, ph_event_t* out_event);
  ph_status_t (*event_destroy)(ph_event_t event);
  ph_status_t (*event_record)(ph_event_t event, ph_stream_t stream);
  ph_status_t (*event_query)(ph_event_t event);
  ph_status_t (*event_synchronize)(ph_event_t event);
  ph_status_t (*event_elapsed_time)(ph_event_t start, ph_event_t end,
                                    float* out_ms);

  /* ABI 1001 */
  /* OPTIONAL: the runtime falls back to launch + wait (ph_run_host_func). */
  ph_status_t (*run_host_func)(ph_stream_t stream, const ph_host_task_t* task);

  /* ABI 1002, all OPTIONAL (fallbacks next to each function above) */
  ph_status_t (*device_get_telemetry)(int device,
                                      ph_device_telemetry_t* out_telemetry);
  ph_status_t (*ipc_get_mem_handle)(const void* device_ptr,
                                    ph_ipc_mem_handle_t* out_handle);
  ph_status_t (*ipc_open_mem_handle)(const ph_ipc_mem_handle_t* handle,
                                     void** out_ptr);
  ph_status_t (*ipc_close_mem_handle)(void* device_ptr);
  ph_status_t (*ipc_get_event_handle)(ph_event_t event,
                                      ph_ipc_event_handle_t* out_handle);
  ph_status_t (*ipc_open_event_handle)(const ph_ipc_event_handle_t* handle,
                                       ph_event_t* out_event);

  /* ABI 1003 added the table itself. Later minors append sections here,
   * each headed by the ABI that added it. */

  /* ABI 1004, all OPTIONAL: graph capture and replay (NULL: the runtime
   * reports that the driver cannot capture; see "Graph capture"). */
  ph_status_t (*stream_begin_capture)(ph_stream_t stream,
                                      ph_capture_mode_t mode);
  ph_status_t (*stream_end_capture)(ph_stream_t stream, ph_graph_t* out_graph);
  ph_status_t (*stream_get_capture_info)(ph_stream_t stream,
                                         ph_capture_status_t* out_status,
                                         uint64_t* out_id);
  ph_status_t (*graph_get_node_count)(ph_graph_t graph, size_t* out_count);
  ph_status_t (*graph_instantiate)(ph_graph_t graph, ph_graph_exec_t* out_exec);
  ph_status_t (*graph_launch)(ph_graph_exec_t exec, ph_stream_t stream);
  ph_status_t (*graph_exec_destroy)(ph_graph_exec_t exec);
  ph_status_t (*graph_destroy)(ph_graph_t graph);
  ph_status_t (*graph_debug_dump)(ph_graph_t graph, const char* path);

  /* ABI 1005, all OPTIONAL: the activity trace (NULL: the profiler shows
   * host activity only; see phantom/hal_activity.h). */
  ph_status_t (*activity_enable)(void);
  ph_status_t (*activity_disable)(void);
  ph_status_t (*activity_get_timestamp)(uint64_t* out_ns);
  ph_status_t (*activity_push_correlation)(uint64_t id);
  ph_status_t (*activity_pop_correlation)(void);
  ph_status_t (*activity_flush)(void* records, size_t record_size,
                                size_t capacity, size_t* out_count,
                                uint64_t* out_dropped);
} ph_driver_table_t;

/* The entry point's name, for dlsym. */
#define PH_DRIVER_ENTRY_POINT "ph_driver_get_table"

/* The one entry point a driver implements. `runtime_abi_version` is the
 * PH_HAL_ABI_VERSION of the runtime asking, so a driver can refuse a
 * runtime it cannot serve by returning NULL (the runtime then says the
 * driver refused its version). Otherwise it returns its static table, the
 * same pointer on every call. It must not start the device (that is
 * ph_device_count's job) and is safe to call from any thread. */
typedef const ph_driver_table_t* (*ph_driver_get_table_fn)(
    uint32_t runtime_abi_version);
PH_API const ph_driver_table_t* ph_driver_get_table(
    uint32_t runtime_abi_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PHANTOM_HAL_H_ */
