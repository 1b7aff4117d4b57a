// Phantom's device timeline in torch.profiler: an activity profiler that
// PyTorch's Kineto runs next to its CPU profiler when ProfilerActivity.
// PrivateUse1 is asked for, registered with REGISTER_PRIVATEUSE1_PROFILER.
//
// It reaches the device only through the HAL's OPTIONAL activity-trace
// section (phantom/hal_activity.h), the way Kineto's CUDA side uses CUPTI:
//  - start(): read the driver's clock against the host profiler's clock
//    (c10::getTime(), the clock of the CPU events) to translate the
//    driver's times, drop records left from before, and turn tracing on;
//  - while the profile runs, torch pushes the correlation id of every CPU
//    op on the thread that runs it (pushCorrelationId); the session pushes
//    it to the driver, so device work queued by the op carries it;
//  - stop(): wait for every started device (work queued while profiling
//    must finish to be recorded), turn tracing off and drain the records;
//  - processTrace(): each record becomes a Kineto activity: host work as
//    a kernel named by its task (the op), copies as memcpy ("Memcpy HtoD",
//    with bytes), fills as memset; on the row of its device (pid) and
//    stream (tid), linked to the CPU op whose correlation id it carries,
//    which is what gives key_averages() its device time per op;
//  - user ranges on the device rows: torch pushes a user correlation id
//    for each record_function range (and torch.phantom.nvtx range) while
//    it is open; each op's correlation id is mapped to the user ranges
//    open on its thread when it starts, and each range becomes one
//    "gpu_user_annotation" per device stream it queued work on, from its
//    first piece of work's start to its last one's end, named by the range
//    and linked to it, as Kineto's CUDA side draws them from CUPTI.
// A driver without the section: one warning in the profile's errors, and
// the trace has host activity only.
#include <phantom/Device.h>
#include <phantom/hal.h>

#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>
#include <output_base.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace phantom {
namespace {

const std::set<libkineto::ActivityType>& deviceActivityTypes() {
  static const std::set<libkineto::ActivityType> types{
      libkineto::ActivityType::CONCURRENT_KERNEL,
      libkineto::ActivityType::GPU_MEMCPY,
      libkineto::ActivityType::GPU_MEMSET,
      libkineto::ActivityType::GPU_USER_ANNOTATION,
  };
  return types;
}

libkineto::ActivityType activityTypeOf(ph_activity_kind_t kind) {
  switch (kind) {
    case PH_ACTIVITY_MEMCPY:
      return libkineto::ActivityType::GPU_MEMCPY;
    case PH_ACTIVITY_MEMSET:
      return libkineto::ActivityType::GPU_MEMSET;
    default:
      return libkineto::ActivityType::CONCURRENT_KERNEL;
  }
}

const char* copyName(ph_memcpy_kind_t kind) {
  switch (kind) {
    case PH_MEMCPY_HOST_TO_DEVICE:
      return "Memcpy HtoD (Host -> Device)";
    case PH_MEMCPY_DEVICE_TO_HOST:
      return "Memcpy DtoH (Device -> Host)";
    case PH_MEMCPY_DEVICE_TO_DEVICE:
      return "Memcpy DtoD (Device -> Device)";
    default:
      return "Memcpy HtoH (Host -> Host)";
  }
}

// The user ranges (record_function, nvtx) open on this thread, innermost
// last: torch pushes and pops them on the thread that opens and closes them.
thread_local std::vector<uint64_t> t_user_ranges;

class PhantomActivitySession final : public libkineto::IActivityProfilerSession {
 public:
  explicit PhantomActivitySession(std::set<libkineto::ActivityType> wanted)
      : wanted_(std::move(wanted)) {}

  void start() override {
    status_ = libkineto::TraceStatus::RECORDING;
    start_ns_ = c10::getTime();
    if (wanted_.empty() || deviceCountNoThrow() == 0) return;
    const int64_t host_before = c10::getTime();
    uint64_t device_now = 0;
    if (ph_activity_get_timestamp(&device_now) != PH_SUCCESS) {
      unsupported();
      return;
    }
    const int64_t host_after = c10::getTime();
    offset_ns_ = host_before + (host_after - host_before) / 2 -
                 static_cast<int64_t>(device_now);
    drain(/*keep=*/false);
    if (ph_activity_enable() != PH_SUCCESS) {
      unsupported();
      return;
    }
    tracing_ = true;
  }

  void stop() override {
    if (tracing_) {
      // Work queued while profiling is recorded once it has run.
      for (c10::DeviceIndex d = 0; d < deviceCountNoThrow(); ++d) {
        if (ph_device_synchronize(d) != PH_SUCCESS) {
          errors_.push_back(std::string("phantom: waiting for phantom:") +
                            std::to_string(d) + " to finish the profiled "
                            "work failed: " + ph_last_error_message());
        }
      }
      (void)ph_activity_disable();
      tracing_ = false;
      drain(/*keep=*/true);
    }
    end_ns_ = c10::getTime();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked_activity,
                    int64_t /*start*/, int64_t /*end*/) override {
    trace_.span = libkineto::TraceSpan(start_ns_, end_ns_, "phantom");
    // (user range, device, stream) -> the span of its work there.
    std::map<std::tuple<uint64_t, int, uint64_t>, std::pair<int64_t, int64_t>>
        user_spans;
    for (const ph_activity_record_t& record : records_) {
      const libkineto::ActivityType type = activityTypeOf(record.kind);
      if (wanted_.count(type) == 0) continue;
      const libkineto::ITraceActivity* cpu_op =
          record.correlation_id != 0 && linked_activity
              ? linked_activity(static_cast<int32_t>(record.correlation_id))
              : nullptr;
      std::string name;
      if (record.kind == PH_ACTIVITY_MEMCPY) {
        name = copyName(record.copy_kind);
      } else if (record.kind == PH_ACTIVITY_MEMSET) {
        name = "Memset (Device)";
      } else {
        name = record.name != nullptr ? record.name
               : cpu_op != nullptr    ? cpu_op->name()
                                      : "phantom work";
      }
      trace_.emplace_activity(trace_.span, type, name);
      auto& activity = libkineto::CpuTraceBuffer::toRef(trace_.activities.back());
      activity.startTime = static_cast<int64_t>(record.start_ns) + offset_ns_;
      activity.endTime = static_cast<int64_t>(record.end_ns) + offset_ns_;
      activity.device = record.device;
      activity.resource = static_cast<int32_t>(record.stream_id);
      activity.id = static_cast<int32_t>(record.correlation_id);
      activity.linked = cpu_op;
      if (record.correlation_id != 0) {
        activity.flow.id = static_cast<uint32_t>(record.correlation_id);
        activity.flow.type = libkineto::kLinkAsyncCpuGpu;
        activity.flow.start = false;
      }
      activity.addMetadata("device", record.device);
      activity.addMetadata("stream", record.stream_id);
      activity.addMetadata("correlation", record.correlation_id);
      if (record.kind != PH_ACTIVITY_HOST_WORK) {
        activity.addMetadata("bytes", record.bytes);
      }
      logger.handleGenericActivity(activity);
      streams_.insert({record.device, record.stream_id});
      addToUserSpans(record, activity.startTime, activity.endTime, user_spans);
    }
    if (wanted_.count(libkineto::ActivityType::GPU_USER_ANNOTATION) != 0) {
      logUserSpans(logger, linked_activity, user_spans);
    }
    if (dropped_ != 0) {
      errors_.push_back("phantom: the driver's activity buffer was full; " +
                        std::to_string(dropped_) +
                        " device records were dropped (profile a shorter "
                        "stretch)");
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        0, 0, "phantom", "phantom devices"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> infos;
    for (const auto& [device, stream] : streams_) {
      infos.push_back(libkineto::ResourceInfo{
          static_cast<int64_t>(stream), static_cast<int64_t>(stream), device,
          "phantom:" + std::to_string(device) + " stream " +
              std::to_string(stream)});
    }
    return infos;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::make_unique<libkineto::CpuTraceBuffer>(std::move(trace_));
  }

  void pushCorrelationId(uint64_t id) override {
    if (!tracing_) return;
    (void)ph_activity_push_correlation(id);
    if (!t_user_ranges.empty()) {
      std::lock_guard<std::mutex> lock(user_ranges_mutex_);
      user_ranges_of_op_[id] = t_user_ranges;
    }
  }

  void popCorrelationId() override {
    if (tracing_) (void)ph_activity_pop_correlation();
  }

  void pushUserCorrelationId(uint64_t id) override {
    t_user_ranges.push_back(id);
  }

  void popUserCorrelationId() override {
    if (!t_user_ranges.empty()) t_user_ranges.pop_back();
  }

 private:
  using UserSpans =
      std::map<std::tuple<uint64_t, int, uint64_t>, std::pair<int64_t, int64_t>>;

  // Widens the span of every user range open when the record's op began.
  void addToUserSpans(const ph_activity_record_t& record, int64_t start,
                      int64_t end, UserSpans& spans) {
    if (record.correlation_id == 0) return;
    std::lock_guard<std::mutex> lock(user_ranges_mutex_);
    auto ranges = user_ranges_of_op_.find(record.correlation_id);
    if (ranges == user_ranges_of_op_.end()) return;
    for (uint64_t range : ranges->second) {
      auto [it, inserted] = spans.try_emplace(
          {range, record.device, record.stream_id}, start, end);
      if (!inserted) {
        it->second.first = std::min(it->second.first, start);
        it->second.second = std::max(it->second.second, end);
      }
    }
  }

  void logUserSpans(libkineto::ActivityLogger& logger,
                    const libkineto::getLinkedActivityCallback& linked_activity,
                    const UserSpans& spans) {
    for (const auto& [key, span] : spans) {
      const auto& [range, device, stream] = key;
      const libkineto::ITraceActivity* annotation =
          linked_activity ? linked_activity(static_cast<int32_t>(range))
                          : nullptr;
      trace_.emplace_activity(
          trace_.span, libkineto::ActivityType::GPU_USER_ANNOTATION,
          annotation != nullptr ? annotation->name() : "user range");
      auto& activity = libkineto::CpuTraceBuffer::toRef(trace_.activities.back());
      activity.startTime = span.first;
      activity.endTime = span.second;
      activity.device = device;
      activity.resource = static_cast<int32_t>(stream);
      activity.id = static_cast<int32_t>(range);
      activity.linked = annotation;
      activity.addMetadata("device", device);
      activity.addMetadata("stream", stream);
      logger.handleGenericActivity(activity);
    }
  }

  void unsupported() {
    errors_.push_back(
        "phantom: the device driver records no device activity (its "
        "activity-trace section is missing): the profile shows host "
        "activity only");
    status_ = libkineto::TraceStatus::WARNING;
  }

  // Moves the driver's records into records_ (or drops them).
  void drain(bool keep) {
    std::vector<ph_activity_record_t> batch(4096);
    for (;;) {
      size_t count = 0;
      uint64_t dropped = 0;
      if (ph_activity_flush(batch.data(), sizeof(ph_activity_record_t),
                            batch.size(), &count, &dropped) != PH_SUCCESS) {
        return;
      }
      if (keep) {
        dropped_ += dropped;
        records_.insert(records_.end(), batch.begin(), batch.begin() + count);
      }
      if (count < batch.size()) return;
    }
  }

  std::set<libkineto::ActivityType> wanted_;
  bool tracing_ = false;
  int64_t start_ns_ = 0;
  int64_t end_ns_ = 0;
  int64_t offset_ns_ = 0;  // host clock minus driver clock
  uint64_t dropped_ = 0;
  std::vector<ph_activity_record_t> records_;
  std::set<std::pair<int, uint64_t>> streams_;  // (device, stream) seen
  std::vector<std::string> errors_;
  libkineto::CpuTraceBuffer trace_;
  // The user ranges open when each op (by correlation id) began; only ops
  // inside one are listed.
  std::mutex user_ranges_mutex_;
  std::unordered_map<uint64_t, std::vector<uint64_t>> user_ranges_of_op_;
};

class PhantomActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<libkineto::ActivityType>& availableActivities()
      const override {
    return deviceActivityTypes();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& /*config*/) override {
    std::set<libkineto::ActivityType> wanted;
    for (libkineto::ActivityType type : activity_types) {
      if (deviceActivityTypes().count(type) != 0) wanted.insert(type);
    }
    return std::make_unique<PhantomActivitySession>(std::move(wanted));
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/,
      const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"phantom"};
};

REGISTER_PRIVATEUSE1_PROFILER(PhantomActivityProfiler);

}  // namespace
}  // namespace phantom
