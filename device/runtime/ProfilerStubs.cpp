// The legacy profiler's view of phantom devices:
// torch.autograd.profiler.profile(use_device="phantom").
//
// That profiler (torch's KINETO_PRIVATEUSE1_FALLBACK state) brackets every
// op with a pair of device events recorded on the current stream, next to
// the CPU time of the record, and reports the time between the two events
// as the op's device time. It asks for them through the ProfilerStubs
// torch keeps per device type; without ours it warns "PrivateUse1 used in
// profiler but not enabled" and fails an internal assertion for every op.
// These stubs reach the device through phantom's device guard (torch's
// DeviceGuardImplInterface: timed events, current stream, device
// synchronize), as any torch code would, so they see only the HAL's
// events and streams.
//
// The HAL has no annotation API (NVTX's ranges and marks), so rangePush,
// rangePop and mark have nothing to forward to; torch.phantom.nvtx keeps
// the Python ranges. A timeline per stream is the Kineto path, not this one.
#include <phantom/Device.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <memory>

namespace phantom {
namespace {

using torch::profiler::impl::ProfilerStubs;
using torch::profiler::impl::ProfilerVoidEventStub;

const c10::impl::DeviceGuardImplInterface& guardImpl() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

class PhantomProfilerStubs final : public ProfilerStubs {
 public:
  // A timed event recorded on the current stream of the current device,
  // and the CPU time of the record.
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = currentDevice();
    if (device != nullptr) {
      *device = index;
    }
    const auto& impl = guardImpl();
    const c10::Stream stream =
        impl.getStream(c10::Device(c10::DeviceType::PrivateUse1, index));
    void* raw = nullptr;
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
    impl.record(&raw, stream, index, c10::EventFlag::BACKEND_DEFAULT);
    *event = std::shared_ptr<void>(raw, [index](void* e) {
      guardImpl().destroyEvent(e, index);
    });
  }

  // Microseconds from `start` to `end`, once both have been reached.
  float elapsed(const ProfilerVoidEventStub* start,
                const ProfilerVoidEventStub* end) const override {
    const auto& impl = guardImpl();
    impl.synchronizeEvent(start->get());
    impl.synchronizeEvent(end->get());
    const double ms =
        impl.elapsedTime(start->get(), end->get(), currentDevice());
    return static_cast<float>(ms * 1000.0);
  }

  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    c10::OptionalDeviceGuard guard;
    const c10::DeviceIndex count = deviceCountNoThrow();
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      guard.reset_device(c10::Device(c10::DeviceType::PrivateUse1, i));
      op(i);
    }
  }

  void synchronize() const override {
    const c10::DeviceIndex count = deviceCountNoThrow();
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      synchronizeDevice(i);
    }
  }
};

struct RegisterStubs {
  RegisterStubs() {
    static PhantomProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};
const RegisterStubs register_stubs;

}  // namespace
}  // namespace phantom
