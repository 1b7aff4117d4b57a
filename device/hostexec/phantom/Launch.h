// Launching host-code work on a phantom stream.
//
// The fake device computes with the CPU's own kernels; this is how such a
// kernel is queued. launchAsync returns as soon as the work is queued, like
// a kernel launch on a real accelerator; an exception thrown by the work
// becomes the stream's sticky error (reported by the next sync, naming the
// work). launchAndWait is for work whose result the host needs at once
// (data-dependent output shapes): the exception is rethrown to the caller
// as it was raised and the stream stays usable. Its callers first report
// the wait to torch.phantom.set_sync_debug_mode (phantom/SyncDebug.h,
// noteHostWait), with the reason the host has to wait.
//
// This is the CPU-kernel execution layer's (device/hostexec): the runtime
// does not link it, and reaches it only through the hooks this layer
// installs when it is loaded (phantom/DeviceWork.h, HostExecHooks): the
// runtime's waits call releaseFinishedWork, and the host allocator queues
// its keep-alive work with launchAsync.
#pragma once

#include <phantom/DeviceWork.h>  // inDeviceWork, currentWorkStream
#include <phantom/Stream.h>

#include <functional>

namespace phantom {

void launchAsync(const PhantomStream& stream, const char* name,
                 std::function<void()> work);

void launchAndWait(const PhantomStream& stream, const char* name,
                   std::function<void()> work);

// Destroys the closures of finished launchAsync work: the worker hands
// them back rather than destroying them itself, so what a host thread
// allocated is freed on a host thread (Launch.cpp, FinishedWork). Called
// at every launch and synchronize, so what a closure kept alive (a pinned
// buffer of a non_blocking copy) is freed by the time a synchronize
// returns (the runtime calls it after every wait, through its hook). Does
// nothing inside device work. True if it destroyed any.
bool releaseFinishedWork() noexcept;

}  // namespace phantom
