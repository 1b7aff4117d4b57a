// See phantom/Stream.h. Stream ids: 0 is the default stream, 1..32 the
// low-priority pool, 33..64 the high-priority pool; a negative id is an
// external stream's handle.
#include <phantom/Device.h>
#include <phantom/Exception.h>
#include <phantom/GpuTrace.h>
#include <phantom/DeviceWork.h>
#include <phantom/Stream.h>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace phantom {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kStreamsPerDevice = 1 + 2 * kStreamsPerPool;

struct DeviceStreams {
  std::mutex create_mutex;  // serialises lazy creation of driver streams
  std::array<std::atomic<ph_stream_t>, kStreamsPerDevice> handles{};
  std::atomic<uint32_t> next_low{0};
  std::atomic<uint32_t> next_high{0};
  // Registered external streams (guarded by create_mutex), and whether
  // there are any (read without the lock on the synchronize paths).
  std::vector<ph_stream_t> external;
  std::atomic<bool> has_external{false};
};

DeviceStreams& streamsOf(c10::DeviceIndex device) {
  // Leaked on purpose: streams outlive every static destructor that might
  // still free tensors at exit.
  static auto* all = new std::array<DeviceStreams, kMaxDevices>();
  return (*all)[device];
}

thread_local std::array<c10::StreamId, kMaxDevices> current_stream_ids{};

c10::DeviceIndex resolve(c10::DeviceIndex device) {
  if (device < 0) {
    return currentDevice();
  }
  checkDeviceIndex(device);
  return device;
}

int priorityOfId(c10::StreamId id) {
  return id > kStreamsPerPool ? kHighPriority : kLowPriority;
}

std::string hexString(ph_stream_t handle) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx",
                static_cast<unsigned long long>(
                    reinterpret_cast<uintptr_t>(handle)));
  return text;
}

c10::StreamId externalId(ph_stream_t handle) {
  return -1 - static_cast<c10::StreamId>(reinterpret_cast<uintptr_t>(handle));
}

ph_stream_t externalHandle(c10::StreamId id) {
  return reinterpret_cast<ph_stream_t>(static_cast<uintptr_t>(-1 - id));
}

bool isRegisteredExternal(c10::DeviceIndex device, ph_stream_t handle) {
  DeviceStreams& streams = streamsOf(device);
  std::lock_guard<std::mutex> lock(streams.create_mutex);
  return std::find(streams.external.begin(), streams.external.end(), handle) !=
         streams.external.end();
}

std::vector<ph_stream_t> externalStreamsOf(c10::DeviceIndex device) {
  DeviceStreams& streams = streamsOf(device);
  if (!streams.has_external.load(std::memory_order_acquire)) {
    return {};
  }
  std::lock_guard<std::mutex> lock(streams.create_mutex);
  return streams.external;
}

c10::Stream makeStream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

}  // namespace

PhantomStream::PhantomStream(c10::Stream stream) : stream_(stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "expected a ", c10::get_privateuse1_backend(),
              " stream, got a stream of device type ", stream.device_type());
  if (C10_UNLIKELY(stream.id() < 0)) {
    TORCH_CHECK(stream.device_index() >= 0 &&
                    stream.device_index() < deviceCountNoThrow() &&
                    isRegisteredExternal(stream.device_index(),
                                         externalHandle(stream.id())),
                "invalid ", c10::get_privateuse1_backend(), " stream id ",
                stream.id(), ": not an external stream of ", stream.device(),
                "; wrap a driver stream with torch.",
                c10::get_privateuse1_backend(),
                ".get_stream_from_external() first");
    return;
  }
  TORCH_CHECK(stream.id() < kStreamsPerDevice,
              "invalid ", c10::get_privateuse1_backend(), " stream id ",
              stream.id(), " (valid ids are 0..", kStreamsPerDevice - 1,
              "); make streams with torch.", c10::get_privateuse1_backend(),
              ".Stream() or torch.", c10::get_privateuse1_backend(),
              ".current_stream() rather than from a stream id");
}

int PhantomStream::priority() const {
  if (is_external()) {
    int priority = 0;
    PHANTOM_CHECK(ph_stream_get_priority(externalHandle(id()), &priority));
    return priority;
  }
  return priorityOfId(id());
}

ph_stream_t PhantomStream::handle() const {
  if (C10_UNLIKELY(inBadFork())) {
    throwBadFork();  // the driver stream's worker thread is not in this process
  }
  if (C10_UNLIKELY(is_external())) {
    return externalHandle(id());
  }
  DeviceStreams& streams = streamsOf(device_index());
  std::atomic<ph_stream_t>& slot = streams.handles[id()];
  ph_stream_t handle = slot.load(std::memory_order_acquire);
  if (C10_LIKELY(handle != nullptr)) {
    return handle;
  }
  {
    std::lock_guard<std::mutex> lock(streams.create_mutex);
    handle = slot.load(std::memory_order_relaxed);
    if (handle != nullptr) {
      return handle;
    }
    checkDeviceIndex(device_index());
    PHANTOM_CHECK(ph_stream_create(device_index(), priority(), &handle));
    slot.store(handle, std::memory_order_release);
  }
  gpu_trace::streamCreated(handle);
  return handle;
}

// Replaces the driver stream behind (device, id) after its error has been
// reported. The old stream has no pending work left (it was synchronized or
// found idle), so destroying it does not wait.
static void resetStream(c10::DeviceIndex device, c10::StreamId id, ph_stream_t failed) {
  DeviceStreams& streams = streamsOf(device);
  std::lock_guard<std::mutex> lock(streams.create_mutex);
  if (streams.handles[id].load(std::memory_order_relaxed) == failed) {
    streams.handles[id].store(nullptr, std::memory_order_release);
    (void)ph_stream_destroy(failed);
  }
}

// Raises `status` (an error of work on `stream`) and resets the stream,
// unless it is an external one, which is its owner's to replace.
static void raiseStreamError(ph_status_t status, const PhantomStream& stream,
                      ph_stream_t handle) {
  try {
    PHANTOM_CHECK(status);
  } catch (...) {
    if (status == PH_ERROR_DEVICE && !stream.is_external()) {
      resetStream(stream.device_index(), stream.id(), handle);
    }
    throw;
  }
}

void PhantomStream::raiseError(ph_status_t status, ph_stream_t handle) const {
  raiseStreamError(status, *this, handle);
  TORCH_INTERNAL_ASSERT(false, "raiseStreamError returned");
}

bool PhantomStream::query() const {
  const ph_stream_t stream = handle();
  const ph_status_t status = ph_stream_query(stream);
  if (status == PH_NOT_READY) {
    return false;
  }
  if (status != PH_SUCCESS) {
    raiseStreamError(status, *this, stream);
  }
  return true;
}

void PhantomStream::synchronize() const {
  const ph_stream_t stream = handle();
  gpu_trace::streamSynchronized(stream);
  const ph_status_t status = ph_stream_synchronize(stream);
  // The closures of the work just waited for.
  hostExecHooks().release_finished_work();
  if (status != PH_SUCCESS) {
    raiseStreamError(status, *this, stream);
  }
}

PhantomStream getDefaultPhantomStream(c10::DeviceIndex device) {
  return PhantomStream(makeStream(resolve(device), 0));
}

PhantomStream getCurrentPhantomStream(c10::DeviceIndex device) {
  device = resolve(device);
  return PhantomStream(makeStream(device, current_stream_ids[device]));
}

c10::StreamId currentPhantomStreamId(c10::DeviceIndex device) noexcept {
  return current_stream_ids[device];
}

PhantomStream getStreamFromPool(bool high_priority, c10::DeviceIndex device) {
  device = resolve(device);
  DeviceStreams& streams = streamsOf(device);
  std::atomic<uint32_t>& next = high_priority ? streams.next_high
                                              : streams.next_low;
  const uint32_t index = next.fetch_add(1, std::memory_order_relaxed) %
                         kStreamsPerPool;
  const c10::StreamId id = 1 + (high_priority ? kStreamsPerPool : 0) + index;
  return PhantomStream(makeStream(device, id));
}

PhantomStream getStreamFromPool(int priority, c10::DeviceIndex device) {
  return getStreamFromPool(priority < 0, device);
}

PhantomStream streamFromHandle(ph_stream_t handle, c10::DeviceIndex device) {
  TORCH_CHECK(handle != nullptr,
              "a phantom driver stream handle must not be null (0)");
  int owner = -1;
  const ph_status_t status = ph_stream_get_device(handle, &owner);
  TORCH_CHECK(status == PH_SUCCESS, hexString(handle),
              " is not a live phantom driver stream: ", ph_last_error_message(),
              ". Pass the handle ph_stream_create gave, and keep that stream "
              "alive while torch uses it");
  const auto stream_device = static_cast<c10::DeviceIndex>(owner);
  TORCH_CHECK(device < 0 || device == stream_device,
              "the driver stream ", hexString(handle),
              " belongs to ",
              c10::Device(c10::DeviceType::PrivateUse1, stream_device),
              ", not ", c10::Device(c10::DeviceType::PrivateUse1, device),
              "; pass device=", owner, " or leave device unset");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(handle) <= uintptr_t{INT64_MAX},
              "the driver stream handle ", hexString(handle),
              " does not fit a stream id");
  DeviceStreams& streams = streamsOf(stream_device);
  for (c10::StreamId id = 0; id < kStreamsPerDevice; ++id) {
    if (streams.handles[id].load(std::memory_order_acquire) == handle) {
      return PhantomStream(makeStream(stream_device, id));  // one of ours
    }
  }
  {
    std::lock_guard<std::mutex> lock(streams.create_mutex);
    if (std::find(streams.external.begin(), streams.external.end(), handle) ==
        streams.external.end()) {
      streams.external.push_back(handle);
      streams.has_external.store(true, std::memory_order_release);
    }
  }
  return PhantomStream(makeStream(stream_device, externalId(handle)));
}

void setCurrentPhantomStream(PhantomStream stream) {
  checkDeviceIndex(stream.device_index());
  current_stream_ids[stream.device_index()] = stream.id();
}

void synchronizeDevice(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  gpu_trace::deviceSynchronized(device);
  std::exception_ptr first_error;
  for (c10::StreamId id = 0; id < kStreamsPerDevice; ++id) {
    if (streamsOf(device).handles[id].load(std::memory_order_acquire) == nullptr) {
      continue;  // never used
    }
    try {
      PhantomStream(makeStream(device, id)).synchronize();
    } catch (...) {
      if (!first_error) {
        first_error = std::current_exception();
      }
    }
  }
  for (ph_stream_t handle : externalStreamsOf(device)) {
    if (ph_stream_query(handle) == PH_ERROR_INVALID_HANDLE) {
      continue;  // its owner destroyed it: nothing left to wait for
    }
    try {
      PhantomStream(makeStream(device, externalId(handle))).synchronize();
    } catch (...) {
      if (!first_error) {
        first_error = std::current_exception();
      }
    }
  }
  if (first_error) {
    std::rethrow_exception(first_error);
  }
}

void synchronizeAllStreams(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  const ph_stream_t self = currentWorkStream();
  for (const auto& slot : streamsOf(device).handles) {
    const ph_stream_t handle = slot.load(std::memory_order_acquire);
    if (handle != nullptr && handle != self) {
      // A stream's sticky error is reported by its own sync; here only the
      // waiting matters.
      (void)ph_stream_synchronize(handle);
    }
  }
  for (ph_stream_t handle : externalStreamsOf(device)) {
    if (handle != self) {
      (void)ph_stream_synchronize(handle);  // a destroyed one: INVALID_HANDLE
    }
  }
  // The closures of the work just waited for.
  hostExecHooks().release_finished_work();
}

std::ostream& operator<<(std::ostream& out, const PhantomStream& stream) {
  return out << stream.unwrap();
}

}  // namespace phantom
