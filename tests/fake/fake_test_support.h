// What the fake driver's own tests share: their assertion on a ph_status_t.
#ifndef PHANTOM_TESTS_FAKE_FAKE_TEST_SUPPORT_H_
#define PHANTOM_TESTS_FAKE_FAKE_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include "phantom/hal.h"

// Asserts `expr` returned PH_SUCCESS, printing the driver's last error if not.
#define ASSERT_PH_OK(expr)                                              \
  if (const ph_status_t ph_status_ = (expr); false) {                   \
  } else                                                                \
    ASSERT_EQ(ph_status_, PH_SUCCESS) << ph_last_error_message()

#endif  // PHANTOM_TESTS_FAKE_FAKE_TEST_SUPPORT_H_
