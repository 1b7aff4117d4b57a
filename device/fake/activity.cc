// Device activity meters and their sampling; see activity.h.
#include "activity.h"

#include <array>
#include <chrono>
#include <mutex>

#include "config.h"

namespace phantom::fake {
namespace {

constexpr int kCountShift = 48;
constexpr uint64_t kTimeMask = (uint64_t{1} << kCountShift) - 1;
// Checkpoints kept per device: with one at most every period / 4, the
// ring spans at least four periods.
constexpr size_t kCheckpoints = 16;

std::atomic<bool> g_metering{false};

struct Checkpoint {
  uint64_t time_ns = 0;
  uint64_t compute_busy_ns = 0;
  uint64_t memory_busy_ns = 0;
};

struct DeviceActivity {
  ActivityMeter compute;
  ActivityMeter memory;
  std::mutex mutex;  // guards the checkpoints
  std::array<Checkpoint, kCheckpoints> checkpoints{};
  size_t checkpoint_count = 0;  // valid entries, oldest first
};

DeviceActivity& ActivityOf(int device) {
  // Leaked on purpose, like the streams whose workers update it: a worker
  // may still finish a task while static destructors run at exit.
  static auto* all = new std::array<DeviceActivity, kMaxDevices>();
  return (*all)[device];
}

uint32_t Percent(uint64_t busy_ns, uint64_t period_ns) {
  if (period_ns == 0) return 0;
  const uint64_t percent = (busy_ns * 100 + period_ns / 2) / period_ns;
  return static_cast<uint32_t>(percent > 100 ? 100 : percent);
}

}  // namespace

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void ActivityMeter::Change(int delta, uint64_t now_ns) {
  uint64_t old_state = state_.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t count = old_state >> kCountShift;
    const uint64_t then = old_state & kTimeMask;
    uint64_t elapsed = 0;
    uint64_t time = now_ns & kTimeMask;
    if (count > 0) {
      // Two threads may read the clock in one order and get here in the
      // other: while busy, the clock of the word never goes back, and the
      // late reading adds nothing. (Idle, the time only starts the next
      // busy stretch, and an idle device may have waited any time.)
      elapsed = (now_ns - then) & kTimeMask;
      if (elapsed > (kTimeMask >> 1)) {  // "negative": now_ns is older
        elapsed = 0;
        time = then;
      }
    }
    const uint64_t new_count = delta < 0 && count == 0 ? 0 : count + delta;
    const uint64_t new_state = (new_count << kCountShift) | time;
    if (state_.compare_exchange_weak(old_state, new_state,
                                     std::memory_order_acq_rel,
                                     std::memory_order_relaxed)) {
      if (elapsed > 0) {
        busy_ns_.fetch_add(elapsed, std::memory_order_relaxed);
      }
      return;
    }
  }
}

uint64_t ActivityMeter::BusyNs(uint64_t now_ns) {
  Change(0, now_ns);  // credits the running work up to now
  return busy_ns_.load(std::memory_order_relaxed);
}

bool MeteringEnabled() { return g_metering.load(std::memory_order_relaxed); }

void EnableMetering() { g_metering.store(true, std::memory_order_relaxed); }

ActivityMeter& ComputeMeter(int device) { return ActivityOf(device).compute; }
ActivityMeter& MemoryMeter(int device) { return ActivityOf(device).memory; }

ActivitySample SampleActivity(int device) {
  EnableMetering();
  DeviceActivity& activity = ActivityOf(device);
  std::lock_guard<std::mutex> lock(activity.mutex);
  const uint64_t now = NowNs();
  const Checkpoint current{now, activity.compute.BusyNs(now),
                           activity.memory.BusyNs(now)};
  auto& ring = activity.checkpoints;
  size_t& count = activity.checkpoint_count;
  ActivitySample sample;
  if (count > 0) {
    // The newest checkpoint at least a period old, else the oldest.
    const Checkpoint* from = &ring[0];
    for (size_t i = count; i-- > 0;) {
      if (now - ring[i].time_ns >= kMinSamplePeriodNs) {
        from = &ring[i];
        break;
      }
    }
    sample.period_ns = now - from->time_ns;
    sample.compute_percent =
        Percent(current.compute_busy_ns - from->compute_busy_ns, sample.period_ns);
    sample.memory_percent =
        Percent(current.memory_busy_ns - from->memory_busy_ns, sample.period_ns);
  }
  if (count == 0 || now - ring[count - 1].time_ns >= kMinSamplePeriodNs / 4) {
    if (count == kCheckpoints) {
      for (size_t i = 1; i < kCheckpoints; ++i) ring[i - 1] = ring[i];
      --count;
    }
    ring[count++] = current;
  }
  return sample;
}

}  // namespace phantom::fake
