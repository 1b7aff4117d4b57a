// Fault injection: make the device fail on purpose, to test that user code
// (and the runtime) recovers from out-of-memory and device errors, and that
// it synchronizes where it must.
//
// Three knobs, each set by an environment variable at start-up or from
// Python (torch_phantom.testing.faults):
//
//   fail allocation k   the k-th request to the caching device allocator
//                       after arming (1-based; cache hits count, zero-size
//                       requests do not) raises c10::OutOfMemoryError
//                       (torch.OutOfMemoryError) saying it was injected.
//                       Nothing is allocated.       PHANTOM_FAULT_ALLOC=k
//   fail kernel k       the k-th work item launched through launchAsync /
//                       launchAndWait after arming fails on the device
//                       instead of running: a c10::AcceleratorError naming
//                       the work, sticky on the stream (launchAsync) or
//                       raised to the caller (launchAndWait).
//                                                   PHANTOM_FAULT_KERNEL=k
//   latency n           every kernel, and every host<->device copy made by
//                       _copy_from, first sleeps n microseconds on its
//                       stream, so the host runs ahead and a missing
//                       synchronization shows up.   PHANTOM_FAULT_LATENCY_US=n
//
// The two failure knobs are one-shot: after firing they disarm. Host<->device
// copies (ph_memcpy_async) are transfers, not kernels, and are not counted;
// a same-device copy is a kernel ("aten::copy_") and is.
//
// Why here and not in the driver: the runtime owns the two entry points every
// allocation and every kernel goes through, so the knobs work unchanged with
// any vendor's driver behind hal.h.
//
// Cost: all state is atomics. While nothing is armed and counting has not
// been started (see resetFaults), each hook is one relaxed atomic load.
// Counting starts with the first resetFaults() or arming, and from then on
// costs one atomic increment per allocation and per launch.
//
// The environment values are parsed by the settings parser
// (phantom/common/settings.h). A malformed one is remembered at load time;
// the device then refuses to start (phantom/Settings.h), so a C++ program
// gets it as a c10::ValueError from its first use of the device, and Python's
// import raises it before loading the runtime.
#pragma once

#include <phantom/Stream.h>

#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace phantom {

// Arm the knobs. k >= 1 counts from this call; k == 0 disarms.
// Throws c10::ValueError for a negative k.
void failAllocation(int64_t k);
void failKernel(int64_t k);
// Microseconds added to every kernel and copy; 0 turns it off.
// Throws c10::ValueError outside [0, kMaxFaultLatencyUs].
void setFaultLatencyUs(int64_t microseconds);
constexpr int64_t kMaxFaultLatencyUs = 10'000'000;

// Disarms both failure knobs, sets the latency to 0, zeroes the counters
// and starts counting.
void resetFaults();

// Allocation requests and kernel launches since the last resetFaults() (0
// before counting started).
int64_t faultAllocationCount();
int64_t faultKernelCount();

// What is still armed: requests left until the knob fires (0: disarmed).
int64_t allocationsUntilFault();
int64_t kernelsUntilFault();
int64_t faultLatencyUs();

// Throws c10::ValueError naming the variable if an environment knob had a
// malformed value at start-up; no-op otherwise.
void checkFaultEnvironment();

namespace faults_detail {
// Nonzero while any knob is armed or counting is on: the hooks' fast path.
extern std::atomic<uint32_t> active;
void onAllocationSlow(size_t nbytes);
void onLaunchSlow(const PhantomStream& stream, const char* name,
                  std::function<void()>& work, bool waited);
void beforeCopySlow(c10::Device src, c10::Device dst);
}  // namespace faults_detail

// --- Hooks -----------------------------------------------------------------

// Top of the device allocator's entry point. Throws c10::OutOfMemoryError
// when the allocation knob fires.
inline void faultHookAllocation(size_t nbytes) {
  if (C10_UNLIKELY(faults_detail::active.load(std::memory_order_relaxed))) {
    faults_detail::onAllocationSlow(nbytes);
  }
}

// Launch.cpp, before queueing `work`: counts it and, when a knob applies,
// wraps it (sleep first, or fail instead of running).
inline void faultHookLaunch(const PhantomStream& stream, const char* name,
                            std::function<void()>& work, bool waited) {
  if (C10_UNLIKELY(faults_detail::active.load(std::memory_order_relaxed))) {
    faults_detail::onLaunchSlow(stream, name, work, waited);
  }
}

// Top of _copy_from: with latency set, queues a sleep on the phantom side's
// current stream ahead of a host<->device transfer.
inline void faultHookCopy(c10::Device src, c10::Device dst) {
  if (C10_UNLIKELY(faults_detail::active.load(std::memory_order_relaxed))) {
    faults_detail::beforeCopySlow(src, dst);
  }
}

}  // namespace phantom
