// See phantom/DeviceWork.h.
#include <phantom/DeviceWork.h>
#include <phantom/Exception.h>

#include <utility>

namespace phantom {
namespace {

thread_local ph_stream_t work_stream = nullptr;

// Without an execution layer nothing queues closures, so there is nothing
// to release; work the runtime queues (HostAllocator) runs once the stream
// has passed the point where it would have run.
void waitThenRun(const PhantomStream& stream, const char* /*name*/,
                 std::function<void()> work) {
  stream.synchronize();
  work();
}

bool releaseNothing() noexcept { return false; }

void freeNothing() noexcept {}

HostExecHooks& installed() {
  static HostExecHooks hooks{&waitThenRun, &releaseNothing, &freeNothing};
  return hooks;
}

}  // namespace

bool inDeviceWork() noexcept {
  return work_stream != nullptr;
}

ph_stream_t currentWorkStream() noexcept {
  return work_stream;
}

DeviceWorkScope::DeviceWorkScope(const PhantomStream& stream)
    : previous_(work_stream),
      previous_stream_(getCurrentPhantomStream(stream.device_index())),
      work_device_(stream.device_index()) {
  PHANTOM_CHECK(ph_get_device(&previous_device_));
  work_stream = stream.handle();
  if (previous_device_ != stream.device_index()) {
    PHANTOM_CHECK(ph_set_device(stream.device_index()));
  }
  if (previous_stream_ != stream) {
    setCurrentPhantomStream(stream);
  }
}

DeviceWorkScope::~DeviceWorkScope() {
  work_stream = previous_;
  // Restored only where they differ: on a stream's worker, which runs that
  // stream's work task after task, neither changes, and the two calls were
  // most of the scope's cost per task.
  if (currentPhantomStreamId(previous_stream_.device_index()) !=
      previous_stream_.id()) {
    setCurrentPhantomStream(previous_stream_);
  }
  if (previous_device_ != work_device_) {
    (void)ph_set_device(previous_device_);
  }
}

void setHostExecHooks(const HostExecHooks& hooks) {
  HostExecHooks& target = installed();
  if (hooks.launch_async != nullptr) target.launch_async = hooks.launch_async;
  if (hooks.release_finished_work != nullptr) {
    target.release_finished_work = hooks.release_finished_work;
  }
  if (hooks.release_host_memory != nullptr) {
    target.release_host_memory = hooks.release_host_memory;
  }
}

const HostExecHooks& hostExecHooks() noexcept {
  return installed();
}

}  // namespace phantom
