// HAL conformance: waited host work, ph_run_host_func (OPTIONAL since ABI
// 1001; the runtime falls back to launch-then-wait without it). Every test
// needs kHostFunc and skips, naming it, on a driver without it: it runs
// after earlier work, returns when done, is sticky on failure like
// launched work, and may reach device memory through a kernel view.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hal_test_support.h"

namespace {

using namespace hal_test;

TEST(RunHostFunc, RunsAfterEarlierWorkAndReturnsOnlyWhenDone) {
  REQUIRE_CAPABILITY(kHostFunc);
  ScopedStream stream;
  Gate gate;
  std::atomic<bool> earlier_done{false};
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(Launch(stream, "earlier", [&](char*, size_t) {
    earlier_done = true;
    return PH_SUCCESS;
  }));
  std::thread opener([&] {
    gate.WaitEntered();
    std::this_thread::sleep_for(milliseconds(20));
    gate.Open();
  });
  bool saw_earlier = false;
  bool ran = false;
  TaskProbe probe;
  EXPECT_PH_OK(RunNow(stream, "now", [&](char*, size_t) {
    saw_earlier = earlier_done.load();
    ran = true;
    return PH_SUCCESS;
  }, &probe));
  opener.join();
  EXPECT_TRUE(ran) << "returned before the task ran";
  EXPECT_TRUE(saw_earlier) << "ran before work queued ahead of it";
  EXPECT_EQ(probe.runs.load(), 1);
  EXPECT_EQ(probe.releases.load(), 1);
  EXPECT_PH_OK(ph_stream_query(stream)) << "the stream is idle afterwards";
}

TEST(RunHostFunc, OnAnIdleStreamLaterWorkWaitsBehindIt) {
  REQUIRE_CAPABILITY(kHostFunc);
  ScopedStream stream;
  std::atomic<bool> first_done{false};
  std::atomic<bool> later_saw_first{false};
  std::atomic<int> query_while_running{PH_SUCCESS};
  EXPECT_PH_OK(RunNow(stream, "first", [&](char*, size_t) {
    // Another thread queues work and queries while this task runs.
    std::thread other([&] {
      EXPECT_PH_OK(Launch(stream, "later", [&](char*, size_t) {
        later_saw_first = first_done.load();
        return PH_SUCCESS;
      }));
      query_while_running = ph_stream_query(stream);
    });
    other.join();
    std::this_thread::sleep_for(milliseconds(10));
    first_done = true;
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_TRUE(later_saw_first.load()) << "later work overtook the task";
  EXPECT_EQ(query_while_running.load(), PH_NOT_READY);
}

TEST(RunHostFunc, AFailingTaskIsReturnedAndStickyLikeLaunchedWork) {
  REQUIRE_CAPABILITY(kHostFunc);
  ScopedStream stream;
  TaskProbe probe;
  EXPECT_EQ(RunNow(stream, "my_failing_op", [](char* error, size_t n) {
    std::snprintf(error, n, "bad input");
    return PH_ERROR_DEVICE;
  }, &probe), PH_ERROR_DEVICE);
  const std::string message = ph_last_error_message();
  EXPECT_NE(message.find("my_failing_op"), std::string::npos) << message;
  EXPECT_NE(message.find("bad input"), std::string::npos) << message;
  EXPECT_EQ(probe.releases.load(), 1);
  EXPECT_EQ(ph_stream_query(stream), PH_ERROR_DEVICE);
  TaskProbe refused;
  EXPECT_EQ(RunNow(stream, "refused", nullptr, &refused), PH_ERROR_DEVICE);
  EXPECT_EQ(refused.runs.load(), 0);
  EXPECT_EQ(refused.releases.load(), 1);
}

TEST(RunHostFunc, ATaskSkippedForAnEarlierFailureReportsThatFailure) {
  REQUIRE_CAPABILITY(kHostFunc);
  ScopedStream stream;
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(Launch(stream, "earlier_failure", [](char*, size_t) {
    return PH_ERROR_DEVICE;
  }));
  std::thread opener([&] {
    gate.WaitEntered();
    gate.Open();
  });
  TaskProbe probe;
  EXPECT_EQ(RunNow(stream, "skipped", nullptr, &probe), PH_ERROR_DEVICE);
  opener.join();
  EXPECT_NE(std::string(ph_last_error_message()).find("earlier_failure"),
            std::string::npos);
  EXPECT_EQ(probe.runs.load(), 0);
  EXPECT_EQ(probe.releases.load(), 1);
}

TEST(RunHostFunc, ValidatesTheTaskAndRefusesToWaitForItself) {
  REQUIRE_CAPABILITY(kHostFunc);
  ScopedStream stream;
  EXPECT_EQ(ph_run_host_func(stream, nullptr), PH_ERROR_INVALID_ARGUMENT);
  TaskProbe probe;
  ph_host_task_t no_run = MakeTask("no_run", nullptr, &probe);
  no_run.run = nullptr;
  EXPECT_EQ(ph_run_host_func(stream, &no_run), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(RunNow(nullptr, "no_stream", nullptr, &probe),
            PH_ERROR_INVALID_HANDLE);
  EXPECT_EQ(probe.releases.load(), 2);
  ph_status_t nested = PH_SUCCESS;
  TaskProbe inner;
  ASSERT_PH_OK(Launch(stream, "outer", [&](char*, size_t) {
    nested = RunNow(stream, "inner", nullptr, &inner);
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(nested, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(inner.runs.load(), 0);
  EXPECT_EQ(inner.releases.load(), 1);
  EXPECT_PH_OK(ph_stream_query(stream)) << "the refusal is not sticky";
}

TEST(RunHostFunc, TheTaskMayReachDeviceMemoryAsLaunchedWorkDoes) {
  REQUIRE_CAPABILITY(kHostFunc);
  REQUIRE_CAPABILITY(kKernelView);
  ScopedStream stream;
  DeviceBuffer device(0, 256);
  ASSERT_PH_OK(ph_memset_async(device.get(), 7, 256, stream));
  unsigned char seen = 0;
  EXPECT_PH_OK(RunNow(stream, "read", [&](char* error, size_t n) {
    void* view = nullptr;
    const ph_status_t status = ph_kernel_address(device.get(), &view);
    if (status != PH_SUCCESS) {
      std::snprintf(error, n, "%s", ph_last_error_message());
      return status;
    }
    seen = static_cast<unsigned char*>(view)[255];
    return PH_SUCCESS;
  }));
  EXPECT_EQ(seen, 7);
}

}  // namespace
