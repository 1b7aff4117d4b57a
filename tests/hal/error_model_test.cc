// HAL conformance: the error model (phantom/hal.h, "Device errors"). A
// failure reaches exactly what depends on it: events recorded after it,
// work waiting on those events, streams and devices along a chain, device
// synchronize; independent and earlier work is unaffected, and every
// report names the original failure once.
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

/* ---- The error model: a failure reaches what depends on it ------------ */

// Queues a task that fails with `status`, naming itself `name` and saying
// `sentence`.
ph_status_t LaunchFailure(ph_stream_t stream, const char* name,
                          const char* sentence,
                          ph_status_t status = PH_ERROR_DEVICE) {
  return Launch(stream, name, [sentence, status](char* error, size_t n) {
    std::snprintf(error, n, "%s", sentence);
    return status;
  });
}

// The message of the last failing call holds the original failure: the
// failed work's name and its own sentence, once each.
#define EXPECT_ORIGINAL_FAILURE(name, sentence)                              \
  do {                                                                       \
    const std::string message_ = ph_last_error_message();                    \
    EXPECT_EQ(Occurrences(message_, name), 1u) << message_;                  \
    EXPECT_EQ(Occurrences(message_, sentence), 1u) << message_;              \
  } while (0)

TEST(ErrorModel, AnEventRecordedAfterAFailureCarriesItUntilRecordedAgain) {
  ph_stream_t failing = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &failing));
  ScopedEvent event;
  ASSERT_PH_OK(LaunchFailure(failing, "op_that_failed", "index 7 is out"));
  ASSERT_PH_OK(ph_event_record(event, failing));
  EXPECT_EQ(ph_event_synchronize(event), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("op_that_failed", "index 7 is out");
  EXPECT_EQ(ph_event_query(event), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("op_that_failed", "index 7 is out");
  // Reporting the stream's error and destroying the stream does not make
  // the work before the record good.
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_DEVICE);
  ASSERT_PH_OK(ph_stream_destroy(failing));
  EXPECT_EQ(ph_event_query(event), PH_ERROR_DEVICE);
  EXPECT_EQ(ph_event_synchronize(event), PH_ERROR_DEVICE);
  ScopedStream waiter;
  ASSERT_PH_OK(ph_stream_wait_event(waiter, event));
  EXPECT_EQ(ph_stream_synchronize(waiter), PH_ERROR_DEVICE);
  // A record on a fresh stream marks a point after good work.
  ScopedStream fresh;
  ASSERT_PH_OK(ph_event_record(event, fresh));
  EXPECT_PH_OK(ph_event_synchronize(event));
  EXPECT_PH_OK(ph_event_query(event));
}

TEST(ErrorModel, ARecordBeforeTheFailureCarriesNothing) {
  ScopedStream failing;
  ScopedEvent before;
  ScopedEvent after;
  Gate gate;
  ASSERT_PH_OK(gate.Block(failing));
  ASSERT_PH_OK(ph_event_record(before, failing));
  ASSERT_PH_OK(LaunchFailure(failing, "late_failure", "went wrong"));
  ASSERT_PH_OK(ph_event_record(after, failing));
  ScopedStream waiter;
  TaskProbe ran;
  ASSERT_PH_OK(ph_stream_wait_event(waiter, before));
  ASSERT_PH_OK(Launch(waiter, "depends_on_good_work", nullptr, &ran));
  gate.Open();
  EXPECT_EQ(ph_event_synchronize(after), PH_ERROR_DEVICE);
  EXPECT_PH_OK(ph_event_synchronize(before)) << "the failure came after it";
  EXPECT_PH_OK(ph_event_query(before));
  EXPECT_PH_OK(ph_stream_synchronize(waiter));
  EXPECT_EQ(ran.runs.load(), 1);
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_DEVICE);
}

// The waiting stream fails at the wait's place in its queue, with the
// original status and message, said to be inherited.
TEST(ErrorModel, AWaitOnAFailedRecordFailsTheWorkAfterItOnly) {
  ScopedStream failing;
  ScopedStream waiter;
  ScopedEvent event;
  ScopedEvent waiter_done;
  Gate gate;
  ASSERT_PH_OK(gate.Block(failing));
  ASSERT_PH_OK(LaunchFailure(failing, "scratch_op", "no scratch memory",
                             PH_ERROR_OUT_OF_MEMORY));
  ASSERT_PH_OK(ph_event_record(event, failing));
  TaskProbe before_wait;
  TaskProbe after_wait;
  ASSERT_PH_OK(Launch(waiter, "before_the_wait", nullptr, &before_wait));
  ASSERT_PH_OK(ph_stream_wait_event(waiter, event));
  ASSERT_PH_OK(Launch(waiter, "after_the_wait", nullptr, &after_wait));
  DeviceBuffer device(0, 256);
  ASSERT_PH_OK(ph_memset_async(device.get(), 9, 256, waiter));
  ASSERT_PH_OK(ph_event_record(waiter_done, waiter));
  gate.Open();
  EXPECT_EQ(ph_stream_synchronize(waiter), PH_ERROR_OUT_OF_MEMORY);
  const std::string message = ph_last_error_message();
  EXPECT_ORIGINAL_FAILURE("scratch_op", "no scratch memory");
  EXPECT_NE(message.find("inherit"), std::string::npos) << message;
  EXPECT_EQ(before_wait.runs.load(), 1);
  EXPECT_EQ(after_wait.runs.load(), 0);
  EXPECT_EQ(after_wait.releases.load(), 1);
  // Sticky like a failure of its own: query, launches, records.
  EXPECT_EQ(ph_stream_query(waiter), PH_ERROR_OUT_OF_MEMORY);
  TaskProbe refused;
  EXPECT_EQ(Launch(waiter, "refused", nullptr, &refused),
            PH_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(refused.releases.load(), 1);
  EXPECT_EQ(ph_event_synchronize(waiter_done), PH_ERROR_OUT_OF_MEMORY);
  EXPECT_ORIGINAL_FAILURE("scratch_op", "no scratch memory");
  char byte = 0;
  ASSERT_PH_OK(ph_memcpy(&byte, device.get(), 1, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_NE(byte, 9) << "the fill after the wait ran";
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_OUT_OF_MEMORY);
}

// A -> B -> C, across two devices when there are two: C's copies after its
// wait copy nothing and report A's failure, told once.
TEST(ErrorModel, AFailureTravelsAlongAChainOfStreamsAndDevices) {
  const int other = DeviceCount() > 1 ? 1 : 0;
  ScopedStream a(0);
  ScopedStream b(other);
  ScopedStream c(0);
  ScopedEvent after_a;
  ScopedEvent after_b;
  Gate gate;
  DeviceBuffer source(other, 4096);
  DeviceBuffer target(0, 4096);
  ASSERT_PH_OK(ph_memset_async(source.get(), 1, 4096, b));
  ASSERT_PH_OK(ph_memset_async(target.get(), 2, 4096, c));
  ASSERT_PH_OK(ph_stream_synchronize(b));
  ASSERT_PH_OK(ph_stream_synchronize(c));
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(LaunchFailure(a, "first_op", "the first op failed"));
  ASSERT_PH_OK(ph_event_record(after_a, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, after_a));
  ASSERT_PH_OK(ph_memset_async(source.get(), 3, 4096, b));
  ASSERT_PH_OK(ph_event_record(after_b, b));
  ASSERT_PH_OK(ph_stream_wait_event(c, after_b));
  // A copy across devices on C, then one to pageable memory, which blocks.
  ASSERT_PH_OK(ph_memcpy_async(target.get(), source.get(), 4096,
                               PH_MEMCPY_DEVICE_TO_DEVICE, c));
  gate.Open();
  std::vector<char> host(4096, 4);
  EXPECT_EQ(ph_memcpy_async(host.data(), target.get(), 4096,
                            PH_MEMCPY_DEVICE_TO_HOST, c),
            PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("first_op", "the first op failed");
  EXPECT_EQ(host[0], 4);
  EXPECT_EQ(ph_stream_synchronize(c), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("first_op", "the first op failed");
  EXPECT_EQ(ph_stream_synchronize(b), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("first_op", "the first op failed");
  char byte = 0;
  ASSERT_PH_OK(ph_memcpy(&byte, target.get(), 1, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(byte, 2) << "the cross-device copy after the wait ran";
  ASSERT_PH_OK(ph_memcpy(&byte, source.get(), 1, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(byte, 1) << "the fill after B's wait ran";
}

TEST(ErrorModel, DeviceSynchronizeReportsAnInheritedFailure) {
  REQUIRE_TWO_DEVICES();
  ph_stream_t failing = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &failing));
  ScopedStream waiter(1);
  ScopedEvent event;
  ASSERT_PH_OK(LaunchFailure(failing, "device0_op", "bad index"));
  ASSERT_PH_OK(ph_event_record(event, failing));
  ASSERT_PH_OK(ph_stream_wait_event(waiter, event));
  EXPECT_EQ(ph_device_synchronize(1), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("device0_op", "bad index");
  // Reported on device 0 too, until that stream is gone.
  EXPECT_EQ(ph_device_synchronize(0), PH_ERROR_DEVICE);
  ASSERT_PH_OK(ph_stream_destroy(failing));
  EXPECT_PH_OK(ph_device_synchronize(0));
}

// Work that depends on nothing that failed succeeds, and a stream created
// after a failure, or one that replaced the failed stream, works.
TEST(ErrorModel, IndependentAndLaterWorkIsUnaffected) {
  ph_stream_t failing = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &failing));
  ScopedStream healthy;
  ScopedStream waiter;
  ScopedEvent good;
  ASSERT_PH_OK(LaunchFailure(failing, "bad_op", "it failed"));
  TaskProbe independent;
  ASSERT_PH_OK(Launch(healthy, "independent", nullptr, &independent));
  ASSERT_PH_OK(ph_event_record(good, healthy));
  ASSERT_PH_OK(ph_stream_wait_event(waiter, good));
  TaskProbe after_good;
  ASSERT_PH_OK(Launch(waiter, "after_good", nullptr, &after_good));
  EXPECT_PH_OK(ph_stream_synchronize(waiter));
  EXPECT_PH_OK(ph_stream_synchronize(healthy));
  EXPECT_PH_OK(ph_event_query(good));
  EXPECT_EQ(independent.runs.load(), 1);
  EXPECT_EQ(after_good.runs.load(), 1);
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_DEVICE);
  ASSERT_PH_OK(ph_stream_destroy(failing));
  ScopedStream replacement;
  TaskProbe later;
  ASSERT_PH_OK(Launch(replacement, "later", nullptr, &later));
  EXPECT_PH_OK(ph_stream_synchronize(replacement));
  EXPECT_EQ(later.runs.load(), 1);
  EXPECT_PH_OK(ph_device_synchronize(0));
}

}  // namespace
