// See activity_trace.h.
#include "activity_trace.h"

#include "errors.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace phantom::fake::trace {

std::atomic<int> g_enabled{0};

namespace {

std::mutex g_mutex;  // guards what follows
std::deque<ph_activity_record_t> g_records;
uint64_t g_dropped = 0;

thread_local std::vector<uint64_t> t_correlation;

// The record up to and including correlation_id: what every caller reads.
constexpr size_t kMinRecordSize =
    offsetof(ph_activity_record_t, correlation_id) + sizeof(uint64_t);

}  // namespace

ph_status_t NotBuiltIn(const char* call) {
  return Fail(PH_ERROR_UNIMPLEMENTED,
              std::string(call) +
                  ": this build of the fake driver has no activity trace "
                  "(configured with -DPHANTOM_FAKE_ACTIVITY_TRACE=OFF); "
                  "rebuild with the option ON (its default) to profile "
                  "device activity");
}

uint64_t CurrentCorrelation() {
  return t_correlation.empty() ? 0 : t_correlation.back();
}

void Record(const ph_activity_record_t& record) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_records.size() >= kMaxRecords) {
    ++g_dropped;
    return;
  }
  g_records.push_back(record);
}

ph_status_t Enable() {
  if (!kBuiltIn) return NotBuiltIn("ph_activity_enable");
  g_enabled.fetch_add(1, std::memory_order_relaxed);
  return PH_SUCCESS;
}

ph_status_t Disable() {
  if (!kBuiltIn) return NotBuiltIn("ph_activity_disable");
  int current = g_enabled.load(std::memory_order_relaxed);
  do {
    if (current <= 0) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_activity_disable: tracing is not on (more disables than "
                  "ph_activity_enable calls)");
    }
  } while (!g_enabled.compare_exchange_weak(current, current - 1,
                                            std::memory_order_relaxed));
  return PH_SUCCESS;
}

ph_status_t PushCorrelation(uint64_t id) {
  if (!kBuiltIn) return NotBuiltIn("ph_activity_push_correlation");
  t_correlation.push_back(id);
  return PH_SUCCESS;
}

ph_status_t PopCorrelation() {
  if (!kBuiltIn) return NotBuiltIn("ph_activity_pop_correlation");
  if (t_correlation.empty()) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_activity_pop_correlation: this thread's correlation stack "
                "is empty (more pops than ph_activity_push_correlation calls)");
  }
  t_correlation.pop_back();
  return PH_SUCCESS;
}

ph_status_t Flush(void* records, size_t record_size, size_t capacity,
                  size_t* out_count, uint64_t* out_dropped) {
  if (!kBuiltIn) return NotBuiltIn("ph_activity_flush");
  if (capacity != 0 && (records == nullptr || out_count == nullptr)) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_activity_flush: records and out_count must not be NULL "
                "when capacity is not 0");
  }
  if (capacity != 0 && record_size < kMinRecordSize) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_activity_flush: record_size " + std::to_string(record_size) +
                    " is smaller than the smallest record (" +
                    std::to_string(kMinRecordSize) +
                    " bytes); pass sizeof(ph_activity_record_t)");
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  const size_t count = std::min(capacity, g_records.size());
  auto* out = static_cast<unsigned char*>(records);
  const size_t copied = std::min(record_size, sizeof(ph_activity_record_t));
  for (size_t i = 0; i < count; ++i) {
    unsigned char* element = out + i * record_size;
    std::memset(element, 0, record_size);
    std::memcpy(element, &g_records[i], copied);
  }
  g_records.erase(g_records.begin(), g_records.begin() + count);
  if (out_count != nullptr) *out_count = count;
  if (out_dropped != nullptr) {
    *out_dropped = g_dropped;
    g_dropped = 0;
  }
  return PH_SUCCESS;
}

}  // namespace phantom::fake::trace
