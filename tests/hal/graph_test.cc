// HAL conformance, OPTIONAL "Graph capture and replay" section: captured
// work runs only on replay, in order, on the replaying stream; fork and
// join across streams; every call that is illegal while capturing is
// refused and invalidates the capture. Every test needs kGraph and skips,
// naming it, on a driver that does not capture (ph_stream_begin_capture
// NULL or answering PH_ERROR_UNIMPLEMENTED).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hal_test_support.h"

namespace {

#define GRAPH_OK(expr)                                                  \
  do {                                                                  \
    const ph_status_t s_ = (expr);                                      \
    ASSERT_EQ(s_, PH_SUCCESS) << #expr << ": " << ph_status_name(s_)    \
                              << ": " << ph_last_error_message();       \
  } while (0)

constexpr ph_status_t kUnsupported =
    static_cast<ph_status_t>(PH_ERROR_STREAM_CAPTURE_UNSUPPORTED);
constexpr ph_status_t kInvalidated =
    static_cast<ph_status_t>(PH_ERROR_CAPTURE_INVALIDATED);

// A host task appending `value` to a shared log; counts its releases.
struct Step {
  std::vector<int>* log;
  int value;
  std::atomic<int>* releases;
};

ph_status_t RunStep(void* data, char*, size_t) {
  auto* step = static_cast<Step*>(data);
  step->log->push_back(step->value);
  return PH_SUCCESS;
}

void ReleaseStep(void* data) {
  auto* step = static_cast<Step*>(data);
  if (step->releases != nullptr) (*step->releases)++;
  delete step;
}

ph_status_t LaunchStep(ph_stream_t stream, std::vector<int>* log, int value,
                       std::atomic<int>* releases = nullptr) {
  const ph_host_task_t task{"step", RunStep, ReleaseStep,
                            new Step{log, value, releases}};
  return ph_launch_host_func(stream, &task);
}

// A stream (and its capture) for one test.
class GraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_CAPABILITY(kGraph);
    ASSERT_EQ(ph_stream_create(0, 0, &stream_), PH_SUCCESS);
    ASSERT_EQ(ph_stream_create(0, 0, &other_), PH_SUCCESS);
  }
  void TearDown() override {
    if (stream_ != nullptr) ph_stream_destroy(stream_);
    if (other_ != nullptr) ph_stream_destroy(other_);
  }
  ph_capture_status_t StatusOf(ph_stream_t stream) {
    ph_capture_status_t status = PH_CAPTURE_STATUS_MAX_ENUM;
    uint64_t id = 0;
    EXPECT_EQ(ph_stream_get_capture_info(stream, &status, &id), PH_SUCCESS);
    EXPECT_EQ(status == PH_CAPTURE_STATUS_NONE, id == 0);
    return status;
  }
  // Begins a capture, makes `illegal` (which must be refused with
  // PH_ERROR_STREAM_CAPTURE_UNSUPPORTED), then checks the capture is
  // invalidated: recording is refused and ending gives no graph.
  void ExpectIllegal(const std::function<ph_status_t()>& illegal,
                     ph_capture_mode_t mode = PH_CAPTURE_MODE_GLOBAL) {
    std::vector<int> log;
    std::atomic<int> releases{0};
    GRAPH_OK(ph_stream_begin_capture(stream_, mode));
    GRAPH_OK(LaunchStep(stream_, &log, 1, &releases));
    EXPECT_EQ(illegal(), kUnsupported) << ph_last_error_message();
    EXPECT_NE(std::string(ph_last_error_message()).find("capture"),
              std::string::npos);
    EXPECT_EQ(StatusOf(stream_), PH_CAPTURE_STATUS_INVALIDATED);
    EXPECT_EQ(LaunchStep(stream_, &log, 2, &releases), kInvalidated);
    EXPECT_EQ(releases.load(), 1);  // the refused task was released
    ph_graph_t graph = nullptr;
    EXPECT_EQ(ph_stream_end_capture(stream_, &graph), kInvalidated);
    EXPECT_EQ(graph, nullptr);
    EXPECT_EQ(releases.load(), 2);  // what the capture held, released
    EXPECT_EQ(StatusOf(stream_), PH_CAPTURE_STATUS_NONE);
    // The stream works again.
    GRAPH_OK(LaunchStep(stream_, &log, 3));
    GRAPH_OK(ph_stream_synchronize(stream_));
    EXPECT_EQ(log, std::vector<int>{3});
  }

  ph_stream_t stream_ = nullptr;
  ph_stream_t other_ = nullptr;
};

TEST_F(GraphTest, EmptyCaptureGivesAnEmptyGraphThatReplays) {
  EXPECT_EQ(StatusOf(stream_), PH_CAPTURE_STATUS_NONE);
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(StatusOf(stream_), PH_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL),
            PH_ERROR_INVALID_ARGUMENT);
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  EXPECT_EQ(StatusOf(stream_), PH_CAPTURE_STATUS_NONE);
  size_t nodes = 99;
  GRAPH_OK(ph_graph_get_node_count(graph, &nodes));
  EXPECT_EQ(nodes, 0u);
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  GRAPH_OK(ph_graph_launch(exec, stream_));
  GRAPH_OK(ph_stream_synchronize(stream_));
  GRAPH_OK(ph_graph_exec_destroy(exec));
  GRAPH_OK(ph_graph_destroy(graph));
  EXPECT_EQ(ph_graph_destroy(graph), PH_ERROR_INVALID_HANDLE);
  EXPECT_EQ(ph_stream_end_capture(stream_, &graph), PH_ERROR_INVALID_ARGUMENT);
}

TEST_F(GraphTest, CapturedWorkRunsOnlyOnReplayInOrderManyTimes) {
  std::vector<int> log;
  std::atomic<int> releases{0};
  void* device = nullptr;
  void* pinned = nullptr;
  GRAPH_OK(ph_malloc(0, 64, &device));
  GRAPH_OK(ph_host_malloc(64, &pinned));
  std::memset(pinned, 0, 64);
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  GRAPH_OK(LaunchStep(stream_, &log, 1, &releases));
  GRAPH_OK(ph_memset_async(device, 7, 64, stream_));
  GRAPH_OK(ph_memcpy_async(pinned, device, 64, PH_MEMCPY_DEVICE_TO_HOST,
                           stream_));
  GRAPH_OK(LaunchStep(stream_, &log, 2, &releases));
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  GRAPH_OK(ph_stream_synchronize(stream_));
  EXPECT_TRUE(log.empty()) << "captured work must not run at capture";
  EXPECT_EQ(static_cast<char*>(pinned)[0], 0);
  size_t nodes = 0;
  GRAPH_OK(ph_graph_get_node_count(graph, &nodes));
  EXPECT_EQ(nodes, 4u);
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  for (int i = 0; i < 100; ++i) GRAPH_OK(ph_graph_launch(exec, stream_));
  GRAPH_OK(ph_stream_synchronize(stream_));
  ASSERT_EQ(log.size(), 200u);
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i], i % 2 == 0 ? 1 : 2);
  }
  EXPECT_EQ(static_cast<char*>(pinned)[63], 7);
  EXPECT_EQ(releases.load(), 0);  // held by the graph
  GRAPH_OK(ph_graph_destroy(graph));
  EXPECT_EQ(releases.load(), 0);  // still held by the instantiation
  GRAPH_OK(ph_graph_exec_destroy(exec));
  EXPECT_EQ(releases.load(), 2);  // each released exactly once
  ph_host_free(pinned);
  ph_free(device);
}

TEST_F(GraphTest, ReplayRunsOnAnotherStreamInThatStreamsOrder) {
  std::vector<int> log;
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  GRAPH_OK(LaunchStep(stream_, &log, 5));
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  GRAPH_OK(LaunchStep(other_, &log, 4));
  GRAPH_OK(ph_graph_launch(exec, other_));
  GRAPH_OK(LaunchStep(other_, &log, 6));
  GRAPH_OK(ph_stream_synchronize(other_));
  EXPECT_EQ(log, (std::vector<int>{4, 5, 6}));
  ph_graph_exec_destroy(exec);
  ph_graph_destroy(graph);
}

TEST_F(GraphTest, DestroyWhileAReplayIsQueuedKeepsTheNodesAlive) {
  std::vector<int> log;
  std::atomic<int> releases{0};
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  GRAPH_OK(LaunchStep(stream_, &log, 1, &releases));
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  // Hold the stream busy so the replay stays queued.
  std::atomic<bool> open{false};
  struct Gate {
    std::atomic<bool>* open;
  };
  const ph_host_task_t gate{
      "gate",
      [](void* d, char*, size_t) {
        while (!static_cast<Gate*>(d)->open->load()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return PH_SUCCESS;
      },
      [](void* d) { delete static_cast<Gate*>(d); }, new Gate{&open}};
  GRAPH_OK(ph_launch_host_func(other_, &gate));
  GRAPH_OK(ph_graph_launch(exec, other_));
  GRAPH_OK(ph_graph_exec_destroy(exec));
  GRAPH_OK(ph_graph_destroy(graph));
  EXPECT_EQ(releases.load(), 0);
  open = true;
  GRAPH_OK(ph_stream_synchronize(other_));
  EXPECT_EQ(log, std::vector<int>{1});
  EXPECT_EQ(releases.load(), 1);
}

TEST_F(GraphTest, AFailingNodeMakesTheReplayStreamSticky) {
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  const ph_host_task_t fails{
      "fails",
      [](void*, char* error, size_t size) {
        std::snprintf(error, size, "planned failure");
        return PH_ERROR_DEVICE;
      },
      nullptr, nullptr};
  GRAPH_OK(ph_launch_host_func(stream_, &fails));
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  GRAPH_OK(ph_graph_launch(exec, other_));
  EXPECT_EQ(ph_stream_synchronize(other_), PH_ERROR_DEVICE);
  EXPECT_NE(std::string(ph_last_error_message()).find("planned failure"),
            std::string::npos);
  ph_graph_exec_destroy(exec);
  ph_graph_destroy(graph);
}

TEST_F(GraphTest, ForkAndJoinAcrossTwoStreamsCaptureIntoOneGraph) {
  std::vector<int> log;
  ph_event_t fork = nullptr;
  ph_event_t join = nullptr;
  GRAPH_OK(ph_event_create(PH_EVENT_DISABLE_TIMING, &fork));
  GRAPH_OK(ph_event_create(PH_EVENT_DISABLE_TIMING, &join));
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  GRAPH_OK(LaunchStep(stream_, &log, 1));
  GRAPH_OK(ph_event_record(fork, stream_));
  GRAPH_OK(ph_stream_wait_event(other_, fork));  // other_ joins
  EXPECT_EQ(StatusOf(other_), PH_CAPTURE_STATUS_ACTIVE);
  GRAPH_OK(LaunchStep(other_, &log, 2));
  GRAPH_OK(ph_event_record(join, other_));
  GRAPH_OK(ph_stream_wait_event(stream_, join));  // joined back
  GRAPH_OK(LaunchStep(stream_, &log, 3));
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  EXPECT_EQ(StatusOf(other_), PH_CAPTURE_STATUS_NONE);
  GRAPH_OK(ph_stream_synchronize(other_));
  EXPECT_TRUE(log.empty());
  size_t nodes = 0;
  GRAPH_OK(ph_graph_get_node_count(graph, &nodes));
  EXPECT_EQ(nodes, 3u);
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  GRAPH_OK(ph_graph_launch(exec, stream_));
  GRAPH_OK(ph_graph_launch(exec, stream_));
  GRAPH_OK(ph_stream_synchronize(stream_));
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3, 1, 2, 3}));
  // An event recorded during the capture cannot be queried afterwards.
  EXPECT_EQ(ph_event_query(join), kUnsupported);
  // Recording it again outside a capture makes it ordinary.
  GRAPH_OK(ph_event_record(join, stream_));
  GRAPH_OK(ph_event_synchronize(join));
  // The dump names every node.
  const std::string path =
      "/tmp/phantom_graph_dump_" + std::to_string(getpid()) + ".dot";
  GRAPH_OK(ph_graph_debug_dump(graph, path.c_str()));
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_NE(text.str().find("digraph"), std::string::npos);
  EXPECT_NE(text.str().find("n2"), std::string::npos);
  std::remove(path.c_str());
  ph_graph_exec_destroy(exec);
  ph_graph_destroy(graph);
  ph_event_destroy(fork);
  ph_event_destroy(join);
}

TEST_F(GraphTest, AStreamNotJoinedBackInvalidatesTheCapture) {
  std::vector<int> log;
  ph_event_t fork = nullptr;
  GRAPH_OK(ph_event_create(PH_EVENT_DISABLE_TIMING, &fork));
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  GRAPH_OK(ph_event_record(fork, stream_));
  GRAPH_OK(ph_stream_wait_event(other_, fork));
  GRAPH_OK(LaunchStep(other_, &log, 2));
  ph_graph_t graph = nullptr;
  EXPECT_EQ(ph_stream_end_capture(other_, &graph), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_stream_end_capture(stream_, &graph), kInvalidated);
  EXPECT_NE(std::string(ph_last_error_message()).find("joined back"),
            std::string::npos);
  EXPECT_EQ(StatusOf(other_), PH_CAPTURE_STATUS_NONE);
  GRAPH_OK(ph_stream_synchronize(other_));
  EXPECT_TRUE(log.empty());
  ph_event_destroy(fork);
}

TEST_F(GraphTest, SynchronizingTheCapturingStreamIsIllegal) {
  ExpectIllegal([&] { return ph_stream_synchronize(stream_); });
}

TEST_F(GraphTest, QueryingTheCapturingStreamIsIllegal) {
  ExpectIllegal([&] { return ph_stream_query(stream_); });
}

TEST_F(GraphTest, WaitedHostWorkOnTheCapturingStreamIsIllegal) {
  std::atomic<int> released{0};
  ExpectIllegal([&] {
    const ph_host_task_t task{
        "waited", [](void*, char*, size_t) { return PH_SUCCESS; },
        [](void* d) { (*static_cast<std::atomic<int>*>(d))++; }, &released};
    return ph_run_host_func(stream_, &task);
  });
  EXPECT_EQ(released.load(), 1);
}

TEST_F(GraphTest, ABlockingCopyIsIllegal) {
  void* device = nullptr;
  GRAPH_OK(ph_malloc(0, 64, &device));
  std::vector<char> pageable(64);
  ExpectIllegal([&] {
    return ph_memcpy_async(pageable.data(), device, 64,
                           PH_MEMCPY_DEVICE_TO_HOST, stream_);
  });
  ExpectIllegal([&] {
    return ph_memcpy(pageable.data(), device, 64, PH_MEMCPY_DEVICE_TO_HOST);
  });
  ph_free(device);
}

TEST_F(GraphTest, DeviceSynchronizeAndFreeAreIllegalFromAnyThreadInGlobalMode) {
  ExpectIllegal([&] { return ph_device_synchronize(0); });
  void* device = nullptr;
  GRAPH_OK(ph_malloc(0, 64, &device));
  ExpectIllegal([&] {
    ph_status_t status = PH_SUCCESS;
    std::thread([&] { status = ph_free(device); }).join();
    return status;
  });
  GRAPH_OK(ph_free(device));  // refused above: still live
}

TEST_F(GraphTest, ThreadLocalModeRefusesUnsafeCallsOnlyOnTheCapturingThread) {
  void* device = nullptr;
  GRAPH_OK(ph_malloc(0, 64, &device));
  std::vector<char> host(64);
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_THREAD_LOCAL));
  ph_status_t other_thread = PH_ERROR_DEVICE;
  std::thread([&] {
    other_thread =
        ph_memcpy(host.data(), device, 64, PH_MEMCPY_DEVICE_TO_HOST);
  }).join();
  EXPECT_EQ(other_thread, PH_SUCCESS);
  EXPECT_EQ(StatusOf(stream_), PH_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(ph_memcpy(host.data(), device, 64, PH_MEMCPY_DEVICE_TO_HOST),
            kUnsupported);
  EXPECT_EQ(StatusOf(stream_), PH_CAPTURE_STATUS_INVALIDATED);
  ph_graph_t graph = nullptr;
  EXPECT_EQ(ph_stream_end_capture(stream_, &graph), kInvalidated);
  // Relaxed mode allows unsafe calls on the capturing thread.
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_RELAXED));
  GRAPH_OK(ph_memcpy(host.data(), device, 64, PH_MEMCPY_DEVICE_TO_HOST));
  GRAPH_OK(ph_device_synchronize(0));
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  ph_graph_destroy(graph);
  ph_free(device);
}

TEST_F(GraphTest, QueryingAnEventRecordedInTheCaptureIsIllegal) {
  ph_event_t event = nullptr;
  GRAPH_OK(ph_event_create(PH_EVENT_DISABLE_TIMING, &event));
  ExpectIllegal([&] {
    EXPECT_EQ(ph_event_record(event, stream_), PH_SUCCESS);
    return ph_event_query(event);
  });
  ExpectIllegal([&] {
    EXPECT_EQ(ph_event_record(event, stream_), PH_SUCCESS);
    return ph_event_synchronize(event);
  });
  ph_event_destroy(event);
}

TEST_F(GraphTest, WaitingOnAnotherCapturesEventIsIllegal) {
  ph_event_t event = nullptr;
  GRAPH_OK(ph_event_create(PH_EVENT_DISABLE_TIMING, &event));
  GRAPH_OK(ph_stream_begin_capture(other_, PH_CAPTURE_MODE_RELAXED));
  GRAPH_OK(ph_event_record(event, other_));
  ExpectIllegal([&] { return ph_stream_wait_event(stream_, event); });
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(other_, &graph));
  ph_graph_destroy(graph);
  ph_event_destroy(event);
}

TEST_F(GraphTest, LaunchingAGraphOnACapturingStreamIsIllegal) {
  GRAPH_OK(ph_stream_begin_capture(other_, PH_CAPTURE_MODE_RELAXED));
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(other_, &graph));
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  ExpectIllegal([&] { return ph_graph_launch(exec, stream_); });
  ph_graph_exec_destroy(exec);
  ph_graph_destroy(graph);
}

TEST_F(GraphTest, AWaitOnAnOutsideEventWaitsAtEachReplay) {
  std::vector<int> log;
  ph_event_t event = nullptr;
  GRAPH_OK(ph_event_create(PH_EVENT_DISABLE_TIMING, &event));
  GRAPH_OK(ph_event_record(event, other_));
  GRAPH_OK(ph_stream_begin_capture(stream_, PH_CAPTURE_MODE_GLOBAL));
  GRAPH_OK(ph_stream_wait_event(stream_, event));
  GRAPH_OK(LaunchStep(stream_, &log, 2));
  ph_graph_t graph = nullptr;
  GRAPH_OK(ph_stream_end_capture(stream_, &graph));
  ph_graph_exec_t exec = nullptr;
  GRAPH_OK(ph_graph_instantiate(graph, &exec));
  // other_ appends 1 after a delay, then the event is recorded again: the
  // replay waits for that record, the latest at its launch.
  const ph_host_task_t delay{
      "delay",
      [](void*, char*, size_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return PH_SUCCESS;
      },
      nullptr, nullptr};
  GRAPH_OK(ph_launch_host_func(other_, &delay));
  GRAPH_OK(LaunchStep(other_, &log, 1));
  GRAPH_OK(ph_event_record(event, other_));
  GRAPH_OK(ph_graph_launch(exec, stream_));
  GRAPH_OK(ph_stream_synchronize(stream_));
  EXPECT_EQ(log, (std::vector<int>{1, 2}));
  ph_graph_exec_destroy(exec);
  ph_graph_destroy(graph);
  ph_event_destroy(event);
}

TEST_F(GraphTest, DestroyingACapturingStreamEndsItsCapture) {
  ph_stream_t doomed = nullptr;
  GRAPH_OK(ph_stream_create(0, 0, &doomed));
  GRAPH_OK(ph_stream_begin_capture(doomed, PH_CAPTURE_MODE_GLOBAL));
  EXPECT_EQ(ph_stream_destroy(doomed), kUnsupported);
  EXPECT_EQ(ph_stream_query(doomed), PH_ERROR_INVALID_HANDLE);
  // No capture is left behind to refuse unsafe calls.
  GRAPH_OK(ph_device_synchronize(0));
}

}  // namespace
