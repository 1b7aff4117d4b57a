// See phantom/ops/OpsReport.h. Counting costs one mutex and one hash lookup
// per generic call, small next to the work of the generic path itself.
#include <phantom/ops/OpsReport.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace phantom {
namespace {

struct Counts {
  int64_t async_calls = 0;
  int64_t sync_calls = 0;
  const char* sync_reason = "";
};

std::mutex report_mutex;
std::unordered_map<std::string, Counts>& counts() {
  static auto* table = new std::unordered_map<std::string, Counts>();
  return *table;
}

}  // namespace

void recordOpPath(const std::string& op, OpPath path, const char* reason) {
  std::lock_guard<std::mutex> lock(report_mutex);
  Counts& entry = counts()[op];
  if (path == OpPath::kGenericAsync) {
    entry.async_calls += 1;
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
      result.push_back(
          {op, entry.async_calls, entry.sync_calls, entry.sync_reason});
    }
  }
  std::sort(result.begin(), result.end(), [](const auto& a, const auto& b) {
    return a.async_calls + a.sync_calls > b.async_calls + b.sync_calls;
  });
  return result;
}

void resetOpsReport() {
  std::lock_guard<std::mutex> lock(report_mutex);
  counts().clear();
}

}  // namespace phantom
