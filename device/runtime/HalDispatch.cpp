// The ph_* functions of phantom/hal.h, as the runtime defines them: each
// forwards through the table of the driver loaded at start-up
// (phantom/DriverLoader.h), so the runtime, ops, Python and distributed
// call the HAL by name and none of them links a driver.
//
// Design. Three cases per call:
//  - no driver (it could not be loaded or was refused): the call returns
//    PH_ERROR_NOT_INITIALIZED and ph_last_error_message() gives the
//    loader's sentence, as from a driver that could not start;
//  - a required member: forwarded as is (the loader checked it is set);
//  - an OPTIONAL member that is NULL (the driver lacks the capability, or
//    predates the minor that added it): the fallback hal.h documents. For
//    most that is PH_ERROR_UNIMPLEMENTED, which the runtime already turns
//    into its own fallback (no zero-copy generic path, no telemetry, no
//    interprocess sharing); ph_run_host_func becomes launch-then-wait here
//    (HostFuncFallback below).
// ph_last_error_message() returns the dispatch's own message when the
// dispatch made the latest failing call on this thread, the driver's
// otherwise.
#include <phantom/DriverLoader.h>
#include <phantom/hal.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace {

using phantom::driver::activeDriver;

// The dispatch's own last error on this thread, and whether it is the
// latest (a failing forwarded call makes the driver's the latest again).
thread_local std::string t_message;
thread_local bool t_message_is_latest = false;

ph_status_t Fail(ph_status_t status, std::string message) {
  t_message = std::move(message);
  t_message_is_latest = true;
  return status;
}

// A forwarded call's status: a failure's message is the driver's.
inline ph_status_t Forwarded(ph_status_t status) {
  if (status != PH_SUCCESS && status != PH_NOT_READY) {
    t_message_is_latest = false;
  }
  return status;
}

// The table, or nullptr when there is no driver.
inline const ph_driver_table_t* Table() {
  const phantom::driver::LoadedDriver& driver = activeDriver();
  return driver.ok() ? &driver.table : nullptr;
}

ph_status_t NoDriver() {
  return Fail(PH_ERROR_NOT_INITIALIZED, activeDriver().error);
}

ph_status_t Unsupported(const char* call) {
  return Fail(PH_ERROR_UNIMPLEMENTED,
              std::string(call) + ": the phantom driver '" +
                  activeDriver().library +
                  "' does not support this OPTIONAL call (its table member "
                  "is NULL)");
}

// Forwards `member` of the table with `args`, or returns what `absent`
// gives when the driver leaves it NULL.
#define PH_FORWARD(member, absent, ...)           \
  do {                                            \
    const ph_driver_table_t* table = Table();     \
    if (table == nullptr) return NoDriver();      \
    if (table->member == nullptr) return absent;  \
    return Forwarded(table->member(__VA_ARGS__)); \
  } while (0)

#define PH_REQUIRED(member, ...) PH_FORWARD(member, NoDriver(), __VA_ARGS__)
#define PH_OPTIONAL(member, ...) \
  PH_FORWARD(member, Unsupported("ph_" #member), __VA_ARGS__)

// ---- ph_run_host_func without the driver's own: launch, then wait --------

// What the waiting caller and the stream's worker share.
struct WaitedTask {
  ph_host_task_t task;  // the caller's
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;  // released (after running, or instead of it)
  bool ran = false;
  ph_status_t status = PH_SUCCESS;  // the task's own, once it ran
  std::string message;              // the sentence it wrote on failure
};

ph_status_t RunWaited(void* user_data, char* error, size_t error_size) {
  auto& waited = **static_cast<std::shared_ptr<WaitedTask>*>(user_data);
  const ph_status_t status =
      waited.task.run(waited.task.user_data, error, error_size);
  waited.ran = true;
  waited.status = status;
  if (status != PH_SUCCESS && error != nullptr && error_size > 0) {
    waited.message.assign(error, strnlen(error, error_size));
  }
  return status;
}

void ReleaseWaited(void* user_data) {
  auto* handle = static_cast<std::shared_ptr<WaitedTask>*>(user_data);
  const std::shared_ptr<WaitedTask> waited = std::move(*handle);
  delete handle;
  if (waited->task.release != nullptr) {
    waited->task.release(waited->task.user_data);
  }
  std::lock_guard<std::mutex> lock(waited->mutex);
  waited->done = true;
  waited->done_cv.notify_all();
}

ph_status_t LaunchAndWait(const ph_driver_table_t& table, ph_stream_t stream,
                          const ph_host_task_t& task) {
  // An event recorded right behind the task says when the driver counts it
  // complete, and with what failure: the task's own or the stream's
  // earlier one (hal.h, "Device errors"). It may also wait for work other
  // threads queue between the launch and the record.
  ph_event_t marker = nullptr;
  if (table.event_create(PH_EVENT_DISABLE_TIMING, &marker) != PH_SUCCESS) {
    marker = nullptr;  // then the release alone says the task is done
  }
  auto waited = std::make_shared<WaitedTask>();
  waited->task = task;
  auto* handle = new std::shared_ptr<WaitedTask>(waited);
  const ph_host_task_t launched{task.name, &RunWaited, &ReleaseWaited, handle};
  const ph_status_t launch = table.launch_host_func(stream, &launched);
  if (launch != PH_SUCCESS) {
    if (marker != nullptr) table.event_destroy(marker);
    return Forwarded(launch);  // released by the driver already
  }
  ph_status_t marked = PH_SUCCESS;
  if (marker != nullptr) {
    marked = table.event_record(marker, stream);
    if (marked == PH_SUCCESS) marked = table.event_synchronize(marker);
  }
  {
    std::unique_lock<std::mutex> lock(waited->mutex);
    waited->done_cv.wait(lock, [&] { return waited->done; });
  }
  if (marker != nullptr) table.event_destroy(marker);
  if (waited->ran && waited->status == PH_SUCCESS) {
    return PH_SUCCESS;
  }
  // The task failed, or the stream skipped it for an earlier failure: the
  // driver's status and sentence, from the marker or the stream.
  if (marked != PH_SUCCESS && marked != PH_NOT_READY) {
    return Forwarded(marked);
  }
  const ph_status_t sticky = table.stream_query(stream);
  if (sticky != PH_SUCCESS && sticky != PH_NOT_READY) {
    return Forwarded(sticky);
  }
  const char* name = task.name != nullptr ? task.name : "host work";
  if (waited->ran) {
    return Fail(waited->status, std::string("ph_run_host_func: ") + name +
                                    " failed: " + waited->message);
  }
  return Fail(PH_ERROR_DEVICE, std::string("ph_run_host_func: ") + name +
                                   " was released without running");
}

// Whether the driver's ph_run_host_func is worth asking: unknown until it
// answers something other than PH_ERROR_UNIMPLEMENTED (then trusted), or
// refused for good once it answers that.
enum class HostFuncSupport { kUnknown, kSupported, kUnsupported };
std::atomic<HostFuncSupport> g_run_host_func{HostFuncSupport::kUnknown};

// While support is unknown, the driver gets a proxy of the task whose
// release keeps the caller's task when it did not run: a driver answering
// PH_ERROR_UNIMPLEMENTED has released the task it got, and the fallback
// still needs the caller's.
struct ProbedTask {
  ph_host_task_t task;  // the caller's
  std::atomic<bool> ran{false};
};

ph_status_t RunProbed(void* user_data, char* error, size_t error_size) {
  auto& probed = **static_cast<std::shared_ptr<ProbedTask>*>(user_data);
  probed.ran.store(true);
  return probed.task.run(probed.task.user_data, error, error_size);
}

void ReleaseProbed(void* user_data) {
  auto* handle = static_cast<std::shared_ptr<ProbedTask>*>(user_data);
  const std::shared_ptr<ProbedTask> probed = std::move(*handle);
  delete handle;
  // Not run: the caller's task is kept for RunHostFunc to release or run.
  if (probed->ran.load() && probed->task.release != nullptr) {
    probed->task.release(probed->task.user_data);
  }
}

ph_status_t RunHostFunc(const ph_driver_table_t& table, ph_stream_t stream,
                        const ph_host_task_t* task) {
  const HostFuncSupport support = g_run_host_func.load();
  if (task == nullptr || task->run == nullptr) {
    // The driver's own refusal when it has the call; the same otherwise.
    if (table.run_host_func != nullptr &&
        support != HostFuncSupport::kUnsupported) {
      return Forwarded(table.run_host_func(stream, task));
    }
    if (task != nullptr && task->release != nullptr) {
      task->release(task->user_data);
    }
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_run_host_func: the task or its run function is NULL");
  }
  if (table.run_host_func == nullptr ||
      support == HostFuncSupport::kUnsupported) {
    return LaunchAndWait(table, stream, *task);
  }
  if (support == HostFuncSupport::kSupported) {
    return Forwarded(table.run_host_func(stream, task));
  }
  auto probed = std::make_shared<ProbedTask>();
  probed->task = *task;
  auto* handle = new std::shared_ptr<ProbedTask>(probed);
  const ph_host_task_t proxy{task->name, &RunProbed, &ReleaseProbed, handle};
  const ph_status_t status = table.run_host_func(stream, &proxy);
  if (probed->ran.load()) {
    // The driver has the call; the proxy's release releases the task.
    g_run_host_func.store(HostFuncSupport::kSupported);
    return Forwarded(status);
  }
  if (status == PH_ERROR_UNIMPLEMENTED) {
    // Released the proxy without running it (hal.h): the task is ours.
    g_run_host_func.store(HostFuncSupport::kUnsupported);
    return LaunchAndWait(table, stream, *task);
  }
  // Refused (a sticky stream, a bad handle): the proxy was released, the
  // caller's task was kept; release it as the driver would have.
  if (task->release != nullptr) task->release(task->user_data);
  return Forwarded(status);
}

}  // namespace

extern "C" {

/* ---- Status ------------------------------------------------------------ */

const char* ph_status_name(ph_status_t status) {
  const ph_driver_table_t* table = Table();
  return table != nullptr ? table->status_name(status)
                          : ph_status_name_of(status);
}

const char* ph_last_error_message(void) {
  if (t_message_is_latest) return t_message.c_str();
  const ph_driver_table_t* table = Table();
  return table != nullptr ? table->last_error_message() : "";
}

uint32_t ph_abi_version(void) {
  const ph_driver_table_t* table = Table();
  return table != nullptr ? table->abi_version : 0;
}

/* ---- Devices ----------------------------------------------------------- */

ph_status_t ph_device_count(int* out_count) {
  const ph_driver_table_t* table = Table();
  if (table == nullptr) {
    if (out_count != nullptr) *out_count = 0;
    return NoDriver();
  }
  return Forwarded(table->device_count(out_count));
}

ph_status_t ph_get_device(int* out_device) {
  PH_REQUIRED(get_device, out_device);
}

ph_status_t ph_set_device(int device) { PH_REQUIRED(set_device, device); }

ph_status_t ph_device_get_properties(int device,
                                     ph_device_properties_t* out_props) {
  PH_REQUIRED(device_get_properties, device, out_props);
}

ph_status_t ph_device_synchronize(int device) {
  PH_REQUIRED(device_synchronize, device);
}

ph_status_t ph_device_get_telemetry(int device,
                                    ph_device_telemetry_t* out_telemetry) {
  PH_OPTIONAL(device_get_telemetry, device, out_telemetry);
}

/* ---- Memory ------------------------------------------------------------ */

ph_status_t ph_mem_get_info(int device, size_t* out_free, size_t* out_total) {
  PH_REQUIRED(mem_get_info, device, out_free, out_total);
}

ph_status_t ph_malloc(int device, size_t size, void** out_ptr) {
  PH_REQUIRED(malloc, device, size, out_ptr);
}

ph_status_t ph_free(void* ptr) { PH_REQUIRED(free, ptr); }

ph_status_t ph_host_malloc(size_t size, void** out_ptr) {
  PH_REQUIRED(host_malloc, size, out_ptr);
}

ph_status_t ph_host_free(void* ptr) { PH_REQUIRED(host_free, ptr); }

ph_status_t ph_pointer_get_attributes(const void* ptr,
                                      ph_pointer_attributes_t* out_attr) {
  PH_REQUIRED(pointer_get_attributes, ptr, out_attr);
}

ph_status_t ph_kernel_address(const void* device_ptr, void** out_ptr) {
  if (out_ptr != nullptr) *out_ptr = nullptr;
  PH_OPTIONAL(kernel_address, device_ptr, out_ptr);
}

/* ---- Streams ----------------------------------------------------------- */

ph_status_t ph_stream_create(int device, int priority,
                             ph_stream_t* out_stream) {
  PH_REQUIRED(stream_create, device, priority, out_stream);
}

ph_status_t ph_stream_destroy(ph_stream_t stream) {
  PH_REQUIRED(stream_destroy, stream);
}

ph_status_t ph_stream_query(ph_stream_t stream) {
  PH_REQUIRED(stream_query, stream);
}

ph_status_t ph_stream_synchronize(ph_stream_t stream) {
  PH_REQUIRED(stream_synchronize, stream);
}

ph_status_t ph_stream_get_device(ph_stream_t stream, int* out_device) {
  PH_REQUIRED(stream_get_device, stream, out_device);
}

ph_status_t ph_stream_get_priority(ph_stream_t stream, int* out_priority) {
  PH_REQUIRED(stream_get_priority, stream, out_priority);
}

ph_status_t ph_stream_wait_event(ph_stream_t stream, ph_event_t event) {
  PH_REQUIRED(stream_wait_event, stream, event);
}

ph_status_t ph_launch_host_func(ph_stream_t stream,
                                const ph_host_task_t* task) {
  const ph_driver_table_t* table = Table();
  if (table == nullptr) {
    if (task != nullptr && task->release != nullptr) {
      task->release(task->user_data);  // "on any error return, released"
    }
    return NoDriver();
  }
  return Forwarded(table->launch_host_func(stream, task));
}

ph_status_t ph_run_host_func(ph_stream_t stream, const ph_host_task_t* task) {
  const ph_driver_table_t* table = Table();
  if (table == nullptr) {
    if (task != nullptr && task->release != nullptr) {
      task->release(task->user_data);
    }
    return NoDriver();
  }
  return RunHostFunc(*table, stream, task);
}

/* ---- Copies ------------------------------------------------------------ */

ph_status_t ph_memcpy(void* dst, const void* src, size_t size,
                      ph_memcpy_kind_t kind) {
  PH_REQUIRED(memcpy, dst, src, size, kind);
}

ph_status_t ph_memcpy_async(void* dst, const void* src, size_t size,
                            ph_memcpy_kind_t kind, ph_stream_t stream) {
  PH_REQUIRED(memcpy_async, dst, src, size, kind, stream);
}

ph_status_t ph_memset_async(void* dst, int value, size_t size,
                            ph_stream_t stream) {
  PH_REQUIRED(memset_async, dst, value, size, stream);
}

/* ---- Events ------------------------------------------------------------ */

ph_status_t ph_event_create(unsigned flags, ph_event_t* out_event) {
  PH_REQUIRED(event_create, flags, out_event);
}

ph_status_t ph_event_destroy(ph_event_t event) {
  PH_REQUIRED(event_destroy, event);
}

ph_status_t ph_event_record(ph_event_t event, ph_stream_t stream) {
  PH_REQUIRED(event_record, event, stream);
}

ph_status_t ph_event_query(ph_event_t event) {
  PH_REQUIRED(event_query, event);
}

ph_status_t ph_event_synchronize(ph_event_t event) {
  PH_REQUIRED(event_synchronize, event);
}

ph_status_t ph_event_elapsed_time(ph_event_t start, ph_event_t end,
                                  float* out_ms) {
  PH_REQUIRED(event_elapsed_time, start, end, out_ms);
}

/* ---- Interprocess sharing (OPTIONAL) ------------------------------------ */

ph_status_t ph_ipc_get_mem_handle(const void* device_ptr,
                                  ph_ipc_mem_handle_t* out_handle) {
  PH_OPTIONAL(ipc_get_mem_handle, device_ptr, out_handle);
}

ph_status_t ph_ipc_open_mem_handle(const ph_ipc_mem_handle_t* handle,
                                   void** out_ptr) {
  if (out_ptr != nullptr) *out_ptr = nullptr;
  PH_OPTIONAL(ipc_open_mem_handle, handle, out_ptr);
}

ph_status_t ph_ipc_close_mem_handle(void* device_ptr) {
  PH_OPTIONAL(ipc_close_mem_handle, device_ptr);
}

ph_status_t ph_ipc_get_event_handle(ph_event_t event,
                                    ph_ipc_event_handle_t* out_handle) {
  PH_OPTIONAL(ipc_get_event_handle, event, out_handle);
}

ph_status_t ph_ipc_open_event_handle(const ph_ipc_event_handle_t* handle,
                                     ph_event_t* out_event) {
  if (out_event != nullptr) *out_event = nullptr;
  PH_OPTIONAL(ipc_open_event_handle, handle, out_event);
}

// ABI 1004: graph capture and replay.
ph_status_t ph_stream_begin_capture(ph_stream_t stream, ph_capture_mode_t mode) {
  PH_OPTIONAL(stream_begin_capture, stream, mode);
}

ph_status_t ph_stream_end_capture(ph_stream_t stream, ph_graph_t* out_graph) {
  if (out_graph != nullptr) *out_graph = nullptr;
  PH_OPTIONAL(stream_end_capture, stream, out_graph);
}

ph_status_t ph_stream_get_capture_info(ph_stream_t stream,
                                       ph_capture_status_t* out_status,
                                       uint64_t* out_capture_id) {
  PH_OPTIONAL(stream_get_capture_info, stream, out_status, out_capture_id);
}

ph_status_t ph_graph_get_node_count(ph_graph_t graph, size_t* out_count) {
  PH_OPTIONAL(graph_get_node_count, graph, out_count);
}

ph_status_t ph_graph_instantiate(ph_graph_t graph, ph_graph_exec_t* out_exec) {
  if (out_exec != nullptr) *out_exec = nullptr;
  PH_OPTIONAL(graph_instantiate, graph, out_exec);
}

ph_status_t ph_graph_launch(ph_graph_exec_t exec, ph_stream_t stream) {
  PH_OPTIONAL(graph_launch, exec, stream);
}

ph_status_t ph_graph_exec_destroy(ph_graph_exec_t exec) {
  PH_OPTIONAL(graph_exec_destroy, exec);
}

ph_status_t ph_graph_destroy(ph_graph_t graph) {
  PH_OPTIONAL(graph_destroy, graph);
}

ph_status_t ph_graph_debug_dump(ph_graph_t graph, const char* path) {
  PH_OPTIONAL(graph_debug_dump, graph, path);
}

// ABI 1005: the activity trace.
ph_status_t ph_activity_enable(void) { PH_OPTIONAL(activity_enable); }

ph_status_t ph_activity_disable(void) { PH_OPTIONAL(activity_disable); }

ph_status_t ph_activity_get_timestamp(uint64_t* out_ns) {
  PH_OPTIONAL(activity_get_timestamp, out_ns);
}

ph_status_t ph_activity_push_correlation(uint64_t id) {
  PH_OPTIONAL(activity_push_correlation, id);
}

ph_status_t ph_activity_pop_correlation(void) {
  PH_OPTIONAL(activity_pop_correlation);
}

ph_status_t ph_activity_flush(void* records, size_t record_size,
                              size_t capacity, size_t* out_count,
                              uint64_t* out_dropped) {
  if (out_count != nullptr) *out_count = 0;
  if (out_dropped != nullptr) *out_dropped = 0;
  PH_OPTIONAL(activity_flush, records, record_size, capacity, out_count,
              out_dropped);
}

}  // extern "C"
