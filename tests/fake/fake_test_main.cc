// The fake driver's test program: a two-device, 64 MiB configuration
// unless the environment sets another.
#include <gtest/gtest.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  // Not overwritten: a death-test child re-executes this binary and must
  // keep the configuration its test arranged.
  setenv("PHANTOM_DEVICE_COUNT", "2", 0);
  setenv("PHANTOM_DEVICE_MEMORY", "64MiB", 0);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
