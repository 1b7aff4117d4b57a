// Fault injection in the runtime (phantom/FaultInjection.h): the k-th
// allocation fails as a real out-of-memory would and leaves nothing
// allocated; the k-th kernel fails as a device error naming it, queued
// (sticky, reported once) or waited (raised to the caller), and the stream
// goes on; latency runs on the stream, so the host returns first. The
// environment variables are read when the library loads, so they are tested
// from Python in a subprocess (tests/python/test_faults.py); their parser is
// tested here.
#include <phantom/DeviceAllocator.h>
#include <phantom/FaultInjection.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;

const c10::Device kPhantom0(c10::DeviceType::PrivateUse1, 0);

int64_t allocatedBytes(c10::DeviceIndex device) {
  return phantom::deviceAllocator()
      .getDeviceStats(device)
      .allocated_bytes[0]
      .current;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every test starts and ends with all knobs disarmed and counting on.
class Faults : public ::testing::Test {
 protected:
  void SetUp() override { phantom::resetFaults(); }
  void TearDown() override { phantom::resetFaults(); }
};

TEST_F(Faults, CountsAllocationRequestsIncludingCacheHitsButNotEmptyOnes) {
  { at::Tensor warm = at::empty({256}, at::device(kPhantom0)); }
  phantom::resetFaults();
  for (int i = 0; i < 3; ++i) {
    at::Tensor hit = at::empty({256}, at::device(kPhantom0));  // cached block
  }
  at::Tensor empty = at::empty({0}, at::device(kPhantom0));
  EXPECT_EQ(phantom::faultAllocationCount(), 3);
}

TEST_F(Faults, TheKthAllocationIsAnOutOfMemoryErrorAndAllocatesNothing) {
  at::Tensor first = at::empty({100}, at::device(kPhantom0));
  phantom::failAllocation(3);
  at::Tensor a = at::empty({100}, at::device(kPhantom0));
  at::Tensor zero = at::empty({0}, at::device(kPhantom0));  // not counted
  at::Tensor b = at::empty({100}, at::device(kPhantom0));
  EXPECT_EQ(phantom::allocationsUntilFault(), 1);
  const int64_t before = allocatedBytes(0);
  try {
    at::empty({1000}, at::device(kPhantom0));
    FAIL() << "expected the injected out-of-memory";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "out of memory")) << message;
    EXPECT_TRUE(contains(message, "4000 bytes")) << message;
    EXPECT_TRUE(contains(message, "Injected")) << message;
    EXPECT_TRUE(contains(message, "fail_allocation(3)")) << message;
  }
  EXPECT_EQ(allocatedBytes(0), before);
  // One-shot: the next allocation succeeds.
  EXPECT_EQ(phantom::allocationsUntilFault(), 0);
  at::Tensor after = at::empty({1000}, at::device(kPhantom0));
  EXPECT_EQ(allocatedBytes(0), before + 4096);
}

TEST_F(Faults, TheKthQueuedKernelIsAStickyDeviceErrorReportedOnceNamingIt) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  std::atomic<int> ran{0};
  phantom::failKernel(2);
  phantom::launchAsync(stream, "first kernel", [&] { ran |= 1; });
  phantom::launchAsync(stream, "second kernel", [&] { ran |= 2; });
  phantom::launchAsync(stream, "third kernel", [&] { ran |= 4; });
  EXPECT_EQ(phantom::faultKernelCount(), 3);
  try {
    stream.synchronize();
    FAIL() << "expected the injected device error";
  } catch (const c10::AcceleratorError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "'second kernel'")) << message;
    EXPECT_TRUE(contains(message, "injected")) << message;
    EXPECT_TRUE(contains(message, "fail_kernel(2)")) << message;
  }
  // The failed kernel did not run; work behind it was discarded, as on a GPU.
  EXPECT_EQ(ran.load(), 1);
  // Reported once; the stream runs new work, and the knob has disarmed.
  EXPECT_TRUE(stream.query());
  phantom::launchAsync(stream, "after", [&] { ran |= 8; });
  stream.synchronize();
  EXPECT_EQ(ran.load(), 9);
}

TEST_F(Faults, ALaunchAfterAFailedKernelReportsItOnceAndResetsTheStream) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  phantom::failKernel(1);
  phantom::launchAsync(stream, "doomed kernel", [] {});
  // Wait for the failure without reporting it (the driver's own query).
  while (ph_stream_query(stream.handle()) == PH_NOT_READY) {
    std::this_thread::sleep_for(1ms);
  }
  bool ran = false;
  try {
    phantom::launchAsync(stream, "next kernel", [&] { ran = true; });
    FAIL() << "expected the earlier kernel's error at the launch";
  } catch (const c10::AcceleratorError& e) {
    EXPECT_TRUE(contains(e.what(), "'doomed kernel'")) << e.what();
  }
  EXPECT_NO_THROW(stream.synchronize());  // not reported a second time
  phantom::launchAsync(stream, "next kernel", [&] { ran = true; });
  stream.synchronize();
  EXPECT_TRUE(ran);
}

TEST_F(Faults, TheKthWaitedKernelRaisesToTheCallerAndTheStreamGoesOn) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  phantom::failKernel(1);
  bool ran = false;
  try {
    phantom::launchAndWait(stream, "waited kernel", [&] { ran = true; });
    FAIL() << "expected the injected device error";
  } catch (const c10::AcceleratorError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "'waited kernel'")) << message;
    EXPECT_TRUE(contains(message, "injected")) << message;
  }
  EXPECT_FALSE(ran);
  EXPECT_NO_THROW(stream.synchronize());
  phantom::launchAndWait(stream, "waited kernel", [&] { ran = true; });
  EXPECT_TRUE(ran);
}

TEST_F(Faults, DisarmingWithZeroAndNegativeKnobsAreErrors) {
  phantom::failKernel(1);
  phantom::failKernel(0);
  const auto stream = phantom::getStreamFromPool(false, 0);
  bool ran = false;
  phantom::launchAndWait(stream, "kernel", [&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_THROW(phantom::failAllocation(-1), c10::ValueError);
  EXPECT_THROW(phantom::failKernel(-1), c10::ValueError);
  EXPECT_THROW(phantom::setFaultLatencyUs(-1), c10::ValueError);
}

TEST_F(Faults, LatencyRunsOnTheStreamSoTheLaunchReturnsFirst) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  constexpr int64_t kLatencyUs = 300'000;
  phantom::setFaultLatencyUs(kLatencyUs);
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point started;
  const auto launched = std::chrono::steady_clock::now();
  phantom::launchAsync(stream, "delayed kernel", [&] {
    started = std::chrono::steady_clock::now();
    done = true;
  });
  // The host is back while the work still waits out its latency.
  EXPECT_FALSE(done.load());
  EXPECT_FALSE(stream.query());
  stream.synchronize();
  EXPECT_TRUE(done.load());
  // The work began no earlier than the latency after its launch.
  EXPECT_GE(started - launched, std::chrono::microseconds(kLatencyUs));
}

}  // namespace
