// HAL conformance: streams and the host work launched on them
// (ph_launch_host_func): priorities, in-order execution, query, destroy
// with queued work, sticky errors naming the failed work, task validation
// and release, concurrent launchers, invalid handles. Waited host work
// (ph_run_host_func) is in host_work_test.cc.
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

/* ---- Streams ----------------------------------------------------------- */

TEST(Stream, PriorityIsClampedAndDeviceReported) {
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  ASSERT_PH_OK(ph_device_get_properties(0, &props));
  ph_stream_t high = nullptr;
  ph_stream_t low = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, props.stream_priority_high - 100, &high));
  ASSERT_PH_OK(ph_stream_create(0, props.stream_priority_low + 100, &low));
  int priority = 99;
  ASSERT_PH_OK(ph_stream_get_priority(high, &priority));
  EXPECT_EQ(priority, props.stream_priority_high);
  ASSERT_PH_OK(ph_stream_get_priority(low, &priority));
  EXPECT_EQ(priority, props.stream_priority_low);
  int device = -1;
  ASSERT_PH_OK(ph_stream_get_device(high, &device));
  EXPECT_EQ(device, 0);
  EXPECT_PH_OK(ph_stream_destroy(high));
  EXPECT_PH_OK(ph_stream_destroy(low));

  ph_stream_t bad = reinterpret_cast<ph_stream_t>(1);
  EXPECT_EQ(ph_stream_create(DeviceCount(), 0, &bad), PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(ph_stream_create(0, 0, nullptr), PH_ERROR_INVALID_ARGUMENT);
}

TEST(Stream, ManyStreamsRunTheirWorkInOrder) {
  constexpr int kStreams = 16;
  constexpr int kTasks = 200;
  std::vector<ph_stream_t> streams(kStreams);
  std::vector<std::vector<int>> seen(kStreams);
  TaskProbe probe;
  for (auto& stream : streams) ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  for (int task = 0; task < kTasks; ++task) {
    for (int s = 0; s < kStreams; ++s) {
      ASSERT_PH_OK(Launch(streams[s], "append", [&seen, s, task](char*, size_t) {
        seen[s].push_back(task);
        return PH_SUCCESS;
      }, &probe));
    }
  }
  for (auto stream : streams) ASSERT_PH_OK(ph_stream_synchronize(stream));
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(seen[s].size(), static_cast<size_t>(kTasks));
    for (int task = 0; task < kTasks; ++task) ASSERT_EQ(seen[s][task], task);
  }
  EXPECT_EQ(probe.runs.load(), kStreams * kTasks);
  EXPECT_EQ(probe.releases.load(), kStreams * kTasks);
  for (auto stream : streams) EXPECT_PH_OK(ph_stream_destroy(stream));
}

TEST(Stream, QueryIsNotReadyUntilTheLastTaskFinishedRunning) {
  ScopedStream stream;
  EXPECT_PH_OK(ph_stream_query(stream));  // empty stream is ready
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  gate.WaitEntered();  // dequeued and running, but not finished
  std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(ph_stream_query(stream), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_PH_OK(ph_stream_query(stream));
}

TEST(Stream, DestroyRunsQueuedWorkAndReleasesEachTaskOnce) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  Gate gate;
  TaskProbe probe;
  ASSERT_PH_OK(gate.Block(stream));
  for (int i = 0; i < 10; ++i) {
    ASSERT_PH_OK(Launch(stream, "queued", nullptr, &probe));
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(milliseconds(20));
    gate.Open();
  });
  EXPECT_PH_OK(ph_stream_destroy(stream));  // waits for the gate
  opener.join();
  EXPECT_EQ(probe.runs.load(), 10);
  EXPECT_EQ(probe.releases.load(), 10);
  EXPECT_EQ(ph_stream_query(stream), PH_ERROR_INVALID_HANDLE);
}

TEST(Stream, ErrorIsStickyNamesTheWorkAndSkipsLaterTasks) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  Gate gate;
  TaskProbe later;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(Launch(stream, "my_failing_op", [](char* error, size_t n) {
    std::snprintf(error, n, "the kernel divided by zero");
    return PH_ERROR_DEVICE;
  }));
  ASSERT_PH_OK(Launch(stream, "after", nullptr, &later));  // queued earlier
  gate.Open();
  EXPECT_EQ(ph_stream_synchronize(stream), PH_ERROR_DEVICE);
  const std::string message = ph_last_error_message();
  EXPECT_NE(message.find("my_failing_op"), std::string::npos) << message;
  EXPECT_NE(message.find("the kernel divided by zero"), std::string::npos);
  EXPECT_EQ(later.runs.load(), 0);
  EXPECT_EQ(later.releases.load(), 1);

  EXPECT_EQ(ph_stream_query(stream), PH_ERROR_DEVICE);
  EXPECT_NE(std::string(ph_last_error_message()).find("my_failing_op"),
            std::string::npos);
  TaskProbe refused;
  EXPECT_EQ(Launch(stream, "refused", nullptr, &refused), PH_ERROR_DEVICE);
  EXPECT_EQ(refused.runs.load(), 0);
  EXPECT_EQ(refused.releases.load(), 1);
  DeviceBuffer device(0, 64);
  EXPECT_EQ(ph_memset_async(device.get(), 0, 64, stream), PH_ERROR_DEVICE);
  EXPECT_EQ(ph_stream_synchronize(stream), PH_ERROR_DEVICE);
  EXPECT_PH_OK(ph_stream_destroy(stream));  // the sticky error is discarded
}

TEST(Stream, StickyErrorKeepsTheTasksStatus) {
  ScopedStream stream;
  ASSERT_PH_OK(Launch(stream, "oom_in_work", [](char* error, size_t n) {
    std::snprintf(error, n, "scratch allocation failed");
    return PH_ERROR_OUT_OF_MEMORY;
  }));
  EXPECT_EQ(ph_stream_synchronize(stream), PH_ERROR_OUT_OF_MEMORY);
}

TEST(Stream, LaunchValidatesTheTaskAndReleasesOnError) {
  ScopedStream stream;
  EXPECT_EQ(ph_launch_host_func(stream, nullptr), PH_ERROR_INVALID_ARGUMENT);
  TaskProbe probe;
  ph_host_task_t no_run = MakeTask("no_run", nullptr, &probe);
  no_run.run = nullptr;
  EXPECT_EQ(ph_launch_host_func(stream, &no_run), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(probe.releases.load(), 1);
  EXPECT_EQ(Launch(nullptr, "no_stream", nullptr, &probe),
            PH_ERROR_INVALID_HANDLE);
  EXPECT_EQ(probe.releases.load(), 2);
  EXPECT_EQ(probe.runs.load(), 0);
  // A task without release is fine.
  static std::atomic<int> bare_runs{0};
  bare_runs = 0;
  ph_host_task_t bare = {"bare",
                         [](void*, char*, size_t) {
                           bare_runs++;
                           return PH_SUCCESS;
                         },
                         nullptr, nullptr};
  ASSERT_PH_OK(ph_launch_host_func(stream, &bare));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(bare_runs.load(), 1);
}

// Several host threads launching onto one stream: every task runs once,
// and each thread's tasks run in the order it launched them. The worker is
// held at first, so the queue grows past what a driver keeps in its fast
// path (the fake's ring: 1,024 tasks).
TEST(Stream, ConcurrentLaunchersKeepTheirOrderAndLoseNoTask) {
  constexpr int kThreads = 4;
  constexpr int kTasksEach = 1500;
  ScopedStream stream;
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  TaskProbe probe;
  std::vector<std::pair<int, int>> ran;  // appended by the stream's work
  ran.reserve(kThreads * kTasksEach);
  std::vector<std::thread> launchers;
  for (int t = 0; t < kThreads; ++t) {
    launchers.emplace_back([&, t] {
      for (int i = 0; i < kTasksEach; ++i) {
        EXPECT_PH_OK(Launch(stream, "append", [&ran, t, i](char*, size_t) {
          ran.emplace_back(t, i);
          return PH_SUCCESS;
        }, &probe));
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(20));
  gate.Open();
  for (auto& launcher : launchers) launcher.join();
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_EQ(ran.size(), static_cast<size_t>(kThreads * kTasksEach));
  std::vector<int> next(kThreads, 0);
  for (const auto& [thread, index] : ran) {
    ASSERT_EQ(index, next[thread]) << "thread " << thread << "'s tasks reordered";
    ++next[thread];
  }
  EXPECT_EQ(probe.runs.load(), kThreads * kTasksEach);
  EXPECT_EQ(probe.releases.load(), kThreads * kTasksEach);
}

// Destroying a stream while another thread launches onto it: a launch
// either succeeds (and its task runs) or is refused (and its task is
// released); none is lost or run twice.
TEST(Stream, DestroyWhileAnotherThreadLaunchesLosesNoTask) {
  for (int round = 0; round < 20; ++round) {
    ph_stream_t stream = nullptr;
    ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
    TaskProbe probe;
    std::atomic<int> accepted{0};
    std::atomic<int> attempts{0};
    std::atomic<bool> started{false};
    std::thread launcher([&] {
      for (;;) {
        attempts++;
        const ph_status_t status = Launch(stream, "late", nullptr, &probe);
        started = true;
        if (status != PH_SUCCESS) {
          EXPECT_EQ(status, PH_ERROR_INVALID_HANDLE) << ph_last_error_message();
          return;
        }
        accepted++;
      }
    });
    while (!started) std::this_thread::yield();
    EXPECT_PH_OK(ph_stream_destroy(stream));
    launcher.join();
    EXPECT_EQ(probe.runs.load(), accepted.load());
    EXPECT_EQ(probe.releases.load(), attempts.load());
  }
}

TEST(Stream, WaitingForItselfIsRefused) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  ph_status_t sync = PH_SUCCESS;
  ph_status_t destroy = PH_SUCCESS;
  ph_status_t device_sync = PH_SUCCESS;
  ASSERT_PH_OK(Launch(stream, "self_sync", [&](char*, size_t) {
    sync = ph_stream_synchronize(stream);
    destroy = ph_stream_destroy(stream);
    device_sync = ph_device_synchronize(0);
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(sync, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(destroy, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(device_sync, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_PH_OK(ph_stream_query(stream)) << "the refusals are not sticky";
  EXPECT_PH_OK(ph_stream_destroy(stream));
}

TEST(Stream, InvalidHandlesAreRefused) {
  ph_stream_t destroyed = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &destroyed));
  ASSERT_PH_OK(ph_stream_destroy(destroyed));
  ph_event_t event = nullptr;
  ASSERT_PH_OK(ph_event_create(0, &event));
  const ph_stream_t bad_streams[] = {
      nullptr, destroyed, reinterpret_cast<ph_stream_t>(event),
      reinterpret_cast<ph_stream_t>(uintptr_t{0xdeadbeef})};
  for (ph_stream_t bad : bad_streams) {
    int out = 5;
    EXPECT_EQ(ph_stream_destroy(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_query(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_synchronize(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_get_device(bad, &out), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_get_priority(bad, &out), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(out, 0);
    EXPECT_EQ(ph_stream_wait_event(bad, event), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_record(event, bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_memset_async(nullptr, 0, 0, bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(Launch(bad, "x", nullptr), PH_ERROR_INVALID_HANDLE);
  }
  ASSERT_PH_OK(ph_event_destroy(event));
}

}  // namespace
