// The helpers of hal_test_support.h, and the capability probes.
//
// Design. Each probe asks the driver the least it can: the table member
// first (NULL: no capability, as hal.h allows), then one harmless call,
// since a driver may also keep the member and answer
// PH_ERROR_UNIMPLEMENTED (the fake does under PHANTOM_FAKE_NO_IPC). Probes
// run once per process, on first need, and are cached.
#include "hal_test_support.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

namespace hal_test {
namespace {

struct Closure {
  TaskBody body;
  TaskProbe* probe;
};

ph_status_t RunClosure(void* user_data, char* error, size_t error_size) {
  auto* closure = static_cast<Closure*>(user_data);
  if (closure->probe != nullptr) closure->probe->runs++;
  return closure->body ? closure->body(error, error_size) : PH_SUCCESS;
}

void ReleaseClosure(void* user_data) {
  auto* closure = static_cast<Closure*>(user_data);
  if (closure->probe != nullptr) closure->probe->releases++;
  delete closure;
}

bool ProbeTwoDevices() {
  int count = 0;
  return ph_device_count(&count) == PH_SUCCESS && count >= 2;
}

bool ProbeKernelView() {
  if (Driver().kernel_address == nullptr) return false;
  void* view = nullptr;
  int host = 0;  // not device memory: refused, unless unimplemented
  return ph_kernel_address(&host, &view) != PH_ERROR_UNIMPLEMENTED;
}

bool ProbeHostFunc() {
  if (Driver().run_host_func == nullptr) return false;
  ph_stream_t stream = nullptr;
  if (ph_stream_create(0, 0, &stream) != PH_SUCCESS) return false;
  const ph_host_task_t task = MakeTask("probe", nullptr, nullptr);
  const ph_status_t status = ph_run_host_func(stream, &task);
  ph_stream_destroy(stream);
  return status != PH_ERROR_UNIMPLEMENTED;
}

bool ProbeTelemetry() {
  if (Driver().device_get_telemetry == nullptr) return false;
  ph_device_telemetry_t telemetry{};
  telemetry.struct_size = sizeof telemetry;
  return ph_device_get_telemetry(0, &telemetry) != PH_ERROR_UNIMPLEMENTED;
}

bool ProbeGraph() {
  const ph_driver_table_t& table = Driver();
  if (table.stream_begin_capture == nullptr ||
      table.stream_end_capture == nullptr || table.graph_destroy == nullptr) {
    return false;
  }
  ph_stream_t stream = nullptr;
  if (ph_stream_create(0, 0, &stream) != PH_SUCCESS) return false;
  const ph_status_t begun =
      ph_stream_begin_capture(stream, PH_CAPTURE_MODE_GLOBAL);
  if (begun == PH_SUCCESS) {
    ph_graph_t graph = nullptr;
    if (ph_stream_end_capture(stream, &graph) == PH_SUCCESS) {
      ph_graph_destroy(graph);
    }
  }
  ph_stream_destroy(stream);
  return begun != PH_ERROR_UNIMPLEMENTED;
}

bool ProbeIpcMemory() {
  if (Driver().ipc_get_mem_handle == nullptr) return false;
  void* ptr = nullptr;
  if (ph_malloc(0, 256, &ptr) != PH_SUCCESS) return false;
  ph_ipc_mem_handle_t handle{};
  const ph_status_t status = ph_ipc_get_mem_handle(ptr, &handle);
  ph_free(ptr);
  return status != PH_ERROR_UNIMPLEMENTED;
}

bool ProbeIpcEvent() {
  if (Driver().ipc_get_event_handle == nullptr) return false;
  ph_event_t event = nullptr;
  const ph_status_t status =
      ph_event_create(PH_EVENT_INTERPROCESS | PH_EVENT_DISABLE_TIMING, &event);
  if (status == PH_SUCCESS) ph_event_destroy(event);
  return status != PH_ERROR_UNIMPLEMENTED;
}

bool ProbeActivityTrace() {
  const ph_driver_table_t& table = Driver();
  if (table.activity_enable == nullptr || table.activity_flush == nullptr) {
    return false;
  }
  uint64_t now = 0;
  return ph_activity_get_timestamp(&now) != PH_ERROR_UNIMPLEMENTED;
}

constexpr int kCapabilityCount =
    static_cast<int>(Capability::kActivityTrace) + 1;

bool Probe(Capability capability) {
  switch (capability) {
    case Capability::kTwoDevices: return ProbeTwoDevices();
    case Capability::kKernelView: return ProbeKernelView();
    case Capability::kHostFunc: return ProbeHostFunc();
    case Capability::kTelemetry: return ProbeTelemetry();
    case Capability::kGraph: return ProbeGraph();
    case Capability::kIpcMemory: return ProbeIpcMemory();
    case Capability::kIpcEvent: return ProbeIpcEvent();
    case Capability::kActivityTrace: return ProbeActivityTrace();
  }
  return false;
}

}  // namespace

bool Has(Capability capability) {
  static std::once_flag once[kCapabilityCount];
  static bool has[kCapabilityCount];
  const int index = static_cast<int>(capability);
  std::call_once(once[index], [&] { has[index] = Probe(capability); });
  return has[index];
}

std::string MissingSentence(Capability capability) {
  const std::string driver = "the driver '" + DriverPath() + "' ";
  switch (capability) {
    case Capability::kTwoDevices:
      return "this test needs two devices and " + driver +
             "reports fewer (ph_device_count)";
    case Capability::kKernelView:
      return driver + "has no kernel view (ph_kernel_address, OPTIONAL, is "
                      "NULL or answers PH_ERROR_UNIMPLEMENTED)";
    case Capability::kHostFunc:
      return driver + "does not run waited host work (ph_run_host_func, "
                      "OPTIONAL, is NULL or answers PH_ERROR_UNIMPLEMENTED)";
    case Capability::kTelemetry:
      return driver + "has no telemetry (ph_device_get_telemetry, OPTIONAL, "
                      "is NULL or answers PH_ERROR_UNIMPLEMENTED)";
    case Capability::kGraph:
      return driver + "does not capture graphs (ph_stream_begin_capture, "
                      "OPTIONAL, is NULL or answers PH_ERROR_UNIMPLEMENTED)";
    case Capability::kIpcMemory:
      return driver + "cannot share memory between processes "
                      "(ph_ipc_get_mem_handle, OPTIONAL, is NULL or answers "
                      "PH_ERROR_UNIMPLEMENTED)";
    case Capability::kIpcEvent:
      return driver + "cannot share events between processes "
                      "(ph_event_create(PH_EVENT_INTERPROCESS) answers "
                      "PH_ERROR_UNIMPLEMENTED, or ph_ipc_get_event_handle "
                      "is NULL; OPTIONAL)";
    case Capability::kActivityTrace:
      return driver + "records no device activity (phantom/hal_activity.h, "
                      "OPTIONAL: its table members are NULL or answer "
                      "PH_ERROR_UNIMPLEMENTED)";
  }
  return driver + "lacks an OPTIONAL capability";
}

ph_host_task_t MakeTask(const char* name, TaskBody body, TaskProbe* probe) {
  return {name, RunClosure, ReleaseClosure,
          new Closure{std::move(body), probe}};
}

ph_status_t Launch(ph_stream_t stream, const char* name, TaskBody body,
                   TaskProbe* probe) {
  const ph_host_task_t task = MakeTask(name, std::move(body), probe);
  return ph_launch_host_func(stream, &task);
}

ph_status_t RunNow(ph_stream_t stream, const char* name, TaskBody body,
                   TaskProbe* probe) {
  const ph_host_task_t task = MakeTask(name, std::move(body), probe);
  return ph_run_host_func(stream, &task);
}

void Gate::Open() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = true;
  changed_.notify_all();
}

void Gate::Wait() {
  entered_ = true;
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return open_; });
}

void Gate::WaitEntered() const {
  while (!entered_) std::this_thread::sleep_for(milliseconds(1));
}

ph_status_t Gate::Block(ph_stream_t stream) {
  return Launch(stream, "gate", [this](char*, size_t) {
    Wait();
    return PH_SUCCESS;
  });
}

int DeviceCount() {
  int count = 0;
  EXPECT_PH_OK(ph_device_count(&count));
  return count;
}

size_t FreeBytes(int device) {
  size_t free_bytes = 0;
  size_t total = 0;
  EXPECT_PH_OK(ph_mem_get_info(device, &free_bytes, &total));
  return free_bytes;
}

ScopedStream::ScopedStream(int device, int priority) {
  EXPECT_PH_OK(ph_stream_create(device, priority, &stream_));
}

ScopedStream::~ScopedStream() {
  if (stream_ != nullptr) ph_stream_destroy(stream_);
}

ScopedEvent::ScopedEvent(unsigned flags) {
  EXPECT_PH_OK(ph_event_create(flags, &event_));
}

ScopedEvent::~ScopedEvent() { ph_event_destroy(event_); }

DeviceBuffer::DeviceBuffer(int device, size_t size) {
  EXPECT_PH_OK(ph_malloc(device, size, &ptr_));
}

DeviceBuffer::~DeviceBuffer() { ph_free(ptr_); }

PinnedBuffer::PinnedBuffer(size_t size) {
  EXPECT_PH_OK(ph_host_malloc(size, &ptr_));
}

PinnedBuffer::~PinnedBuffer() { ph_host_free(ptr_); }

std::vector<char> Pattern(size_t size, int seed) {
  std::vector<char> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 7 + seed);
  return data;
}

size_t Occurrences(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

}  // namespace hal_test
