// Fault injection; see phantom/FaultInjection.h for what the knobs do.
//
// State is a handful of atomics. `active` is a bit set (counting, each knob
// armed, a bad environment value) so that the hooks' fast path is a single
// relaxed load that is zero in ordinary runs. A failure knob is a countdown:
// each counted request takes one off with a compare-and-swap, and the
// request that takes the last one fires and clears the knob's bit, so the
// knob fires exactly once even when requests race from several threads.
// Which knob armed it (environment or Python) is remembered for the error
// message, so a user who forgot an exported variable sees where the failure
// came from.
#include <phantom/Device.h>
#include <phantom/FaultInjection.h>
#include <phantom/hal.h>
#include <phantom/common/settings.h>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <string>
#include <thread>

namespace phantom {
namespace faults_detail {
std::atomic<uint32_t> active{0};
}  // namespace faults_detail

namespace {

using faults_detail::active;

constexpr uint32_t kCounting = 1u << 0;
constexpr uint32_t kAllocationArmed = 1u << 1;
constexpr uint32_t kKernelArmed = 1u << 2;
constexpr uint32_t kLatency = 1u << 3;
constexpr uint32_t kBadEnvironment = 1u << 4;

constexpr const char* kAllocVariable = settings::kFaultAlloc.name;
constexpr const char* kKernelVariable = settings::kFaultKernel.name;
static_assert(settings::kFaultLatencyUs.max == kMaxFaultLatencyUs,
              "the environment and Python accept the same latencies");

// A one-shot countdown plus what armed it.
struct Knob {
  std::atomic<int64_t> left{0};    // requests until it fires; 0: disarmed
  std::atomic<int64_t> armed_k{0}; // the k it was armed with
  std::atomic<bool> from_environment{false};
  const uint32_t bit;
  const char* variable;
  const char* python_call;

  void arm(int64_t k, bool environment) {
    armed_k.store(k, std::memory_order_relaxed);
    from_environment.store(environment, std::memory_order_relaxed);
    left.store(k, std::memory_order_release);
    if (k > 0) {
      active.fetch_or(bit | kCounting, std::memory_order_release);
    } else {
      active.fetch_and(~bit, std::memory_order_release);
    }
  }

  // Takes one request off; true for the request that fires the knob.
  bool take() {
    int64_t current = left.load(std::memory_order_acquire);
    while (current > 0) {
      if (left.compare_exchange_weak(current, current - 1,
                                     std::memory_order_acq_rel)) {
        if (current == 1) {
          active.fetch_and(~bit, std::memory_order_release);
          return true;
        }
        return false;
      }
    }
    return false;
  }

  // "allocation request #3 since PHANTOM_FAULT_ALLOC=3 armed the knob"
  std::string origin(const char* what) const {
    const int64_t k = armed_k.load(std::memory_order_relaxed);
    std::string text = std::string(what) + " #" + std::to_string(k) + " since ";
    if (from_environment.load(std::memory_order_relaxed)) {
      text += std::string(variable) + "=" + std::to_string(k);
    } else {
      text += std::string("torch_phantom.testing.faults.") + python_call + "(" +
              std::to_string(k) + ")";
    }
    return text + " armed it";
  }
};

Knob allocation_knob{{}, {}, {}, kAllocationArmed, kAllocVariable,
                     "fail_allocation"};
Knob kernel_knob{{}, {}, {}, kKernelArmed, kKernelVariable, "fail_kernel"};
std::atomic<int64_t> latency_us{0};
std::atomic<int64_t> allocation_count{0};
std::atomic<int64_t> kernel_count{0};

std::string& environmentError() {
  static std::string* error = new std::string();  // leaked: read at any time
  return *error;
}

bool counting() {
  return active.load(std::memory_order_relaxed) & kCounting;
}

void checkEnvironmentFast() {
  if (C10_UNLIKELY(active.load(std::memory_order_relaxed) & kBadEnvironment)) {
    checkFaultEnvironment();
  }
}

void sleepMicroseconds(int64_t microseconds) {
  std::this_thread::sleep_for(std::chrono::microseconds(microseconds));
}

// Read once when the library loads, before any allocation or launch, with
// the settings parser (device/common). A bad value cannot throw from a
// static initialiser; it is kept and raised by checkFaultEnvironment and by
// the first hook (and the device refuses to start: phantom/Settings.h).
struct ReadEnvironment {
  ReadEnvironment() {
    settings::Value allocation;
    settings::Value kernel;
    settings::Value latency;
    std::string error;
    if (!settings::ReadEnvironment(settings::kFaultAlloc, &allocation, &error) ||
        !settings::ReadEnvironment(settings::kFaultKernel, &kernel, &error) ||
        !settings::ReadEnvironment(settings::kFaultLatencyUs, &latency, &error)) {
      environmentError() = error;
      active.fetch_or(kBadEnvironment, std::memory_order_release);
      return;
    }
    if (allocation.set) {
      allocation_knob.arm(static_cast<int64_t>(allocation.number), true);
    }
    if (kernel.set) {
      kernel_knob.arm(static_cast<int64_t>(kernel.number), true);
    }
    if (latency.set) {
      setFaultLatencyUs(static_cast<int64_t>(latency.number));
    }
  }
} read_environment;

}  // namespace

void checkFaultEnvironment() {
  if (active.load(std::memory_order_acquire) & kBadEnvironment) {
    TORCH_CHECK_VALUE(false, environmentError());
  }
}

void failAllocation(int64_t k) {
  TORCH_CHECK_VALUE(k >= 0, "fail_allocation: k must be >= 1 (the k-th "
                    "allocation from now fails) or 0 to disarm, got ", k);
  allocation_knob.arm(k, false);
}

void failKernel(int64_t k) {
  TORCH_CHECK_VALUE(k >= 0, "fail_kernel: k must be >= 1 (the k-th kernel "
                    "launched from now fails) or 0 to disarm, got ", k);
  kernel_knob.arm(k, false);
}

void setFaultLatencyUs(int64_t microseconds) {
  TORCH_CHECK_VALUE(microseconds >= 0 && microseconds <= kMaxFaultLatencyUs,
                    "set_latency_us: expected microseconds from 0 to ",
                    kMaxFaultLatencyUs, ", got ", microseconds);
  latency_us.store(microseconds, std::memory_order_relaxed);
  if (microseconds > 0) {
    active.fetch_or(kLatency, std::memory_order_release);
  } else {
    active.fetch_and(~kLatency, std::memory_order_release);
  }
}

void resetFaults() {
  allocation_knob.arm(0, false);
  kernel_knob.arm(0, false);
  setFaultLatencyUs(0);
  allocation_count.store(0, std::memory_order_relaxed);
  kernel_count.store(0, std::memory_order_relaxed);
  active.fetch_or(kCounting, std::memory_order_release);
}

int64_t faultAllocationCount() {
  return allocation_count.load(std::memory_order_relaxed);
}

int64_t faultKernelCount() {
  return kernel_count.load(std::memory_order_relaxed);
}

int64_t allocationsUntilFault() {
  return allocation_knob.left.load(std::memory_order_relaxed);
}

int64_t kernelsUntilFault() {
  return kernel_knob.left.load(std::memory_order_relaxed);
}

int64_t faultLatencyUs() {
  return latency_us.load(std::memory_order_relaxed);
}

namespace faults_detail {

void onAllocationSlow(size_t nbytes) {
  checkEnvironmentFast();
  if (nbytes == 0) {
    return;  // not a device allocation: no memory is asked for
  }
  if (counting()) {
    allocation_count.fetch_add(1, std::memory_order_relaxed);
  }
  if (!allocation_knob.take()) {
    return;
  }
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, c10::get_privateuse1_backend(),
      " out of memory: tried to allocate ", nbytes, " bytes on ",
      c10::Device(c10::DeviceType::PrivateUse1, currentDevice()),
      ". Injected fault: ", allocation_knob.origin("allocation request"),
      "; nothing was allocated and the knob is now disarmed.");
}

void onLaunchSlow(const PhantomStream& stream, const char* name,
                  std::function<void()>& work, bool waited) {
  checkEnvironmentFast();
  if (counting()) {
    kernel_count.fetch_add(1, std::memory_order_relaxed);
  }
  if (kernel_knob.take()) {
    std::string message = "injected device fault: " +
                          kernel_knob.origin("kernel") +
                          "; the work did not run";
    if (waited) {
      // Raised to the caller as the stream would have reported it.
      message = std::string("phantom PH_ERROR_DEVICE: work '") +
                (name != nullptr ? name : "(unnamed)") +
                "' failed on phantom device " +
                std::to_string(stream.device_index()) + ": " + message;
    }
    // The original closure is kept in the failing one so that what it
    // captured is released on the worker, as it would have been.
    work = [original = std::move(work), message = std::move(message)] {
      throw c10::AcceleratorError({"phantom", __FILE__, __LINE__},
                                  PH_ERROR_DEVICE, message);
    };
  }
  const int64_t delay = latency_us.load(std::memory_order_relaxed);
  if (delay > 0) {
    work = [inner = std::move(work), delay] {
      sleepMicroseconds(delay);
      inner();
    };
  }
}

void beforeCopySlow(c10::Device src, c10::Device dst) {
  checkEnvironmentFast();
  const int64_t delay = latency_us.load(std::memory_order_relaxed);
  const bool src_phantom = src.type() == c10::DeviceType::PrivateUse1;
  const bool dst_phantom = dst.type() == c10::DeviceType::PrivateUse1;
  if (delay <= 0 || src_phantom == dst_phantom) {
    return;  // device-to-device copies are kernels: delayed at launch
  }
  const PhantomStream stream =
      getCurrentPhantomStream(src_phantom ? src.index() : dst.index());
  const ph_host_task_t task{
      "injected copy latency",
      [](void* user_data, char*, size_t) {
        sleepMicroseconds(reinterpret_cast<intptr_t>(user_data));
        return PH_SUCCESS;
      },
      nullptr, reinterpret_cast<void*>(static_cast<intptr_t>(delay))};
  // A refusal (the stream has a sticky error) is reported by the copy that
  // follows, on the same stream.
  (void)ph_launch_host_func(stream.handle(), &task);
}

}  // namespace faults_detail
}  // namespace phantom
