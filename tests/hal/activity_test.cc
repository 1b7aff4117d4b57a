// HAL conformance: the OPTIONAL activity trace (phantom/hal_activity.h).
// With tracing on, a stream-ordered copy and host work each leave one
// record saying on which device and stream they ran, what they were, when
// (on the driver's clock, in stream order) and under which correlation id
// the queuing thread had pushed; with tracing off again nothing more is
// recorded; a graph replay records each node on the replaying stream;
// enable nests; bad arguments are refused. Every test needs
// kActivityTrace and skips, naming it, on a driver without it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "hal_test_support.h"

namespace {

using namespace hal_test;

// Every record the driver holds, oldest first.
std::vector<ph_activity_record_t> Flush() {
  std::vector<ph_activity_record_t> all;
  for (;;) {
    ph_activity_record_t chunk[16];
    size_t count = 0;
    uint64_t dropped = 0;
    EXPECT_PH_OK(ph_activity_flush(chunk, sizeof chunk[0], 16, &count,
                                   &dropped));
    EXPECT_EQ(dropped, 0u);
    all.insert(all.end(), chunk, chunk + count);
    if (count < 16) return all;
  }
}

// The records of one kind that carry `correlation`.
std::vector<ph_activity_record_t> Matching(
    const std::vector<ph_activity_record_t>& records, ph_activity_kind_t kind,
    uint64_t correlation) {
  std::vector<ph_activity_record_t> found;
  for (const ph_activity_record_t& record : records) {
    if (record.kind == kind && record.correlation_id == correlation) {
      found.push_back(record);
    }
  }
  return found;
}

// Starts every test with tracing off and no records left over.
class Activity : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_CAPABILITY(kActivityTrace);
    int count = 0;
    ASSERT_PH_OK(ph_device_count(&count));  // the device is started
    Flush();
  }
};

TEST_F(Activity, ACopyAndHostWorkAreRecordedInStreamOrder) {
  ScopedStream stream;
  DeviceBuffer device(0, 4096);
  PinnedBuffer pinned(4096);
  std::memset(pinned.bytes(), 3, 4096);
  uint64_t before = 0;
  ASSERT_PH_OK(ph_activity_get_timestamp(&before));
  ASSERT_PH_OK(ph_activity_enable());
  ASSERT_PH_OK(ph_activity_push_correlation(41));
  ASSERT_PH_OK(ph_memcpy_async(device.get(), pinned.bytes(), 4096,
                               PH_MEMCPY_HOST_TO_DEVICE, stream));
  ASSERT_PH_OK(ph_activity_pop_correlation());
  ASSERT_PH_OK(ph_activity_push_correlation(42));
  ASSERT_PH_OK(Launch(stream, "activity-task", nullptr));
  ASSERT_PH_OK(ph_activity_pop_correlation());
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  uint64_t after = 0;
  ASSERT_PH_OK(ph_activity_get_timestamp(&after));
  ASSERT_PH_OK(ph_activity_disable());

  const std::vector<ph_activity_record_t> records = Flush();
  const auto copies = Matching(records, PH_ACTIVITY_MEMCPY, 41);
  const auto tasks = Matching(records, PH_ACTIVITY_HOST_WORK, 42);
  ASSERT_EQ(copies.size(), 1u) << records.size() << " records";
  ASSERT_EQ(tasks.size(), 1u) << records.size() << " records";
  const ph_activity_record_t& copy = copies[0];
  const ph_activity_record_t& task = tasks[0];
  EXPECT_EQ(copy.device, 0);
  EXPECT_EQ(task.device, 0);
  EXPECT_NE(copy.stream_id, 0u);
  EXPECT_EQ(copy.stream_id, task.stream_id) << "one stream ran both";
  EXPECT_EQ(copy.bytes, 4096u);
  EXPECT_EQ(copy.copy_kind, PH_MEMCPY_HOST_TO_DEVICE);
  EXPECT_EQ(copy.name, nullptr);
  ASSERT_NE(task.name, nullptr);
  EXPECT_EQ(std::string(task.name), "activity-task");
  EXPECT_EQ(task.bytes, 0u);
  // Times on the driver's clock, each interval inside the test's, the
  // task after the copy it was queued behind.
  EXPECT_LE(before, copy.start_ns);
  EXPECT_LE(copy.start_ns, copy.end_ns);
  EXPECT_LE(copy.end_ns, task.start_ns);
  EXPECT_LE(task.start_ns, task.end_ns);
  EXPECT_LE(task.end_ns, after);
}

TEST_F(Activity, WorkOnAnotherStreamOrDeviceSaysWhichRanIt) {
  REQUIRE_TWO_DEVICES();
  ScopedStream first(0);
  ScopedStream second(1);
  DeviceBuffer on_second(1, 256);
  ASSERT_PH_OK(ph_activity_enable());
  ASSERT_PH_OK(ph_activity_push_correlation(7));
  ASSERT_PH_OK(Launch(first, "on-first", nullptr));
  ASSERT_PH_OK(ph_memset_async(on_second.get(), 1, 256, second));
  ASSERT_PH_OK(ph_activity_pop_correlation());
  ASSERT_PH_OK(ph_device_synchronize(0));
  ASSERT_PH_OK(ph_device_synchronize(1));
  ASSERT_PH_OK(ph_activity_disable());
  const std::vector<ph_activity_record_t> records = Flush();
  const auto tasks = Matching(records, PH_ACTIVITY_HOST_WORK, 7);
  const auto fills = Matching(records, PH_ACTIVITY_MEMSET, 7);
  ASSERT_EQ(tasks.size(), 1u);
  ASSERT_EQ(fills.size(), 1u);
  EXPECT_EQ(tasks[0].device, 0);
  EXPECT_EQ(fills[0].device, 1);
  EXPECT_EQ(fills[0].bytes, 256u);
  EXPECT_NE(tasks[0].stream_id, fills[0].stream_id);
}

TEST_F(Activity, NothingIsRecordedOnceTracingIsOffAndEnableNests) {
  ScopedStream stream;
  ASSERT_PH_OK(ph_activity_enable());
  ASSERT_PH_OK(ph_activity_enable());
  ASSERT_PH_OK(ph_activity_disable());  // still on: enabled twice
  ASSERT_PH_OK(Launch(stream, "while-on", nullptr));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_PH_OK(ph_activity_disable());
  ASSERT_PH_OK(Launch(stream, "while-off", nullptr));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  int on = 0;
  int off = 0;
  for (const ph_activity_record_t& record : Flush()) {
    if (record.name == nullptr) continue;
    on += std::string(record.name) == "while-on";
    off += std::string(record.name) == "while-off";
  }
  EXPECT_EQ(on, 1);
  EXPECT_EQ(off, 0) << "recorded after the last ph_activity_disable";
  EXPECT_TRUE(Flush().empty()) << "a flush moves the records out";
}

TEST_F(Activity, AGraphReplayRecordsEachNodeOnTheReplayingStream) {
  REQUIRE_CAPABILITY(kGraph);
  ScopedStream capturing;
  ScopedStream replaying;
  DeviceBuffer device(0, 512);
  ASSERT_PH_OK(ph_stream_begin_capture(capturing, PH_CAPTURE_MODE_GLOBAL));
  ASSERT_PH_OK(Launch(capturing, "node-one", nullptr));
  ASSERT_PH_OK(ph_memset_async(device.get(), 5, 512, capturing));
  ASSERT_PH_OK(Launch(capturing, "node-two", nullptr));
  ph_graph_t graph = nullptr;
  ASSERT_PH_OK(ph_stream_end_capture(capturing, &graph));
  ph_graph_exec_t exec = nullptr;
  ASSERT_PH_OK(ph_graph_instantiate(graph, &exec));

  ASSERT_PH_OK(ph_activity_enable());
  ASSERT_PH_OK(ph_activity_push_correlation(76));
  ASSERT_PH_OK(Launch(replaying, "plain", nullptr));  // names its stream
  ASSERT_PH_OK(ph_activity_pop_correlation());
  ASSERT_PH_OK(ph_activity_push_correlation(77));
  ASSERT_PH_OK(ph_graph_launch(exec, replaying));
  ASSERT_PH_OK(ph_activity_pop_correlation());
  ASSERT_PH_OK(ph_stream_synchronize(replaying));
  ASSERT_PH_OK(ph_activity_disable());
  const std::vector<ph_activity_record_t> records = Flush();
  ASSERT_PH_OK(ph_graph_exec_destroy(exec));
  ASSERT_PH_OK(ph_graph_destroy(graph));

  std::vector<ph_activity_record_t> nodes;
  for (const ph_activity_record_t& record : Matching(
           records, PH_ACTIVITY_HOST_WORK, 77)) {
    if (record.name != nullptr &&
        std::string(record.name).rfind("node-", 0) == 0) {
      nodes.push_back(record);
    }
  }
  const auto fills = Matching(records, PH_ACTIVITY_MEMSET, 77);
  const auto plain = Matching(records, PH_ACTIVITY_HOST_WORK, 76);
  ASSERT_EQ(plain.size(), 1u) << records.size() << " records";
  ASSERT_EQ(nodes.size(), 2u) << records.size() << " records";
  ASSERT_EQ(fills.size(), 1u) << records.size() << " records";
  EXPECT_EQ(std::string(nodes[0].name), "node-one");
  EXPECT_EQ(std::string(nodes[1].name), "node-two");
  EXPECT_EQ(fills[0].bytes, 512u);
  for (const ph_activity_record_t& record : {nodes[0], fills[0], nodes[1]}) {
    EXPECT_EQ(record.device, 0);
    EXPECT_EQ(record.stream_id, plain[0].stream_id) << "the replaying stream";
  }
  // In node order, after the work queued before the replay.
  EXPECT_LE(plain[0].end_ns, nodes[0].start_ns);
  EXPECT_LE(nodes[0].end_ns, fills[0].start_ns);
  EXPECT_LE(fills[0].end_ns, nodes[1].start_ns);
}

TEST_F(Activity, BadArgumentsAreRefused) {
  EXPECT_EQ(ph_activity_disable(), PH_ERROR_INVALID_ARGUMENT)
      << "tracing is not on";
  EXPECT_EQ(ph_activity_pop_correlation(), PH_ERROR_INVALID_ARGUMENT)
      << "the correlation stack is empty";
  EXPECT_EQ(ph_activity_get_timestamp(nullptr), PH_ERROR_INVALID_ARGUMENT);
  size_t count = 0;
  EXPECT_EQ(ph_activity_flush(nullptr, sizeof(ph_activity_record_t), 4,
                              &count, nullptr),
            PH_ERROR_INVALID_ARGUMENT);
  ph_activity_record_t record;
  EXPECT_EQ(ph_activity_flush(&record, sizeof record, 1, nullptr, nullptr),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_activity_flush(&record, 8, 1, &count, nullptr),
            PH_ERROR_INVALID_ARGUMENT)
      << "a record too short to hold correlation_id";
}

}  // namespace
