// See phantom/ops/OpsReport.h. Counting costs one mutex and one hash lookup
// per generic call, small next to the work of the generic path itself; a
// native kernel's call costs one relaxed atomic increment.
#include <phantom/ops/OpsReport.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace phantom {
namespace {

struct Counts {
  int64_t async_calls = 0;
  int64_t sync_calls = 0;
  int64_t copied_calls = 0;
  const char* sync_reason = "";
};

std::mutex report_mutex;

std::vector<NativeOpCounter*>& nativeCounters() {  // guarded by report_mutex
  static auto* counters = new std::vector<NativeOpCounter*>();
  return *counters;
}
std::unordered_map<std::string, Counts>& counts() {
  static auto* table = new std::unordered_map<std::string, Counts>();
  return *table;
}

}  // namespace

NativeOpCounter::NativeOpCounter(const char* op) : op_(op) {
  std::lock_guard<std::mutex> lock(report_mutex);
  nativeCounters().push_back(this);
}

void recordOpPath(const std::string& op, OpPath path, const char* reason) {
  std::lock_guard<std::mutex> lock(report_mutex);
  Counts& entry = counts()[op];
  if (path == OpPath::kGenericAsync) {
    entry.async_calls += 1;
  } else if (path == OpPath::kCopyingFallback) {
    entry.copied_calls += 1;
  } else {
    entry.sync_calls += 1;
    entry.sync_reason = reason;
  }
}

std::vector<OpPathCount> opsReport() {
  std::vector<OpPathCount> result;
  {
    std::lock_guard<std::mutex> lock(report_mutex);
    for (const auto& [op, entry] : counts()) {
      result.push_back({op, 0, entry.async_calls, entry.sync_calls,
                        entry.copied_calls, entry.sync_reason});
    }
    for (const NativeOpCounter* counter : nativeCounters()) {
      const int64_t calls = counter->calls();
      if (calls == 0) {
        continue;
      }
      auto it = std::find_if(result.begin(), result.end(), [&](const auto& row) {
        return row.op == counter->op();
      });
      if (it == result.end()) {
        result.push_back({counter->op(), calls, 0, 0, 0, ""});
      } else {
        it->native_calls += calls;
      }
    }
  }
  const auto total = [](const OpPathCount& row) {
    return row.native_calls + row.async_calls + row.sync_calls +
           row.copied_calls;
  };
  std::sort(result.begin(), result.end(), [&](const auto& a, const auto& b) {
    return total(a) > total(b);
  });
  return result;
}

void resetOpsReport() {
  std::lock_guard<std::mutex> lock(report_mutex);
  counts().clear();
  for (NativeOpCounter* counter : nativeCounters()) {
    counter->reset();
  }
}

}  // namespace phantom
