// Turning HAL status codes into PyTorch exceptions.
//
// Every HAL call made by the runtime and the operators goes through
// PHANTOM_CHECK. A failing status becomes the exception a PyTorch user
// expects from a real accelerator: PH_ERROR_OUT_OF_MEMORY is a
// c10::OutOfMemoryError (torch.OutOfMemoryError in Python), an argument or
// handle error is a c10::ValueError / c10::Error, and a device or driver
// failure is a c10::AcceleratorError (torch.AcceleratorError). The message
// always carries the driver's own sentence from ph_last_error_message().
#pragma once

#include <phantom/hal.h>

#include <c10/macros/Macros.h>

namespace phantom {

[[noreturn]] void throwHalError(ph_status_t status, const char* expr,
                                const char* file, int line);

}  // namespace phantom

#define PHANTOM_CHECK(EXPR)                                          \
  do {                                                               \
    const ph_status_t phantom_status_ = (EXPR);                      \
    if (C10_UNLIKELY(phantom_status_ != PH_SUCCESS)) {               \
      ::phantom::throwHalError(phantom_status_, #EXPR, __FILE__,     \
                               __LINE__);                            \
    }                                                                \
  } while (0)
