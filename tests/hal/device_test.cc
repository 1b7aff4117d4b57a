// HAL conformance: devices (count, the current device, properties,
// device-wide synchronize) and the OPTIONAL telemetry. Device tests that
// need a second device skip on a driver with one; telemetry tests skip,
// naming the missing capability, on a driver without ph_device_get_telemetry.
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

/* ---- Devices ----------------------------------------------------------- */

TEST(Device, CountIsPositiveAndNullOutIsRefused) {
  EXPECT_GE(DeviceCount(), 1);
  EXPECT_EQ(ph_device_count(nullptr), PH_ERROR_INVALID_ARGUMENT);
}

TEST(Device, CurrentDeviceIsThreadLocalAndChecked) {
  REQUIRE_TWO_DEVICES();
  int device = -1;
  int other = -1;
  std::thread([&] { ph_get_device(&other); }).join();
  EXPECT_EQ(other, 0);
  ASSERT_PH_OK(ph_set_device(1));
  ASSERT_PH_OK(ph_get_device(&device));
  EXPECT_EQ(device, 1);
  std::thread([&] { ph_get_device(&other); }).join();
  EXPECT_EQ(other, 0) << "a new thread starts on device 0";

  const int count = DeviceCount();
  EXPECT_EQ(ph_set_device(count), PH_ERROR_INVALID_DEVICE);
  EXPECT_NE(std::string(ph_last_error_message()).find("out of range"),
            std::string::npos);
  EXPECT_EQ(ph_set_device(-1), PH_ERROR_INVALID_DEVICE);
  ASSERT_PH_OK(ph_get_device(&device));
  EXPECT_EQ(device, 1) << "a failed set_device keeps the current device";
  ASSERT_PH_OK(ph_set_device(0));
}

TEST(Device, PropertiesDescribeTheDevice) {
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  ASSERT_PH_OK(ph_device_get_properties(0, &props));
  EXPECT_GT(std::strlen(props.name), 0u);
  EXPECT_LT(std::strlen(props.name), sizeof props.name);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_PH_OK(ph_mem_get_info(0, &free_bytes, &total));
  EXPECT_EQ(props.total_memory, total);
  EXPECT_GE(props.multiprocessor_count, 1);
  EXPECT_LE(props.stream_priority_high, props.stream_priority_low);

  std::memset(&props, 0x5a, sizeof props);
  EXPECT_EQ(ph_device_get_properties(DeviceCount(), &props),
            PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(props.total_memory, 0u) << "out parameters are cleared";
  EXPECT_EQ(ph_device_get_properties(0, nullptr), PH_ERROR_INVALID_ARGUMENT);
}

TEST(Device, SynchronizeWaitsForEveryStreamOfTheDevice) {
  ScopedStream a(0);
  ScopedStream b(0);
  std::atomic<int> finished{0};
  for (ph_stream_t stream : {a.get(), b.get()}) {
    ASSERT_PH_OK(Launch(stream, "sleep", [&](char*, size_t) {
      std::this_thread::sleep_for(milliseconds(30));
      finished++;
      return PH_SUCCESS;
    }));
  }
  ASSERT_PH_OK(ph_device_synchronize(0));
  EXPECT_EQ(finished.load(), 2);
  EXPECT_EQ(ph_device_synchronize(DeviceCount()), PH_ERROR_INVALID_DEVICE);
}

TEST(Device, SynchronizeReportsAStickyError) {
  ScopedStream good(0);
  ScopedStream bad(0);
  ASSERT_PH_OK(Launch(bad, "device_sync_failure", [](char* error, size_t n) {
    std::snprintf(error, n, "boom");
    return PH_ERROR_DEVICE;
  }));
  EXPECT_EQ(ph_device_synchronize(0), PH_ERROR_DEVICE);
  EXPECT_NE(std::string(ph_last_error_message()).find("device_sync_failure"),
            std::string::npos);
}

/* ---- Device telemetry (OPTIONAL) --------------------------------------- */

// Queries `device`'s telemetry with a full-size struct; skips the test if
// the driver does not implement the OPTIONAL call.
#define QUERY_TELEMETRY_OR_SKIP(device, out)                              \
  REQUIRE_CAPABILITY(kTelemetry);                                         \
  (out).struct_size = sizeof(ph_device_telemetry_t);                      \
  ASSERT_PH_OK(ph_device_get_telemetry((device), &(out)))

TEST(Telemetry, ArgumentsAreCheckedAndOutputsCleared) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_EQ(telemetry.struct_size, sizeof telemetry) << "struct_size is input";
  EXPECT_EQ(ph_device_get_telemetry(0, nullptr), PH_ERROR_INVALID_ARGUMENT);

  std::memset(&telemetry, 0x5a, sizeof telemetry);
  telemetry.struct_size = sizeof telemetry;
  EXPECT_EQ(ph_device_get_telemetry(DeviceCount(), &telemetry),
            PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(telemetry.valid, 0u) << "out parameters are cleared";
  EXPECT_EQ(telemetry.sample_period_us, 0u);

  telemetry.struct_size = sizeof(size_t);  // not even room for `valid`
  EXPECT_EQ(ph_device_get_telemetry(0, &telemetry), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ph_last_error_message()).find("struct_size"),
            std::string::npos)
      << ph_last_error_message();
}

// A caller built against a shorter struct (an older header) gives its own
// struct_size: the driver writes nothing past it and claims no field it
// could not write.
TEST(Telemetry, AShorterStructIsFilledOnlyUpToItsSize) {
  ph_device_telemetry_t probe;
  QUERY_TELEMETRY_OR_SKIP(0, probe);
  const size_t short_size = offsetof(ph_device_telemetry_t, temperature_c);
  ph_device_telemetry_t telemetry;
  std::memset(&telemetry, 0x5a, sizeof telemetry);
  telemetry.struct_size = short_size;
  ASSERT_PH_OK(ph_device_get_telemetry(0, &telemetry));
  const auto* bytes = reinterpret_cast<const unsigned char*>(&telemetry);
  for (size_t i = short_size; i < sizeof telemetry; ++i) {
    ASSERT_EQ(bytes[i], 0x5a) << "byte " << i << " lies past struct_size";
  }
  const uint32_t beyond = PH_TELEMETRY_TEMPERATURE | PH_TELEMETRY_POWER |
                          PH_TELEMETRY_CLOCK;
  EXPECT_EQ(telemetry.valid & beyond, 0u);
  EXPECT_LE(telemetry.utilization_percent, 100u);
}

TEST(Telemetry, ValuesAreInRangeAndUnmeasuredFieldsAreZero) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_LE(telemetry.utilization_percent, 100u);
  EXPECT_LE(telemetry.memory_busy_percent, 100u);
  const std::pair<uint32_t, uint64_t> fields[] = {
      {PH_TELEMETRY_UTILIZATION, telemetry.utilization_percent},
      {PH_TELEMETRY_MEMORY_BUSY, telemetry.memory_busy_percent},
      {PH_TELEMETRY_TEMPERATURE, static_cast<uint64_t>(telemetry.temperature_c)},
      {PH_TELEMETRY_POWER, telemetry.power_draw_mw},
      {PH_TELEMETRY_CLOCK, telemetry.clock_mhz}};
  for (const auto& [bit, value] : fields) {
    if ((telemetry.valid & bit) == 0) {
      EXPECT_EQ(value, 0u) << "field of bit " << bit << " is not measured";
    }
  }
}

// Utilization follows the work: a stream kept busy over a whole sample
// period reads high, an idle device low. The margins are wide: a period
// is at least 100 ms on the fake, a real device's sample period may be
// longer (but then it also covers the busy or the idle stretch).
TEST(Telemetry, UtilizationFollowsWorkOnTheDevicesStreams) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);  // starts a period
  if ((telemetry.valid & PH_TELEMETRY_UTILIZATION) == 0) {
    GTEST_SKIP() << "driver does not measure utilization";
  }
  ScopedStream stream(0);
  ASSERT_PH_OK(Launch(stream, "busy", [](char*, size_t) {
    std::this_thread::sleep_for(milliseconds(400));
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_GE(telemetry.utilization_percent, 50u)
      << "over " << telemetry.sample_period_us << " us";
  EXPECT_GT(telemetry.sample_period_us, 0u);

  std::this_thread::sleep_for(milliseconds(400));  // the device idles
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_LE(telemetry.utilization_percent, 50u)
      << "over " << telemetry.sample_period_us << " us";
}

TEST(Telemetry, MemoryBusyFollowsCopies) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  if ((telemetry.valid & PH_TELEMETRY_MEMORY_BUSY) == 0) {
    GTEST_SKIP() << "driver does not measure memory activity";
  }
  // Copies back to back for 400 ms.
  const size_t size = size_t{8} << 20;
  DeviceBuffer a(0, size);
  DeviceBuffer b(0, size);
  const auto until = Clock::now() + milliseconds(400);
  while (Clock::now() < until) {
    ASSERT_PH_OK(ph_memcpy(b.get(), a.get(), size, PH_MEMCPY_DEVICE_TO_DEVICE));
  }
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_GE(telemetry.memory_busy_percent, 50u)
      << "over " << telemetry.sample_period_us << " us";
}

}  // namespace
