// main() of the HAL conformance program: gtest, with death tests that
// re-execute the program (each child loads the driver afresh), judged
// against the driver's expectation list (hal_test_expectations.h). The
// driver's configuration (device count, memory) comes from the
// environment CMake gives each registered test, never from here.
#include <gtest/gtest.h>

#include "hal_test_expectations.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return hal_test::RunTestsWithExpectations();
}
