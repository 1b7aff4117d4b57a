// Allocator and launch benchmarks, phantom against the CPU, in one process.
//
//   alloc   allocate + free of a fixed pseudo-random mix of sizes (512 B to
//           8 MiB, a few live at a time) through phantom's caching device
//           allocator and through c10's CPU allocator; time per pair.
//           `allocator_bench R --profile-alloc` (or --profile-cpu-alloc)
//           runs one side alone, R times, for a profiler.
//   launch  queueing an empty piece of host work on a stream (raw HAL call
//           and the runtime's launchAsync), ns per launch, then a sync.
//
// Each measurement is repeated, interleaved phantom/CPU, and the median is
// reported with the ratio phantom/CPU. Output is one JSON object on stdout.
#include <phantom/DeviceAllocator.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::vector<size_t> mixedSizes(size_t count) {
  std::mt19937 rng(1234);
  std::vector<size_t> sizes;
  for (size_t i = 0; i < count; ++i) {
    // Mostly small (activations, scalars), some large (weights, batches).
    const int kind = rng() % 10;
    if (kind < 6) {
      sizes.push_back(512 + rng() % (64 << 10));
    } else if (kind < 9) {
      sizes.push_back((64 << 10) + rng() % (1 << 20));
    } else {
      sizes.push_back((1 << 20) + rng() % (7 << 20));
    }
  }
  return sizes;
}

// ns per allocate+free pair, keeping a window of `live` allocations.
double allocFreeNs(c10::Allocator* allocator, const std::vector<size_t>& sizes) {
  constexpr size_t kLive = 8;
  std::vector<c10::DataPtr> window(kLive);
  const auto start = Clock::now();
  for (size_t i = 0; i < sizes.size(); ++i) {
    window[i % kLive] = allocator->allocate(sizes[i]);  // frees the old one
  }
  for (auto& ptr : window) {
    ptr.clear();
  }
  const auto elapsed = std::chrono::duration<double, std::nano>(Clock::now() - start);
  return elapsed.count() / sizes.size();
}

ph_status_t emptyRun(void*, char*, size_t) { return PH_SUCCESS; }

double rawLaunchNs(ph_stream_t stream, int count) {
  const ph_host_task_t task{"empty", &emptyRun, nullptr, nullptr};
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    ph_launch_host_func(stream, &task);
  }
  const auto queued = Clock::now();
  ph_stream_synchronize(stream);
  return std::chrono::duration<double, std::nano>(queued - start).count() / count;
}

double runtimeLaunchNs(const phantom::PhantomStream& stream, int count) {
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    phantom::launchAsync(stream, "empty", [] {});
  }
  const auto queued = Clock::now();
  stream.synchronize();
  return std::chrono::duration<double, std::nano>(queued - start).count() / count;
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 7;
  const c10::DeviceGuard guard(c10::Device("phantom:0"));
  const auto sizes = mixedSizes(20000);
  c10::Allocator* cpu = c10::GetCPUAllocator();
  c10::Allocator* device = &phantom::deviceAllocator();
  if (argc > 2) {
    // One allocator alone, for a profiler (perf record ... --profile-alloc).
    const std::string mode = argv[2];
    c10::Allocator* alone = mode == "--profile-alloc"       ? device
                            : mode == "--profile-cpu-alloc" ? cpu
                                                            : nullptr;
    if (alone == nullptr) {
      std::fprintf(stderr, "unknown option %s\n", argv[2]);
      return 2;
    }
    for (int r = 0; r < repetitions; ++r) {
      allocFreeNs(alone, sizes);
    }
    return 0;
  }

  // Warm up both (first touches, cache fill).
  allocFreeNs(device, sizes);
  allocFreeNs(cpu, sizes);
  std::vector<double> device_ns, cpu_ns;
  for (int r = 0; r < repetitions; ++r) {
    device_ns.push_back(allocFreeNs(device, sizes));
    cpu_ns.push_back(allocFreeNs(cpu, sizes));
  }

  const auto stream = phantom::getStreamFromPool(false, 0);
  constexpr int kLaunches = 20000;
  rawLaunchNs(stream.handle(), kLaunches);
  std::vector<double> raw_ns, runtime_ns;
  for (int r = 0; r < repetitions; ++r) {
    raw_ns.push_back(rawLaunchNs(stream.handle(), kLaunches));
    runtime_ns.push_back(runtimeLaunchNs(stream, kLaunches));
  }

  const double d = median(device_ns), c = median(cpu_ns);
  std::printf(
      "{\"alloc_free_ns\": {\"phantom\": %.1f, \"cpu\": %.1f, \"ratio\": %.3f},"
      " \"launch_ns\": {\"hal\": %.1f, \"runtime\": %.1f},"
      " \"repetitions\": %d, \"alloc_pairs\": %zu, \"launches\": %d}\n",
      d, c, d / c, median(raw_ns), median(runtime_ns), repetitions,
      sizes.size(), kLaunches);
  return 0;
}
