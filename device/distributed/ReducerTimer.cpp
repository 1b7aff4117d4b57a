// DDP's timer for phantom devices.
//
// DistributedDataParallel's logger asks a per-device-type Timer for the
// forward, backward-compute and backward-communication times of sampled
// iterations (DDP's runtime stats, get_ddp_logging_data()). Without one it
// warns at every construction that it only times CPU and CUDA. Like CUDA's,
// this one records device events on the current stream, so the times are
// the device's, not the host's; it synchronizes them when asked for a
// difference, which DDP does at the start of a later forward, when the
// iteration they belong to is long done.
#include <phantom/Exception.h>
#include <phantom/Stream.h>

#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <optional>

namespace phantom::distributed {
namespace {

class PhantomTimer final : public c10d::Timer {
 public:
  explicit PhantomTimer(c10::Device device) : device_(device) {}

  ~PhantomTimer() override {
    for (ph_event_t event : events_) {
      if (event != nullptr) {
        (void)ph_event_destroy(event);
      }
    }
  }

  void record(Event event) override {
    c10d::Timer::record(event);  // the host's time, as CUDA's timer keeps it
    ph_event_t& slot = events_[static_cast<size_t>(event)];
    if (slot == nullptr) {
      PHANTOM_CHECK(ph_event_create(PH_EVENT_DEFAULT, &slot));
    }
    const PhantomStream stream = getCurrentPhantomStream(device_.index());
    PHANTOM_CHECK(ph_event_record(slot, stream.handle()));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    ph_event_t first = events_[static_cast<size_t>(start)];
    ph_event_t last = events_[static_cast<size_t>(end)];
    // Not recorded this run (no backward, or no_sync): nothing to measure.
    if (first == nullptr || last == nullptr ||
        ph_event_synchronize(first) != PH_SUCCESS ||
        ph_event_synchronize(last) != PH_SUCCESS) {
      return std::nullopt;
    }
    float milliseconds = 0;
    if (ph_event_elapsed_time(first, last, &milliseconds) != PH_SUCCESS ||
        milliseconds < 0) {
      return std::nullopt;  // `end` belongs to an older iteration
    }
    return static_cast<int64_t>(milliseconds * 1e6);
  }

 private:
  c10::Device device_;
  std::array<ph_event_t, 5> events_{};
};

}  // namespace
}  // namespace phantom::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1,
                         phantom::distributed::PhantomTimer)
}  // namespace c10d
