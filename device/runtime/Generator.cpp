// See phantom/Generator.h.
#include <phantom/Device.h>
#include <phantom/Exception.h>
#include <phantom/Generator.h>
#include <phantom/DeviceWork.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <vector>

namespace phantom {

PhantomGeneratorImpl::PhantomGeneratorImpl(c10::DeviceIndex device,
                                           at::Generator cpu_generator)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_generator_(cpu_generator.defined()
                         ? std::move(cpu_generator)
                         : at::make_generator<at::CPUGeneratorImpl>(
                               c10::default_rng_seed_val)) {}

PhantomGeneratorImpl::~PhantomGeneratorImpl() {
  if (last_draw_ != nullptr) {
    // Waits already queued on the event still complete (hal.h).
    (void)ph_event_destroy(last_draw_);
  }
}

void PhantomGeneratorImpl::queueDraw(const PhantomStream& stream,
                                     const std::function<void()>& queue) {
  std::lock_guard<std::mutex> lock(draws_mutex_);
  const ph_stream_t handle = stream.handle();
  if (last_draw_ == nullptr) {
    PHANTOM_CHECK(ph_event_create(PH_EVENT_DISABLE_TIMING, &last_draw_));
  }
  // Only a draw not yet reached needs waiting for. A reached one that
  // failed is reported by its own stream; waiting on its record would make
  // every later random op on another stream inherit that failure (hal.h's
  // error model), even after the failure has been reported.
  if (draws_pending_ && last_stream_ != handle &&
      ph_event_query(last_draw_) == PH_NOT_READY) {
    PHANTOM_CHECK(ph_stream_wait_event(handle, last_draw_));
  }
  queue();
  // Refused only if the stream failed since: then the draw will not run,
  // and the stream reports why at its next sync.
  if (ph_event_record(last_draw_, handle) == PH_SUCCESS) {
    last_stream_ = handle;
    draws_pending_ = true;
  }
}

void PhantomGeneratorImpl::waitForQueuedDraws() const {
  if (inDeviceWork()) {
    return;  // device work must not wait on streams (it may be one of them)
  }
  std::lock_guard<std::mutex> lock(draws_mutex_);
  if (!draws_pending_) {
    return;
  }
  // The status is the recording stream's sticky error if a draw failed;
  // that stream reports it at its next sync. The state is final either way.
  (void)ph_event_synchronize(last_draw_);
  draws_pending_ = false;
}

void PhantomGeneratorImpl::set_current_seed(uint64_t seed) {
  waitForQueuedDraws();
  cpu_generator_.set_current_seed(seed);
}

void PhantomGeneratorImpl::set_offset(uint64_t offset) {
  waitForQueuedDraws();
  cpu_generator_.set_offset(offset);
}

uint64_t PhantomGeneratorImpl::get_offset() const {
  waitForQueuedDraws();
  return cpu_generator_.get_offset();
}

uint64_t PhantomGeneratorImpl::current_seed() const {
  return cpu_generator_.current_seed();
}

uint64_t PhantomGeneratorImpl::seed() {
  waitForQueuedDraws();
  return cpu_generator_.seed();
}

void PhantomGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  waitForQueuedDraws();
  cpu_generator_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> PhantomGeneratorImpl::get_state() const {
  waitForQueuedDraws();
  return cpu_generator_.unsafeGetGeneratorImpl()->get_state();
}

PhantomGeneratorImpl* PhantomGeneratorImpl::clone_impl() const {
  waitForQueuedDraws();
  return new PhantomGeneratorImpl(device().index(), cpu_generator_.clone());
}

const at::Generator& defaultGenerator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::vector<at::Generator>* generators = nullptr;
  std::call_once(once, [] {
    const c10::DeviceIndex count = deviceCountNoThrow();
    // Leaked on purpose, like every default generator in PyTorch.
    generators = new std::vector<at::Generator>();
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      generators->push_back(at::make_generator<PhantomGeneratorImpl>(i));
    }
  });
  if (device < 0) {
    device = currentDevice();
  }
  checkDeviceIndex(device);
  return (*generators)[device];
}

at::Generator newGenerator(c10::DeviceIndex device) {
  if (device < 0) {
    device = currentDevice();
  }
  checkDeviceIndex(device);
  return at::make_generator<PhantomGeneratorImpl>(device);
}

at::Generator cpuGeneratorFor(const std::optional<at::Generator>& generator,
                              c10::DeviceIndex device) {
  return phantomGeneratorFor(generator, device)->cpuGenerator();
}

PhantomGeneratorImpl* phantomGeneratorFor(
    const std::optional<at::Generator>& generator, c10::DeviceIndex device) {
  if (!generator.has_value() || !generator->defined()) {
    return defaultGenerator(device).get<PhantomGeneratorImpl>();
  }
  const c10::Device where = generator->device();
  TORCH_CHECK(where.type() == c10::DeviceType::PrivateUse1,
              "expected a generator of device ",
              c10::Device(c10::DeviceType::PrivateUse1, device),
              " but got one of device ", where,
              "; create it with torch.Generator(device='",
              c10::get_privateuse1_backend(), "')");
  return generator->get<PhantomGeneratorImpl>();
}

}  // namespace phantom
