// See phantom/Launch.h.
#include <phantom/Exception.h>
#include <phantom/Launch.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

namespace phantom {
namespace {

thread_local bool in_device_work = false;

struct InDeviceWork {
  InDeviceWork() { in_device_work = true; }
  ~InDeviceWork() { in_device_work = false; }
};

const char* whatOf(const std::exception& e) {
  // c10::Error's what() carries a C++ backtrace; the plain message is what
  // a user needs in the stream's error.
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

struct AsyncWork {
  std::function<void()> work;
  int device;

  static ph_status_t run(void* self, char* error, size_t error_size) {
    InDeviceWork scope;
    auto* state = static_cast<AsyncWork*>(self);
    try {
      // Allocations made by the work land on the stream's device.
      PHANTOM_CHECK(ph_set_device(state->device));
      state->work();
      return PH_SUCCESS;
    } catch (const std::exception& e) {
      std::snprintf(error, error_size, "%s", whatOf(e));
    } catch (...) {
      std::snprintf(error, error_size, "unknown exception");
    }
    return PH_ERROR_DEVICE;
  }

  static void release(void* self) {
    InDeviceWork scope;  // captured tensors may be freed here
    delete static_cast<AsyncWork*>(self);
  }
};

// Shared between the host (waiting) and the worker (running).
struct WaitedWork {
  std::function<void()> work;
  int device = 0;
  std::exception_ptr failure;

  static ph_status_t run(void* self, char*, size_t) {
    InDeviceWork scope;
    auto* state = static_cast<std::shared_ptr<WaitedWork>*>(self)->get();
    try {
      PHANTOM_CHECK(ph_set_device(state->device));
      state->work();
    } catch (...) {
      state->failure = std::current_exception();
    }
    state->work = nullptr;  // drop captures on the worker, while it is ours
    return PH_SUCCESS;
  }

  static void release(void* self) {
    InDeviceWork scope;
    delete static_cast<std::shared_ptr<WaitedWork>*>(self);
  }
};

}  // namespace

void launchAsync(const PhantomStream& stream, const char* name,
                 std::function<void()> work) {
  auto* state = new AsyncWork{std::move(work), stream.device_index()};
  const ph_host_task_t task{name, &AsyncWork::run, &AsyncWork::release, state};
  // On failure the driver has already released (deleted) the state.
  PHANTOM_CHECK(ph_launch_host_func(stream.handle(), &task));
}

void launchAndWait(const PhantomStream& stream, const char* name,
                   std::function<void()> work) {
  auto state = std::make_shared<WaitedWork>();
  state->work = std::move(work);
  state->device = stream.device_index();
  auto* handle = new std::shared_ptr<WaitedWork>(state);
  const ph_host_task_t task{name, &WaitedWork::run, &WaitedWork::release,
                            handle};
  PHANTOM_CHECK(ph_launch_host_func(stream.handle(), &task));
  stream.synchronize();
  if (state->failure) {
    std::rethrow_exception(state->failure);
  }
}

bool inDeviceWork() noexcept {
  return in_device_work;
}

}  // namespace phantom
