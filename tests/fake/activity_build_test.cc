// The fake driver's activity trace follows the CMake option that builds it
// (PHANTOM_FAKE_ACTIVITY_TRACE, device/fake/activity_trace.h). Built ON,
// its table offers the OPTIONAL activity section and recording works.
// Built OFF (the variant that measures what the per-task check costs), the
// table leaves the section's members NULL, as a driver without the
// section does, so the runtime and the conformance suite treat it as
// absent, and a program calling the entry points by name gets
// PH_ERROR_UNIMPLEMENTED with a sentence naming the option.
#include <gtest/gtest.h>

#include <string>

#include "activity_trace.h"
#include "phantom/hal.h"

namespace {

TEST(ActivityTraceBuild, TheTableAndTheEntryPointsFollowTheOption) {
  const ph_driver_table_t* table = ph_driver_get_table(PH_HAL_ABI_VERSION);
  ASSERT_NE(table, nullptr);
  const bool offered = table->activity_enable != nullptr &&
                       table->activity_disable != nullptr &&
                       table->activity_get_timestamp != nullptr &&
                       table->activity_push_correlation != nullptr &&
                       table->activity_pop_correlation != nullptr &&
                       table->activity_flush != nullptr;
  const bool any = table->activity_enable != nullptr ||
                   table->activity_disable != nullptr ||
                   table->activity_get_timestamp != nullptr ||
                   table->activity_push_correlation != nullptr ||
                   table->activity_pop_correlation != nullptr ||
                   table->activity_flush != nullptr;
  int count = 0;
  ASSERT_EQ(ph_device_count(&count), PH_SUCCESS);  // starts the driver
  if (phantom::fake::trace::kBuiltIn) {
    EXPECT_TRUE(offered);
    ASSERT_EQ(ph_activity_enable(), PH_SUCCESS);
    EXPECT_TRUE(phantom::fake::trace::On());
    EXPECT_EQ(ph_activity_disable(), PH_SUCCESS);
    EXPECT_FALSE(phantom::fake::trace::On());
  } else {
    EXPECT_FALSE(any);
    EXPECT_EQ(ph_activity_enable(), PH_ERROR_UNIMPLEMENTED);
    const std::string message = ph_last_error_message();
    EXPECT_NE(message.find("ph_activity_enable"), std::string::npos) << message;
    EXPECT_NE(message.find("PHANTOM_FAKE_ACTIVITY_TRACE"), std::string::npos) << message;
    uint64_t now = 0;
    EXPECT_EQ(ph_activity_get_timestamp(&now), PH_ERROR_UNIMPLEMENTED);
    size_t flushed = 0;
    EXPECT_EQ(ph_activity_flush(nullptr, sizeof(ph_activity_record_t), 0, &flushed, nullptr),
              PH_ERROR_UNIMPLEMENTED);
    EXPECT_FALSE(phantom::fake::trace::On());
  }
}

}  // namespace
