// HAL conformance: status codes, their names, the ABI version and the
// per-thread last error message (phantom/hal.h, "Status and errors").
// Every driver must pass these; nothing here is OPTIONAL.
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

/* ---- Status and errors ------------------------------------------------- */

TEST(Status, EveryCodeHasItsName) {
  EXPECT_STREQ(ph_status_name(PH_SUCCESS), "PH_SUCCESS");
  EXPECT_STREQ(ph_status_name(PH_NOT_READY), "PH_NOT_READY");
  EXPECT_STREQ(ph_status_name(PH_ERROR_INVALID_ARGUMENT),
               "PH_ERROR_INVALID_ARGUMENT");
  EXPECT_STREQ(ph_status_name(PH_ERROR_INVALID_DEVICE),
               "PH_ERROR_INVALID_DEVICE");
  EXPECT_STREQ(ph_status_name(PH_ERROR_INVALID_HANDLE),
               "PH_ERROR_INVALID_HANDLE");
  EXPECT_STREQ(ph_status_name(PH_ERROR_OUT_OF_MEMORY),
               "PH_ERROR_OUT_OF_MEMORY");
  EXPECT_STREQ(ph_status_name(PH_ERROR_DEVICE), "PH_ERROR_DEVICE");
  EXPECT_STREQ(ph_status_name(PH_ERROR_UNIMPLEMENTED),
               "PH_ERROR_UNIMPLEMENTED");
  EXPECT_STREQ(ph_status_name(PH_ERROR_NOT_INITIALIZED),
               "PH_ERROR_NOT_INITIALIZED");
  EXPECT_STREQ(ph_status_name(static_cast<ph_status_t>(
                   PH_ERROR_STREAM_CAPTURE_UNSUPPORTED)),
               "PH_ERROR_STREAM_CAPTURE_UNSUPPORTED");
  EXPECT_STREQ(ph_status_name(
                   static_cast<ph_status_t>(PH_ERROR_CAPTURE_INVALIDATED)),
               "PH_ERROR_CAPTURE_INVALIDATED");
  EXPECT_STREQ(ph_status_name(static_cast<ph_status_t>(12345)),
               "PH_STATUS_UNKNOWN");
}

TEST(Status, AbiVersionMatchesHeaderMajor) {
  EXPECT_EQ(ph_abi_version() / 1000, PH_HAL_ABI_VERSION / 1000);
}

TEST(Status, LastErrorIsPerThreadAndSurvivesSuccess) {
  EXPECT_EQ(ph_set_device(-1), PH_ERROR_INVALID_DEVICE);
  const std::string message = ph_last_error_message();
  EXPECT_NE(message.find("-1"), std::string::npos) << message;
  int count = 0;
  EXPECT_PH_OK(ph_device_count(&count));
  EXPECT_EQ(ph_last_error_message(), message);  // success leaves it alone
  std::string other_thread = "unset";
  std::thread([&] { other_thread = ph_last_error_message(); }).join();
  EXPECT_EQ(other_thread, "");
}

}  // namespace
