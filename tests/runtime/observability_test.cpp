// What a LibTorch program (no Python) sees of phantom's observability: the
// legacy profiler's stubs for PrivateUse1 (device/runtime/ProfilerStubs.cpp)
// and the allocator's memory history (device/runtime/AllocatorHistory.cpp),
// with C++ stacks, a ring of entries and out-of-memory observers.
#include <phantom/AllocatorHistory.h>
#include <phantom/DeviceAllocator.h>

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <gtest/gtest.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <cstdlib>
#include <vector>

namespace {

using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;

const bool kSettings = [] {
  setenv("PHANTOM_DEVICE_COUNT", "1", /*overwrite=*/1);
  setenv("PHANTOM_DEVICE_MEMORY", "256MiB", /*overwrite=*/1);
  return true;
}();

const c10::Device kPhantom0(c10::DeviceType::PrivateUse1, 0);

std::vector<TraceEntry> entriesAt(size_t addr) {
  std::vector<TraceEntry> found;
  const auto traces = phantom::deviceAllocator().traces();
  for (const auto& entry : traces.at(0)) {
    if (entry.addr_ == addr) {
      found.push_back(entry);
    }
  }
  return found;
}

phantom::HistoryOptions recordAll(size_t max_entries = 1000) {
  phantom::HistoryOptions options;
  options.enabled = options.trace = true;
  options.context = RecordContext::ALL;
  options.cpp_frames = true;
  options.max_entries = max_entries;
  return options;
}

TEST(ProfilerStubs, AreRegisteredAndTimeDeviceWork) {
  const auto* stubs = torch::profiler::impl::privateuse1Stubs();
  ASSERT_TRUE(stubs->enabled());
  const at::Tensor x = at::randn({256, 256}, at::TensorOptions(kPhantom0));
  c10::DeviceIndex device = -1;
  torch::profiler::impl::ProfilerVoidEventStub start, end;
  int64_t cpu_start = 0, cpu_end = 0;
  stubs->record(&device, &start, &cpu_start);
  const at::Tensor y = at::mm(x, x);
  stubs->record(nullptr, &end, &cpu_end);
  EXPECT_EQ(device, 0);
  EXPECT_LE(cpu_start, cpu_end);
  EXPECT_GT(stubs->elapsed(&start, &end), 0.0f);
  int devices = 0;
  stubs->onEachDevice([&](int) { ++devices; });
  EXPECT_EQ(devices, 1);
  stubs->synchronize();
}

TEST(MemoryHistory, RecordsAllocAndFreeWithCppStacks) {
  phantom::deviceAllocator().recordHistory(recordAll());
  at::Tensor x = at::empty({1000}, at::TensorOptions(kPhantom0));
  const auto addr = reinterpret_cast<size_t>(x.data_ptr());
  x.reset();
  const auto entries = entriesAt(addr);
  ASSERT_GE(entries.size(), 3u);
  const auto n = entries.size();
  EXPECT_EQ(entries[n - 3].action_, TraceEntry::ALLOC);
  EXPECT_EQ(entries[n - 2].action_, TraceEntry::FREE_REQUESTED);
  EXPECT_EQ(entries[n - 1].action_, TraceEntry::FREE_COMPLETED);
  EXPECT_EQ(entries[n - 3].size_, 4096u);
  EXPECT_NE(entries[n - 3].context_, nullptr);  // the C++ stack
  phantom::deviceAllocator().recordHistory({});
  EXPECT_TRUE(phantom::deviceAllocator().traces().at(0).empty());
}

TEST(MemoryHistory, OffRecordsNothing) {
  at::Tensor x = at::empty({1000}, at::TensorOptions(kPhantom0));
  x.reset();
  EXPECT_TRUE(phantom::deviceAllocator().traces().at(0).empty());
  for (const auto& segment : phantom::deviceAllocator().snapshot()) {
    EXPECT_EQ(segment.context_when_allocated, nullptr);
  }
}

TEST(MemoryHistory, KeepsTheLastMaxEntries) {
  phantom::deviceAllocator().recordHistory(recordAll(/*max_entries=*/2));
  std::vector<at::Tensor> tensors;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back(at::empty({1000}, at::TensorOptions(kPhantom0)));
  }
  const auto trace = phantom::deviceAllocator().traces().at(0);
  ASSERT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace[0].addr_, reinterpret_cast<size_t>(tensors[2].data_ptr()));
  EXPECT_EQ(trace[1].addr_, reinterpret_cast<size_t>(tensors[3].data_ptr()));
  phantom::deviceAllocator().recordHistory({});
}

TEST(MemoryHistory, OutOfMemoryIsRecordedAndObserved) {
  struct Seen {
    c10::DeviceIndex device = -1;
    size_t requested = 0, allowed = 0, free = 0;
    int calls = 0;
  };
  static Seen seen;
  phantom::attachOutOfMemoryObserver(
      [](c10::DeviceIndex device, size_t requested, size_t allowed, size_t free) {
        seen = {device, requested, allowed, free, seen.calls + 1};
      });
  phantom::deviceAllocator().recordHistory(recordAll());
  const size_t requested = size_t{1} << 30;  // the device has 256 MiB
  EXPECT_THROW(at::empty({static_cast<int64_t>(requested)},
                         at::TensorOptions(kPhantom0).dtype(at::kByte)),
               c10::OutOfMemoryError);
  const auto [free_now, total] =
      phantom::deviceAllocator().getMemoryInfo(0);
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.device, 0);
  EXPECT_EQ(seen.requested, requested);
  EXPECT_EQ(seen.allowed, total);
  EXPECT_EQ(seen.free, free_now);
  const auto trace = phantom::deviceAllocator().traces().at(0);
  ASSERT_FALSE(trace.empty());
  EXPECT_EQ(trace.back().action_, TraceEntry::OOM);
  EXPECT_EQ(trace.back().size_, requested);
  EXPECT_EQ(trace.back().addr_, free_now);  // an OOM entry's addr: free bytes
  phantom::deviceAllocator().recordHistory({});
}

}  // namespace
