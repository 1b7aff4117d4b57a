// A program for checking the expectation lists (hal_test_expectations.h):
// one test that passes and one that fails, run by ctest against the lists
// in expected/checks (tests/hal/CMakeLists.txt says what each must give).
#include <gtest/gtest.h>

#include "hal_test_expectations.h"

TEST(Check, Passes) { SUCCEED(); }

TEST(Check, Fails) { ADD_FAILURE() << "fails on purpose"; }

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return hal_test::RunTestsWithExpectations();
}
