// Per-driver expectation lists for the HAL conformance suite.
//
// Design. A driver that knowingly breaks a promise of hal.h lists the
// tests it fails in tests/hal/expected/<driver target>.txt, one a line:
//
//   Suite.Test  why the driver fails it, in one line
//
// ('#' starts a comment; a line without a reason is refused). CMake hands
// the file to the suite as PHANTOM_HAL_TEST_EXPECTED. RunTestsWithExpectations
// runs the tests, then judges each that ran: a listed test that fails is
// fine (its reason is printed), a listed test that passes is a failure
// ("unexpected pass: remove it from <file>"), an unlisted failure is a
// failure. A listed name that is no test of a suite this program has is a
// failure too, so lists cannot go stale. Skipped tests are neither. The
// program's exit status is that verdict, which is what ctest reads.
#ifndef PHANTOM_TESTS_HAL_HAL_TEST_EXPECTATIONS_H_
#define PHANTOM_TESTS_HAL_HAL_TEST_EXPECTATIONS_H_

namespace hal_test {

// RUN_ALL_TESTS() judged against the list PHANTOM_HAL_TEST_EXPECTED names
// (none: plain RUN_ALL_TESTS). Call after ::testing::InitGoogleTest.
int RunTestsWithExpectations();

}  // namespace hal_test

#endif  // PHANTOM_TESTS_HAL_HAL_TEST_EXPECTATIONS_H_
