// The fake driver refusing to start: a bad PHANTOM_DEVICE_COUNT makes every
// HAL call answer PH_ERROR_NOT_INITIALIZED with a sentence naming the
// setting. The setting and its sentence are the fake's own (hal.h only
// promises PH_ERROR_NOT_INITIALIZED), so the test lives here and not in the
// driver-independent conformance suite (tests/hal).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "phantom/hal.h"

namespace {

// A driver that cannot start answers PH_ERROR_NOT_INITIALIZED from every
// call and says which setting was wrong. The child process reads the
// configuration afresh (death tests re-execute the binary).
TEST(StartUp, InvalidConfigurationIsNotInitialized) {
  const char* saved = getenv("PHANTOM_DEVICE_COUNT");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("PHANTOM_DEVICE_COUNT", "abc", 1);
  EXPECT_EXIT(
      {
        int count = 7;
        void* ptr = nullptr;
        ph_stream_t stream = nullptr;
        const bool ok = ph_device_count(&count) == PH_ERROR_NOT_INITIALIZED &&
                        count == 0 &&
                        std::string(ph_last_error_message())
                                .find("PHANTOM_DEVICE_COUNT='abc'") !=
                            std::string::npos &&
                        ph_malloc(0, 16, &ptr) == PH_ERROR_NOT_INITIALIZED &&
                        ph_stream_create(0, 0, &stream) ==
                            PH_ERROR_NOT_INITIALIZED &&
                        ph_set_device(0) == PH_ERROR_NOT_INITIALIZED;
        fprintf(stderr, "%s\n", ph_last_error_message());
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "PHANTOM_DEVICE_COUNT='abc'");
  if (saved != nullptr) {
    setenv("PHANTOM_DEVICE_COUNT", saved_value.c_str(), 1);
  } else {
    unsetenv("PHANTOM_DEVICE_COUNT");
  }
}

}  // namespace
