// Error reporting of the fake driver.
//
// hal.h promises that after any failing call, ph_last_error_message() on the
// same thread returns a sentence saying what went wrong. Every entry point
// therefore returns through Fail(), which stores the sentence in a
// thread-local string and hands the status back, so "set the message" and
// "return the code" cannot drift apart. Successful calls leave the message
// alone (the header says it stays valid until the next *failing* call).
//
// Guarded() is the outermost frame of every C entry point: the fake is C++
// and may throw (std::bad_alloc, std::system_error from std::thread), but an
// exception must never cross the C ABI, so it is turned into a status here.
#ifndef PHANTOM_FAKE_ERRORS_H_
#define PHANTOM_FAKE_ERRORS_H_

#include <exception>
#include <new>
#include <string>

#include "phantom/hal.h"

namespace phantom::fake {

// Stores `message` as the calling thread's last error and returns `status`.
ph_status_t Fail(ph_status_t status, std::string message);

// The calling thread's last error message ("" if none yet).
const char* LastErrorMessage();

// Formats a byte count for people: "64.00 MiB".
std::string FormatBytes(size_t bytes);

// Runs `body` (returning ph_status_t) and converts escaping exceptions into
// PH_ERROR_OUT_OF_MEMORY / PH_ERROR_DEVICE with a message naming `function`.
template <typename Body>
ph_status_t Guarded(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                std::string(function) + ": the host ran out of memory");
  } catch (const std::exception& e) {
    return Fail(PH_ERROR_DEVICE,
                std::string(function) + ": internal driver error: " + e.what());
  } catch (...) {
    return Fail(PH_ERROR_DEVICE,
                std::string(function) + ": unknown internal driver error");
  }
}

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_ERRORS_H_
