// The device guard: how PyTorch's generic code (DeviceGuard, StreamGuard,
// torch.Stream, torch.Event, torch.accelerator) drives phantom devices,
// streams and events. Registered for PrivateUse1 when the library loads.
//
// Events are driver events (ph_event_t) created lazily on first record.
// EventFlag::PYTORCH_DEFAULT disables timing, as in CUDA; BACKEND_DEFAULT
// (torch.Event(enable_timing=True)) enables it.
#include <phantom/Graph.h>
#include <phantom/DeviceAllocator.h>
#include <phantom/Device.h>
#include <phantom/DeviceState.h>
#include <phantom/Exception.h>
#include <phantom/GpuTrace.h>
#include <phantom/DeviceWork.h>
#include <phantom/Stream.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

namespace phantom {
namespace {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

ph_event_t asEvent(void* event) {
  return static_cast<ph_event_t>(event);
}

struct PhantomGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDeviceType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kDeviceType, "expected a ",
                c10::get_privateuse1_backend(), " device, got ", device);
    return {kDeviceType, phantom::exchangeDevice(device.index())};
  }

  c10::Device getDevice() const override {
    return {kDeviceType, currentDevice()};
  }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kDeviceType, "expected a ",
                c10::get_privateuse1_backend(), " device, got ", device);
    setCurrentDevice(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    (void)ph_set_device(device.index());
  }

  c10::Stream getStream(c10::Device device) const override {
    return getCurrentPhantomStream(device.index()).unwrap();
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return getDefaultPhantomStream(device.index()).unwrap();
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device,
                                      bool high_priority) const override {
    return getStreamFromPool(high_priority, device.index()).unwrap();
  }

  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return getStreamFromPool(priority, device.index()).unwrap();
  }

  // torch.Stream.native_handle: the driver stream (ph_stream_t).
  void* getStreamNativeHandle(const c10::Stream stream) const override {
    return PhantomStream(stream).handle();
  }

  // torch.accelerator.get_device_capability: the dtypes phantom tensors
  // hold and convert between (DeviceState.h); the same on every device.
  c10::DeviceCapability getDeviceCapability(c10::Device device) const override {
    checkDeviceIndex(device.index() < 0 ? currentDevice() : device.index());
    return deviceCapability();
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    const PhantomStream next(stream);
    const PhantomStream previous =
        getCurrentPhantomStream(next.device_index());
    setCurrentPhantomStream(next);
    return previous.unwrap();
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return deviceCountNoThrow();
  }

  bool isStreamCapturing(const c10::Stream& stream) const override {
    return phantom::isStreamCapturing(stream);  // phantom/Graph.h
  }

  bool queryStream(const c10::Stream& stream) const override {
    const PhantomStream phantom_stream(stream);
    const bool done = phantom_stream.query();
    if (done) {
      gpu_trace::queryFinished(false, gpu_trace::id(phantom_stream.handle()));
    }
    return done;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    PhantomStream(stream).synchronize();
  }

  void synchronizeDevice(const c10::DeviceIndex device) const override {
    phantom::synchronizeDevice(device);
  }

  void recordDataPtrOnStream(const c10::DataPtr& data,
                             const c10::Stream& stream) const override {
    deviceAllocator().recordStream(data, stream);
    if (gpu_trace::recordStreamObserver() != nullptr) {  // the race detector
      gpu_trace::streamRecordedOn(data.get(),
                                  gpu_trace::id(PhantomStream(stream).handle()));
    }
  }

  void record(void** event, const c10::Stream& stream,
              const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "event of ", c10::Device(kDeviceType, device_index),
                " cannot be recorded on a stream of ", stream.device(),
                "; record it on a stream of its own device");
    const PhantomStream phantom_stream(stream);
    if (*event == nullptr) {
      const unsigned flags = flag == c10::EventFlag::BACKEND_DEFAULT
                                 ? PH_EVENT_DEFAULT
                                 : PH_EVENT_DISABLE_TIMING;
      ph_event_t created = nullptr;
      PHANTOM_CHECK(ph_event_create(flags, &created));
      *event = created;
      gpu_trace::eventCreated(created);
    }
    const ph_stream_t handle = phantom_stream.handle();
    gpu_trace::eventRecorded(*event, handle);
    PHANTOM_CHECK(ph_event_record(asEvent(*event), handle));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) {
      return;  // never recorded: nothing to wait for
    }
    const ph_stream_t handle = PhantomStream(stream).handle();
    gpu_trace::eventWaited(event, handle);
    PHANTOM_CHECK(ph_stream_wait_event(handle, asEvent(event)));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) {
      return true;
    }
    const ph_status_t status = ph_event_query(asEvent(event));
    if (status == PH_NOT_READY) {
      return false;
    }
    PHANTOM_CHECK(status);
    gpu_trace::queryFinished(true, gpu_trace::id(event));
    return true;
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) {
      return;
    }
    gpu_trace::eventSynchronized(event);
    PHANTOM_CHECK(ph_event_synchronize(asEvent(event)));
    // The closures of the work just waited for.
    hostExecHooks().release_finished_work();
  }

  double elapsedTime(void* start, void* end,
                     const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "elapsed_time needs both events to have been recorded; "
                "call record() on each first");
    float milliseconds = 0;
    PHANTOM_CHECK(
        ph_event_elapsed_time(asEvent(start), asEvent(end), &milliseconds));
    return milliseconds;
  }

  void destroyEvent(void* event,
                    const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event != nullptr) {
      gpu_trace::eventDestroyed(event);
      (void)ph_event_destroy(asEvent(event));
    }
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, PhantomGuardImpl);

}  // namespace phantom
