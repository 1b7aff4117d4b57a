// Device work as the runtime sees it, and the hook to the layer that runs
// CPU kernels.
//
// The runtime itself runs no kernels. A backend may queue host code on its
// streams (the fake device computes with the CPU's kernels that way: the
// CPU-kernel execution layer, device/hostexec), and the runtime has to know
// two things about such work. First, whether the calling thread is running
// it: the allocator then treats a free as stream-ordered, the generator
// must not wait for streams, and host-only waits are refused. That is the
// thread marker below (DeviceWorkScope, inDeviceWork, currentWorkStream).
// Second, what to do at the points only the runtime sees: after a
// synchronize, the finished work's closures are destroyed on the host;
// empty_cache() frees the kernels' cached host memory too; a non_blocking
// copy from pinned memory the host allocator does not own keeps that memory
// alive until the stream is past the copy. Those go through HostExecHooks,
// which the execution layer installs when it is loaded. The runtime never
// links that layer: without it the hooks do nothing, except launch_async,
// which waits for the stream and then runs the work on the calling thread.
#pragma once

#include <phantom/Stream.h>

#include <functional>

namespace phantom {

// True while the calling thread is running work queued on a stream (inside
// a DeviceWorkScope). Host-only operations, such as waiting for the
// device, must not be done from there.
bool inDeviceWork() noexcept;

// The driver stream whose work the calling thread is running, or nullptr
// on a host thread.
ph_stream_t currentWorkStream() noexcept;

// Marks the calling thread as running work of `stream` for the scope, and
// makes the stream's device and the stream itself current there, so
// allocations the work makes land on that device and belong to that
// stream. The thread is usually the stream's worker, but a driver may run
// waited work on the host thread that asked for it (ph_run_host_func), so
// the previous device, stream and marker are restored at the end.
class DeviceWorkScope {
 public:
  explicit DeviceWorkScope(const PhantomStream& stream);
  ~DeviceWorkScope();
  DeviceWorkScope(const DeviceWorkScope&) = delete;
  DeviceWorkScope& operator=(const DeviceWorkScope&) = delete;

 private:
  ph_stream_t previous_;
  PhantomStream previous_stream_;
  int work_device_ = 0;
  int previous_device_ = 0;
};

// What the runtime asks of the CPU-kernel execution layer. Every member is
// set (setHostExecHooks fills a null one with the default).
struct HostExecHooks {
  // Queues `work` on `stream` and returns without waiting for it; a
  // failure of the work becomes the stream's sticky error.
  void (*launch_async)(const PhantomStream& stream, const char* name,
                       std::function<void()> work) = nullptr;
  // Destroys, on the calling (host) thread, what finished work kept alive;
  // true if there was any. Called after every wait for a stream.
  bool (*release_finished_work)() noexcept = nullptr;
  // Frees the kernels' cached host memory (torch.phantom.empty_cache()).
  void (*release_host_memory)() noexcept = nullptr;
};

// Installs `hooks` (the execution layer does, once, when it is loaded).
void setHostExecHooks(const HostExecHooks& hooks);

// The installed hooks, or the defaults.
const HostExecHooks& hostExecHooks() noexcept;

}  // namespace phantom
