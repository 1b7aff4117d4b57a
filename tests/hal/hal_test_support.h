// Shared pieces of the HAL conformance suite: the driver under test, the
// capabilities it offers, and the helpers every test file uses.
//
// Design. The suite links no driver. hal_test_driver.cc opens the library
// PHANTOM_DRIVER names (the one CMake registered by default),
// reads its table through ph_driver_get_table, and defines every ph_*
// function of phantom/hal.h as a plain forward through that table, so the
// tests call the HAL by name as any caller would, yet reach exactly the
// driver's own entry points (no fallback in between). An OPTIONAL member
// the driver leaves NULL answers PH_ERROR_UNIMPLEMENTED, as hal.h says a
// driver without the capability does.
//
// A test of an OPTIONAL part of hal.h starts with
// REQUIRE_CAPABILITY(kSomething): the capability is probed once per process
// (table member set, and a harmless call not answered with
// PH_ERROR_UNIMPLEMENTED), and a driver without it skips the test with a
// sentence naming what is missing, never fails it. Everything else is
// required of every driver.
#ifndef PHANTOM_TESTS_HAL_HAL_TEST_SUPPORT_H_
#define PHANTOM_TESTS_HAL_HAL_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "phantom/hal.h"

namespace hal_test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- The driver under test -------------------------------------------------

// The table of the driver under test, loaded on first use. A library that
// cannot be loaded ends the program with a sentence saying which and why.
const ph_driver_table_t& Driver();
// The path the driver was loaded from.
const std::string& DriverPath();

// ---- Capabilities ----------------------------------------------------------

// The OPTIONAL parts of phantom/hal.h (and the second device some tests
// need). Each is probed once from the driver.
enum class Capability {
  kTwoDevices,      // ph_device_count reports at least two devices
  kKernelView,      // ph_kernel_address: host work reaches device memory
  kHostFunc,        // ph_run_host_func: the driver runs host work and waits
  kTelemetry,       // ph_device_get_telemetry
  kGraph,           // graph capture and replay (ph_stream_begin_capture...)
  kIpcMemory,       // ph_ipc_get_mem_handle and the other memory calls
  kIpcEvent,        // PH_EVENT_INTERPROCESS and the event handle calls
  kActivityTrace,   // phantom/hal_activity.h
};

bool Has(Capability capability);
// "the driver has no kernel view (ph_kernel_address is NULL or answers
// PH_ERROR_UNIMPLEMENTED)", and so on: why a test needing it is skipped.
std::string MissingSentence(Capability capability);

// Skips the current test, naming the capability, when the driver lacks it.
#define REQUIRE_CAPABILITY(capability)                               \
  if (!::hal_test::Has(::hal_test::Capability::capability))          \
  GTEST_SKIP() << ::hal_test::MissingSentence(                       \
      ::hal_test::Capability::capability)
#define REQUIRE_TWO_DEVICES() REQUIRE_CAPABILITY(kTwoDevices)

// ---- Checking calls --------------------------------------------------------

// Checks a call succeeded, printing the status name and the driver's
// message otherwise. More context may be streamed in with <<.
#define PH_CHECK_OK_(check, expr)                                  \
  if (const ph_status_t ph_status_ = (expr); false) {              \
  } else                                                           \
    check(ph_status_, PH_SUCCESS)                                  \
        << ph_status_name(ph_status_) << ": " << ph_last_error_message() << " "
#define EXPECT_PH_OK(expr) PH_CHECK_OK_(EXPECT_EQ, expr)
#define ASSERT_PH_OK(expr) PH_CHECK_OK_(ASSERT_EQ, expr)

// ---- Host work -------------------------------------------------------------

// Counts what the driver did with tasks.
struct TaskProbe {
  std::atomic<int> runs{0};
  std::atomic<int> releases{0};
};

using TaskBody = std::function<ph_status_t(char* error, size_t error_size)>;

// A host task running `body`, counted by `probe`.
ph_host_task_t MakeTask(const char* name, TaskBody body, TaskProbe* probe);

// Queues `body` on `stream` as host work named `name`.
ph_status_t Launch(ph_stream_t stream, const char* name, TaskBody body,
                   TaskProbe* probe = nullptr);

// Runs `body` on `stream` through ph_run_host_func (returns when done).
ph_status_t RunNow(ph_stream_t stream, const char* name, TaskBody body,
                   TaskProbe* probe = nullptr);

// A barrier the test opens: work that waits on it keeps its stream busy.
class Gate {
 public:
  void Open();
  void Wait();
  bool entered() const { return entered_; }
  void WaitEntered() const;
  // Queues a task that blocks `stream` until Open().
  ph_status_t Block(ph_stream_t stream);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
  std::atomic<bool> entered_{false};
};

// ---- Devices, memory, streams and events -----------------------------------

int DeviceCount();
size_t FreeBytes(int device);

// A stream destroyed at scope exit.
class ScopedStream {
 public:
  explicit ScopedStream(int device = 0, int priority = 0);
  ~ScopedStream();
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;
  ph_stream_t get() const { return stream_; }
  operator ph_stream_t() const { return stream_; }

 private:
  ph_stream_t stream_ = nullptr;
};

// An event destroyed at scope exit.
class ScopedEvent {
 public:
  explicit ScopedEvent(unsigned flags = PH_EVENT_DEFAULT);
  ~ScopedEvent();
  ScopedEvent(const ScopedEvent&) = delete;
  ScopedEvent& operator=(const ScopedEvent&) = delete;
  operator ph_event_t() const { return event_; }

 private:
  ph_event_t event_ = nullptr;
};

// Device memory freed at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t size);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Pinned host memory freed at scope exit.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t size);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// `size` bytes of a pattern that differs with `seed`.
std::vector<char> Pattern(size_t size, int seed);

// How many times `needle` occurs in `text`.
size_t Occurrences(const std::string& text, const std::string& needle);

}  // namespace hal_test

#endif  // PHANTOM_TESTS_HAL_HAL_TEST_SUPPORT_H_
