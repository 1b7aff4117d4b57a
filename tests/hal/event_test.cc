// HAL conformance: events. Waits order work across streams and observe
// the record current at the time of the call; a never-recorded event
// imposes no wait; elapsed time between reached records; destroy with
// queued waits; query and synchronize report the failure before the
// record; invalid handles and flags are refused.
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

/* ---- Events ------------------------------------------------------------ */

TEST(Event, WaitOrdersWorkAcrossStreams) {
  ScopedStream a(0);
  ScopedStream b(DeviceCount() > 1 ? 1 : 0);  // cross-device when possible
  ScopedEvent event;
  Gate gate;
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(ph_event_record(event, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, event));
  std::atomic<bool> ran{false};
  ASSERT_PH_OK(Launch(b, "after_wait", [&](char*, size_t) {
    ran = true;
    return PH_SUCCESS;
  }));
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(ran.load()) << "B ran before the event on A was reached";
  EXPECT_EQ(ph_stream_query(b), PH_NOT_READY);
  EXPECT_EQ(ph_event_query(event), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_stream_synchronize(b));
  EXPECT_TRUE(ran.load());
  EXPECT_PH_OK(ph_event_query(event));
}

TEST(Event, WaitObservesTheRecordAtTheTimeOfTheCall) {
  ScopedStream a;
  ScopedStream b;
  ScopedEvent event;
  ASSERT_PH_OK(ph_event_record(event, a));
  ASSERT_PH_OK(ph_event_synchronize(event));
  ASSERT_PH_OK(ph_stream_wait_event(b, event));  // refers to the reached record
  Gate gate;
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(ph_event_record(event, a));  // re-record: pending
  std::atomic<bool> ran{false};
  ASSERT_PH_OK(Launch(b, "after_wait", [&](char*, size_t) {
    ran = true;
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(b));  // would hang if the wait re-read
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(ph_event_query(event), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_event_synchronize(event));
}

TEST(Event, NeverRecordedImposesNoWait) {
  ScopedStream stream;
  ScopedEvent event;
  EXPECT_PH_OK(ph_event_query(event));
  EXPECT_PH_OK(ph_event_synchronize(event));
  EXPECT_PH_OK(ph_stream_wait_event(stream, event));
  EXPECT_PH_OK(ph_stream_synchronize(stream));
  float ms = 1.0f;
  EXPECT_EQ(ph_event_elapsed_time(event, event, &ms),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ms, 0.0f);
}

TEST(Event, ElapsedTimeMeasuresBetweenReachedRecords) {
  ScopedStream stream;
  ScopedEvent start;
  ScopedEvent end;
  ASSERT_PH_OK(ph_event_record(start, stream));
  ASSERT_PH_OK(Launch(stream, "sleep", [](char*, size_t) {
    std::this_thread::sleep_for(milliseconds(20));
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_event_record(end, stream));
  ASSERT_PH_OK(ph_event_synchronize(end));
  float ms = 0.0f;
  ASSERT_PH_OK(ph_event_elapsed_time(start, end, &ms));
  EXPECT_GE(ms, 15.0f);
  EXPECT_LT(ms, 5000.0f);

  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(ph_event_record(end, stream));
  EXPECT_EQ(ph_event_elapsed_time(start, end, &ms), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_event_synchronize(end));
  EXPECT_PH_OK(ph_event_elapsed_time(start, end, &ms));

  ScopedEvent untimed(PH_EVENT_DISABLE_TIMING);
  ASSERT_PH_OK(ph_event_record(untimed, stream));
  ASSERT_PH_OK(ph_event_synchronize(untimed));
  EXPECT_EQ(ph_event_elapsed_time(start, untimed, &ms),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_event_elapsed_time(start, end, nullptr),
            PH_ERROR_INVALID_ARGUMENT);
}

TEST(Event, DestroyWithQueuedWaitsIsSafe) {
  ScopedStream a;
  ScopedStream b;
  ph_event_t event = nullptr;
  ASSERT_PH_OK(ph_event_create(0, &event));
  Gate gate;
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(ph_event_record(event, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, event));
  std::atomic<bool> ran{false};
  ASSERT_PH_OK(Launch(b, "after_wait", [&](char*, size_t) {
    ran = true;
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_event_destroy(event));
  std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(ran.load()) << "destroying the event must not release the wait";
  gate.Open();
  ASSERT_PH_OK(ph_stream_synchronize(b));
  EXPECT_TRUE(ran.load());
}

TEST(Event, SynchronizeAndQueryReportTheFailureBeforeTheRecord) {
  ScopedStream stream;
  ScopedEvent event;
  ASSERT_PH_OK(Launch(stream, "fails_before_record", [](char* error, size_t n) {
    std::snprintf(error, n, "bad");
    return PH_ERROR_DEVICE;
  }));
  ASSERT_PH_OK(ph_event_record(event, stream));
  EXPECT_EQ(ph_event_synchronize(event), PH_ERROR_DEVICE);  // and no hang
  EXPECT_NE(std::string(ph_last_error_message()).find("fails_before_record"),
            std::string::npos);
  EXPECT_EQ(ph_event_query(event), PH_ERROR_DEVICE) << "reached, but failed";
  EXPECT_NE(std::string(ph_last_error_message()).find("fails_before_record"),
            std::string::npos);
}

TEST(Event, InvalidHandlesAndFlagsAreRefused) {
  ph_event_t destroyed = nullptr;
  ASSERT_PH_OK(ph_event_create(0, &destroyed));
  ASSERT_PH_OK(ph_event_destroy(destroyed));
  ScopedStream stream;
  ScopedEvent good;
  const ph_event_t bad_events[] = {
      nullptr, destroyed, reinterpret_cast<ph_event_t>(stream.get()),
      reinterpret_cast<ph_event_t>(uintptr_t{0x12345})};
  for (ph_event_t bad : bad_events) {
    float ms = 1.0f;
    EXPECT_EQ(ph_event_destroy(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_record(bad, stream), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_query(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_synchronize(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_wait_event(stream, bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_elapsed_time(bad, good, &ms), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_elapsed_time(good, bad, &ms), PH_ERROR_INVALID_HANDLE);
  }
  ph_event_t event = reinterpret_cast<ph_event_t>(1);
  EXPECT_EQ(ph_event_create(0x80, &event), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(event, nullptr);
  EXPECT_EQ(ph_event_create(0, nullptr), PH_ERROR_INVALID_ARGUMENT);
}

}  // namespace
