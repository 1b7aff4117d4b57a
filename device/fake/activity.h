// Device activity: how busy each fake device has been, for
// ph_device_get_telemetry.
//
// Two meters per device integrate, over time, "is anything running?":
// the compute meter for work launched on the device's streams (host
// functions: the fake's kernels), the memory meter for copies and fills
// (ph_memcpy, ph_memcpy_async, ph_memset_async). Each meter keeps the
// number of pieces of work running and the time of the last change in one
// 64-bit word (16 bits of count, 48 bits of nanoseconds compared modulo
// 2^48: a busy stretch without any start or end in it may last 39 hours)
// and a running total of busy nanoseconds. A start or an end is one compare-and-swap of that word;
// whoever moves the clock forward while the count is non-zero adds the
// elapsed time to the total. So overlapping work on two streams counts
// once (the device was busy, not twice as busy), as a GPU's utilization
// counts "at least one kernel was running".
//
// Metering starts at the first telemetry query of the process
// (EnableMetering): until then a task costs one relaxed load here instead
// of two clock reads and two atomic updates. Work already running when
// metering starts is not counted.
//
// The sample period: a query reports the busy fraction between the most
// recent checkpoint at least kMinSamplePeriod old (or, failing that, the
// oldest one) and now. Queries leave checkpoints at most every
// kMinSamplePeriod / 4, in a small ring, so a monitor that polls often
// still gets a period of at least kMinSamplePeriod, two queries made one
// after the other (utilization, then memory use) report the same period,
// and one that polls rarely gets the time since its previous poll.
#ifndef PHANTOM_FAKE_ACTIVITY_H_
#define PHANTOM_FAKE_ACTIVITY_H_

#include <atomic>
#include <cstdint>

namespace phantom::fake {

constexpr uint64_t kMinSamplePeriodNs = 100'000'000;  // 100 ms

// Nanoseconds on the steady clock.
uint64_t NowNs();

class ActivityMeter {
 public:
  void Begin(uint64_t now_ns) { Change(+1, now_ns); }
  void End(uint64_t now_ns) { Change(-1, now_ns); }
  // Busy nanoseconds since metering started, up to `now_ns`.
  uint64_t BusyNs(uint64_t now_ns);

 private:
  void Change(int delta, uint64_t now_ns);

  std::atomic<uint64_t> state_{0};  // count << 48 | time (mod 2^48)
  std::atomic<uint64_t> busy_ns_{0};
};

// True once the first telemetry query has started the meters.
bool MeteringEnabled();
void EnableMetering();

ActivityMeter& ComputeMeter(int device);
ActivityMeter& MemoryMeter(int device);

// Meters one piece of work for its lifetime, if metering was on when it
// started (so an end is never counted without its start).
class MeteredSpan {
 public:
  explicit MeteredSpan(ActivityMeter* meter)
      : meter_(meter != nullptr && MeteringEnabled() ? meter : nullptr) {
    if (meter_ != nullptr) meter_->Begin(NowNs());
  }
  ~MeteredSpan() {
    if (meter_ != nullptr) meter_->End(NowNs());
  }
  MeteredSpan(const MeteredSpan&) = delete;
  MeteredSpan& operator=(const MeteredSpan&) = delete;

 private:
  ActivityMeter* const meter_;
};

struct ActivitySample {
  uint32_t compute_percent = 0;
  uint32_t memory_percent = 0;
  uint64_t period_ns = 0;
};

// Starts metering if needed and samples `device` (a valid index) over its
// sample period (see above).
ActivitySample SampleActivity(int device);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_ACTIVITY_H_
