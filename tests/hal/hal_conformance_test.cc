// HAL conformance suite: written against phantom/hal.h alone, so any driver
// can be run through it (link it in place of phantom_fake; see
// CMakeLists.txt). Each test states a promise of hal.h and fails if a
// driver breaks it.
//
// Environment: main() asks for 2 devices of 64 MiB unless the environment
// already says otherwise, so out-of-memory tests are quick. Tests that need
// two devices skip (with the reason) when only one exists. The tests of
// the OPTIONAL entry points (ph_kernel_address, ph_device_get_telemetry)
// are skipped if a driver answers PH_ERROR_UNIMPLEMENTED.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "phantom/hal.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Checks a call succeeded, printing the status name and the driver's
// message otherwise. More context may be streamed in with <<.
#define PH_CHECK_OK_(check, expr)                                  \
  if (const ph_status_t ph_status_ = (expr); false) {              \
  } else                                                           \
    check(ph_status_, PH_SUCCESS)                                  \
        << ph_status_name(ph_status_) << ": " << ph_last_error_message() << " "
#define EXPECT_PH_OK(expr) PH_CHECK_OK_(EXPECT_EQ, expr)
#define ASSERT_PH_OK(expr) PH_CHECK_OK_(ASSERT_EQ, expr)

// Counts what the driver did with tasks.
struct TaskProbe {
  std::atomic<int> runs{0};
  std::atomic<int> releases{0};
};

using TaskBody = std::function<ph_status_t(char* error, size_t error_size)>;

struct Closure {
  TaskBody body;
  TaskProbe* probe;
};

ph_status_t RunClosure(void* user_data, char* error, size_t error_size) {
  auto* closure = static_cast<Closure*>(user_data);
  if (closure->probe != nullptr) closure->probe->runs++;
  return closure->body ? closure->body(error, error_size) : PH_SUCCESS;
}

void ReleaseClosure(void* user_data) {
  auto* closure = static_cast<Closure*>(user_data);
  if (closure->probe != nullptr) closure->probe->releases++;
  delete closure;
}

// A host task running `body`, counted by `probe`.
ph_host_task_t MakeTask(const char* name, TaskBody body, TaskProbe* probe) {
  return {name, RunClosure, ReleaseClosure,
          new Closure{std::move(body), probe}};
}

// Queues `body` on `stream` as host work named `name`.
ph_status_t Launch(ph_stream_t stream, const char* name, TaskBody body,
                   TaskProbe* probe = nullptr) {
  const ph_host_task_t task = MakeTask(name, std::move(body), probe);
  return ph_launch_host_func(stream, &task);
}

// Runs `body` on `stream` through ph_run_host_func (returns when done).
ph_status_t RunNow(ph_stream_t stream, const char* name, TaskBody body,
                   TaskProbe* probe = nullptr) {
  const ph_host_task_t task = MakeTask(name, std::move(body), probe);
  return ph_run_host_func(stream, &task);
}

// A barrier the test opens: work that waits on it keeps its stream busy.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void Wait() {
    entered_ = true;
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return open_; });
  }
  bool entered() const { return entered_; }
  void WaitEntered() const {
    while (!entered_) std::this_thread::sleep_for(milliseconds(1));
  }
  // Queues a task that blocks `stream` until Open().
  ph_status_t Block(ph_stream_t stream) {
    return Launch(stream, "gate", [this](char*, size_t) {
      Wait();
      return PH_SUCCESS;
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
  std::atomic<bool> entered_{false};
};

int DeviceCount() {
  int count = 0;
  EXPECT_PH_OK(ph_device_count(&count));
  return count;
}

size_t FreeBytes(int device) {
  size_t free_bytes = 0;
  size_t total = 0;
  EXPECT_PH_OK(ph_mem_get_info(device, &free_bytes, &total));
  return free_bytes;
}

// A stream destroyed at scope exit.
class ScopedStream {
 public:
  explicit ScopedStream(int device = 0, int priority = 0) {
    EXPECT_PH_OK(ph_stream_create(device, priority, &stream_));
  }
  ~ScopedStream() {
    if (stream_ != nullptr) ph_stream_destroy(stream_);
  }
  ph_stream_t get() const { return stream_; }
  operator ph_stream_t() const { return stream_; }

 private:
  ph_stream_t stream_ = nullptr;
};

class ScopedEvent {
 public:
  explicit ScopedEvent(unsigned flags = PH_EVENT_DEFAULT) {
    EXPECT_PH_OK(ph_event_create(flags, &event_));
  }
  ~ScopedEvent() { ph_event_destroy(event_); }
  operator ph_event_t() const { return event_; }

 private:
  ph_event_t event_ = nullptr;
};

// Device memory freed at scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t size) {
    EXPECT_PH_OK(ph_malloc(device, size, &ptr_));
  }
  ~DeviceBuffer() { ph_free(ptr_); }
  void* get() const { return ptr_; }
  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t size) {
    EXPECT_PH_OK(ph_host_malloc(size, &ptr_));
  }
  ~PinnedBuffer() { ph_host_free(ptr_); }
  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

std::vector<char> Pattern(size_t size, int seed) {
  std::vector<char> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 7 + seed);
  return data;
}

#define REQUIRE_TWO_DEVICES()                                       \
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two devices"

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

/* ---- Devices ----------------------------------------------------------- */

TEST(Device, CountIsPositiveAndNullOutIsRefused) {
  EXPECT_GE(DeviceCount(), 1);
  EXPECT_EQ(ph_device_count(nullptr), PH_ERROR_INVALID_ARGUMENT);
}

TEST(Device, CurrentDeviceIsThreadLocalAndChecked) {
  REQUIRE_TWO_DEVICES();
  int device = -1;
  int other = -1;
  std::thread([&] { ph_get_device(&other); }).join();
  EXPECT_EQ(other, 0);
  ASSERT_PH_OK(ph_set_device(1));
  ASSERT_PH_OK(ph_get_device(&device));
  EXPECT_EQ(device, 1);
  std::thread([&] { ph_get_device(&other); }).join();
  EXPECT_EQ(other, 0) << "a new thread starts on device 0";

  const int count = DeviceCount();
  EXPECT_EQ(ph_set_device(count), PH_ERROR_INVALID_DEVICE);
  EXPECT_NE(std::string(ph_last_error_message()).find("out of range"),
            std::string::npos);
  EXPECT_EQ(ph_set_device(-1), PH_ERROR_INVALID_DEVICE);
  ASSERT_PH_OK(ph_get_device(&device));
  EXPECT_EQ(device, 1) << "a failed set_device keeps the current device";
  ASSERT_PH_OK(ph_set_device(0));
}

TEST(Device, PropertiesDescribeTheDevice) {
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  ASSERT_PH_OK(ph_device_get_properties(0, &props));
  EXPECT_GT(std::strlen(props.name), 0u);
  EXPECT_LT(std::strlen(props.name), sizeof props.name);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_PH_OK(ph_mem_get_info(0, &free_bytes, &total));
  EXPECT_EQ(props.total_memory, total);
  EXPECT_GE(props.multiprocessor_count, 1);
  EXPECT_LE(props.stream_priority_high, props.stream_priority_low);

  std::memset(&props, 0x5a, sizeof props);
  EXPECT_EQ(ph_device_get_properties(DeviceCount(), &props),
            PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(props.total_memory, 0u) << "out parameters are cleared";
  EXPECT_EQ(ph_device_get_properties(0, nullptr), PH_ERROR_INVALID_ARGUMENT);
}

TEST(Device, SynchronizeWaitsForEveryStreamOfTheDevice) {
  ScopedStream a(0);
  ScopedStream b(0);
  std::atomic<int> finished{0};
  for (ph_stream_t stream : {a.get(), b.get()}) {
    ASSERT_PH_OK(Launch(stream, "sleep", [&](char*, size_t) {
      std::this_thread::sleep_for(milliseconds(30));
      finished++;
      return PH_SUCCESS;
    }));
  }
  ASSERT_PH_OK(ph_device_synchronize(0));
  EXPECT_EQ(finished.load(), 2);
  EXPECT_EQ(ph_device_synchronize(DeviceCount()), PH_ERROR_INVALID_DEVICE);
}

TEST(Device, SynchronizeReportsAStickyError) {
  ScopedStream good(0);
  ScopedStream bad(0);
  ASSERT_PH_OK(Launch(bad, "device_sync_failure", [](char* error, size_t n) {
    std::snprintf(error, n, "boom");
    return PH_ERROR_DEVICE;
  }));
  EXPECT_EQ(ph_device_synchronize(0), PH_ERROR_DEVICE);
  EXPECT_NE(std::string(ph_last_error_message()).find("device_sync_failure"),
            std::string::npos);
}

/* ---- Device telemetry (OPTIONAL) --------------------------------------- */

// Queries `device`'s telemetry with a full-size struct; skips the test if
// the driver does not implement the OPTIONAL call.
#define QUERY_TELEMETRY_OR_SKIP(device, out)                              \
  (out).struct_size = sizeof(ph_device_telemetry_t);                      \
  if (const ph_status_t telemetry_status_ =                               \
          ph_device_get_telemetry((device), &(out));                      \
      telemetry_status_ == PH_ERROR_UNIMPLEMENTED) {                      \
    GTEST_SKIP() << "driver has no telemetry (OPTIONAL entry point)";     \
  } else                                                                  \
    ASSERT_EQ(telemetry_status_, PH_SUCCESS) << ph_last_error_message()

TEST(Telemetry, ArgumentsAreCheckedAndOutputsCleared) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_EQ(telemetry.struct_size, sizeof telemetry) << "struct_size is input";
  EXPECT_EQ(ph_device_get_telemetry(0, nullptr), PH_ERROR_INVALID_ARGUMENT);

  std::memset(&telemetry, 0x5a, sizeof telemetry);
  telemetry.struct_size = sizeof telemetry;
  EXPECT_EQ(ph_device_get_telemetry(DeviceCount(), &telemetry),
            PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(telemetry.valid, 0u) << "out parameters are cleared";
  EXPECT_EQ(telemetry.sample_period_us, 0u);

  telemetry.struct_size = sizeof(size_t);  // not even room for `valid`
  EXPECT_EQ(ph_device_get_telemetry(0, &telemetry), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ph_last_error_message()).find("struct_size"),
            std::string::npos)
      << ph_last_error_message();
}

// A caller built against a shorter struct (an older header) gives its own
// struct_size: the driver writes nothing past it and claims no field it
// could not write.
TEST(Telemetry, AShorterStructIsFilledOnlyUpToItsSize) {
  ph_device_telemetry_t probe;
  QUERY_TELEMETRY_OR_SKIP(0, probe);
  const size_t short_size = offsetof(ph_device_telemetry_t, temperature_c);
  ph_device_telemetry_t telemetry;
  std::memset(&telemetry, 0x5a, sizeof telemetry);
  telemetry.struct_size = short_size;
  ASSERT_PH_OK(ph_device_get_telemetry(0, &telemetry));
  const auto* bytes = reinterpret_cast<const unsigned char*>(&telemetry);
  for (size_t i = short_size; i < sizeof telemetry; ++i) {
    ASSERT_EQ(bytes[i], 0x5a) << "byte " << i << " lies past struct_size";
  }
  const uint32_t beyond = PH_TELEMETRY_TEMPERATURE | PH_TELEMETRY_POWER |
                          PH_TELEMETRY_CLOCK;
  EXPECT_EQ(telemetry.valid & beyond, 0u);
  EXPECT_LE(telemetry.utilization_percent, 100u);
}

TEST(Telemetry, ValuesAreInRangeAndUnmeasuredFieldsAreZero) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_LE(telemetry.utilization_percent, 100u);
  EXPECT_LE(telemetry.memory_busy_percent, 100u);
  const std::pair<uint32_t, uint64_t> fields[] = {
      {PH_TELEMETRY_UTILIZATION, telemetry.utilization_percent},
      {PH_TELEMETRY_MEMORY_BUSY, telemetry.memory_busy_percent},
      {PH_TELEMETRY_TEMPERATURE, static_cast<uint64_t>(telemetry.temperature_c)},
      {PH_TELEMETRY_POWER, telemetry.power_draw_mw},
      {PH_TELEMETRY_CLOCK, telemetry.clock_mhz}};
  for (const auto& [bit, value] : fields) {
    if ((telemetry.valid & bit) == 0) {
      EXPECT_EQ(value, 0u) << "field of bit " << bit << " is not measured";
    }
  }
}

// Utilization follows the work: a stream kept busy over a whole sample
// period reads high, an idle device low. The margins are wide: a period
// is at least 100 ms on the fake, a real device's sample period may be
// longer (but then it also covers the busy or the idle stretch).
TEST(Telemetry, UtilizationFollowsWorkOnTheDevicesStreams) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);  // starts a period
  if ((telemetry.valid & PH_TELEMETRY_UTILIZATION) == 0) {
    GTEST_SKIP() << "driver does not measure utilization";
  }
  ScopedStream stream(0);
  ASSERT_PH_OK(Launch(stream, "busy", [](char*, size_t) {
    std::this_thread::sleep_for(milliseconds(400));
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_GE(telemetry.utilization_percent, 50u)
      << "over " << telemetry.sample_period_us << " us";
  EXPECT_GT(telemetry.sample_period_us, 0u);

  std::this_thread::sleep_for(milliseconds(400));  // the device idles
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_LE(telemetry.utilization_percent, 50u)
      << "over " << telemetry.sample_period_us << " us";
}

TEST(Telemetry, MemoryBusyFollowsCopies) {
  ph_device_telemetry_t telemetry;
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  if ((telemetry.valid & PH_TELEMETRY_MEMORY_BUSY) == 0) {
    GTEST_SKIP() << "driver does not measure memory activity";
  }
  // Copies back to back for 400 ms.
  const size_t size = size_t{8} << 20;
  DeviceBuffer a(0, size);
  DeviceBuffer b(0, size);
  const auto until = Clock::now() + milliseconds(400);
  while (Clock::now() < until) {
    ASSERT_PH_OK(ph_memcpy(b.get(), a.get(), size, PH_MEMCPY_DEVICE_TO_DEVICE));
  }
  QUERY_TELEMETRY_OR_SKIP(0, telemetry);
  EXPECT_GE(telemetry.memory_busy_percent, 50u)
      << "over " << telemetry.sample_period_us << " us";
}

/* ---- Device memory ----------------------------------------------------- */

TEST(Memory, MallocAlignsAndZeroSizeGivesNull) {
  void* ptrs[5] = {};
  const size_t sizes[5] = {1, 3, 255, 1000, 4097};
  for (int i = 0; i < 5; ++i) {
    ASSERT_PH_OK(ph_malloc(0, sizes[i], &ptrs[i]));
    ASSERT_NE(ptrs[i], nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ptrs[i]) % 256, 0u);
  }
  for (void* ptr : ptrs) EXPECT_PH_OK(ph_free(ptr));
  void* zero = reinterpret_cast<void*>(1);
  ASSERT_PH_OK(ph_malloc(0, 0, &zero));
  EXPECT_EQ(zero, nullptr);
  EXPECT_PH_OK(ph_free(nullptr));
}

TEST(Memory, AccountingFollowsAllocations) {
  const size_t baseline = FreeBytes(0);
  void* ptr = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 1 << 20, &ptr));
  EXPECT_LE(FreeBytes(0), baseline - (1 << 20));
  ASSERT_PH_OK(ph_free(ptr));
  EXPECT_EQ(FreeBytes(0), baseline);
}

TEST(Memory, OutOfMemoryIsReportedAndRecoverable) {
  size_t free_before = 0;
  size_t total = 0;
  ASSERT_PH_OK(ph_mem_get_info(0, &free_before, &total));
  void* ptr = reinterpret_cast<void*>(1);
  EXPECT_EQ(ph_malloc(0, total + 1, &ptr), PH_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(ptr, nullptr);
  const std::string message = ph_last_error_message();
  EXPECT_NE(message.find(std::to_string(total + 1)), std::string::npos)
      << message;
  // Fill the device in large blocks until it refuses, then free it all.
  std::vector<void*> blocks;
  const size_t block = total / 3;  // two fit; a third does not
  for (;;) {
    void* next = nullptr;
    const ph_status_t status = ph_malloc(0, block, &next);
    if (status == PH_ERROR_OUT_OF_MEMORY) break;
    ASSERT_PH_OK(status);
    blocks.push_back(next);
    ASSERT_LT(blocks.size(), 4u) << "capacity is not enforced";
  }
  void* small = nullptr;
  EXPECT_PH_OK(ph_malloc(0, 4096, &small)) << "smaller requests still fit";
  EXPECT_PH_OK(ph_free(small));
  for (void* ptr_to_free : blocks) EXPECT_PH_OK(ph_free(ptr_to_free));
  EXPECT_EQ(FreeBytes(0), free_before);
}

TEST(Memory, InvalidDeviceAndNullOut) {
  void* ptr = reinterpret_cast<void*>(1);
  EXPECT_EQ(ph_malloc(DeviceCount(), 16, &ptr), PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(ph_malloc(-1, 16, &ptr), PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(ph_malloc(0, 16, nullptr), PH_ERROR_INVALID_ARGUMENT);
  size_t free_bytes = 1;
  size_t total = 1;
  EXPECT_EQ(ph_mem_get_info(DeviceCount(), &free_bytes, &total),
            PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(free_bytes, 0u);
  EXPECT_EQ(total, 0u);
}

TEST(Memory, FreeRefusesWhatIsNotALiveAllocationStart) {
  void* ptr = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 4096, &ptr));
  EXPECT_EQ(ph_free(static_cast<char*>(ptr) + 256), PH_ERROR_INVALID_HANDLE);
  int host = 0;
  EXPECT_EQ(ph_free(&host), PH_ERROR_INVALID_HANDLE);
  EXPECT_PH_OK(ph_free(ptr));
  EXPECT_EQ(ph_free(ptr), PH_ERROR_INVALID_HANDLE) << "double free";
  EXPECT_GT(std::strlen(ph_last_error_message()), 0u);
}

/* ---- Pinned memory and pointer attributes ------------------------------ */

TEST(Pinned, AllocationIsPageAlignedWritableAndTracked) {
  void* ptr = nullptr;
  ASSERT_PH_OK(ph_host_malloc(10000, &ptr));
  ASSERT_NE(ptr, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % sysconf(_SC_PAGESIZE), 0u);
  std::memset(ptr, 0xab, 10000);  // host-addressable

  ph_pointer_attributes_t attr;
  ASSERT_PH_OK(ph_pointer_get_attributes(static_cast<char*>(ptr) + 5000, &attr));
  EXPECT_EQ(attr.type, PH_MEMORY_HOST_PINNED);
  EXPECT_EQ(attr.device, -1);
  EXPECT_EQ(attr.base, ptr);
  EXPECT_EQ(attr.size, 10000u);

  EXPECT_EQ(ph_host_free(static_cast<char*>(ptr) + 8), PH_ERROR_INVALID_HANDLE);
  EXPECT_PH_OK(ph_host_free(ptr));
  EXPECT_EQ(ph_host_free(ptr), PH_ERROR_INVALID_HANDLE);
  int host = 0;
  EXPECT_EQ(ph_host_free(&host), PH_ERROR_INVALID_HANDLE);
  EXPECT_PH_OK(ph_host_free(nullptr));

  void* zero = reinterpret_cast<void*>(1);
  EXPECT_PH_OK(ph_host_malloc(0, &zero));
  EXPECT_EQ(zero, nullptr);
  EXPECT_EQ(ph_host_malloc(16, nullptr), PH_ERROR_INVALID_ARGUMENT);
}

TEST(Attributes, ClassifyDevicePinnedAndPageablePointers) {
  DeviceBuffer device(0, 3000);
  ph_pointer_attributes_t attr;
  ASSERT_PH_OK(ph_pointer_get_attributes(device.bytes() + 100, &attr));
  EXPECT_EQ(attr.type, PH_MEMORY_DEVICE);
  EXPECT_EQ(attr.device, 0);
  EXPECT_EQ(attr.base, device.get());
  EXPECT_EQ(attr.size, 3000u);

  int stack = 0;
  ASSERT_PH_OK(ph_pointer_get_attributes(&stack, &attr));
  EXPECT_EQ(attr.type, PH_MEMORY_UNREGISTERED);
  EXPECT_EQ(attr.device, -1);
  EXPECT_EQ(attr.base, nullptr);
  EXPECT_EQ(attr.size, 0u);
  std::vector<char> heap(64);
  ASSERT_PH_OK(ph_pointer_get_attributes(heap.data(), &attr));
  EXPECT_EQ(attr.type, PH_MEMORY_UNREGISTERED);
  ASSERT_PH_OK(ph_pointer_get_attributes(nullptr, &attr));
  EXPECT_EQ(attr.type, PH_MEMORY_UNREGISTERED);
  EXPECT_EQ(ph_pointer_get_attributes(&stack, nullptr),
            PH_ERROR_INVALID_ARGUMENT);
}

TEST(Attributes, SecondDeviceIsReported) {
  REQUIRE_TWO_DEVICES();
  DeviceBuffer device(1, 512);
  ph_pointer_attributes_t attr;
  ASSERT_PH_OK(ph_pointer_get_attributes(device.get(), &attr));
  EXPECT_EQ(attr.type, PH_MEMORY_DEVICE);
  EXPECT_EQ(attr.device, 1);
}

/* ---- Synchronous copies ------------------------------------------------ */

TEST(Memcpy, RoundTripsThroughEveryKind) {
  const size_t size = 100000;
  const std::vector<char> data = Pattern(size, 3);
  DeviceBuffer a(0, size);
  DeviceBuffer b(0, size);
  ASSERT_PH_OK(ph_memcpy(a.get(), data.data(), size, PH_MEMCPY_HOST_TO_DEVICE));
  ASSERT_PH_OK(ph_memcpy(b.get(), a.get(), size, PH_MEMCPY_DEVICE_TO_DEVICE));
  std::vector<char> back(size);
  ASSERT_PH_OK(ph_memcpy(back.data(), b.get(), size, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(back, data);
  std::vector<char> host_copy(size);
  ASSERT_PH_OK(ph_memcpy(host_copy.data(), data.data(), size,
                         PH_MEMCPY_HOST_TO_HOST));
  EXPECT_EQ(host_copy, data);

  PinnedBuffer pinned(size);
  ASSERT_PH_OK(ph_memcpy(pinned.bytes(), a.get(), size,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(std::memcmp(pinned.bytes(), data.data(), size), 0);
  // Interior ranges of an allocation.
  ASSERT_PH_OK(ph_memcpy(back.data(), a.bytes() + 10, 20,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(std::memcmp(back.data(), data.data() + 10, 20), 0);
}

TEST(Memcpy, CrossDeviceCopies) {
  REQUIRE_TWO_DEVICES();
  const size_t size = 8192;
  const std::vector<char> data = Pattern(size, 11);
  DeviceBuffer on0(0, size);
  DeviceBuffer on1(1, size);
  ASSERT_PH_OK(ph_memcpy(on0.get(), data.data(), size, PH_MEMCPY_HOST_TO_DEVICE));
  ASSERT_PH_OK(ph_memcpy(on1.get(), on0.get(), size,
                         PH_MEMCPY_DEVICE_TO_DEVICE));
  std::vector<char> back(size);
  ASSERT_PH_OK(ph_memcpy(back.data(), on1.get(), size,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(back, data);
}

TEST(Memcpy, RefusesContradictionsAndOverruns) {
  DeviceBuffer device(0, 1000);
  DeviceBuffer other(0, 1000);
  std::vector<char> host(4096);
  PinnedBuffer pinned(100);
  auto expect_invalid = [](ph_status_t status) {
    EXPECT_EQ(status, PH_ERROR_INVALID_ARGUMENT) << ph_status_name(status);
    EXPECT_GT(std::strlen(ph_last_error_message()), 0u);
  };
  // Memory type contradicts the kind.
  expect_invalid(ph_memcpy(host.data(), host.data() + 2000, 16,
                           PH_MEMCPY_HOST_TO_DEVICE));
  expect_invalid(ph_memcpy(device.get(), other.get(), 16,
                           PH_MEMCPY_HOST_TO_DEVICE));
  expect_invalid(ph_memcpy(host.data(), host.data() + 2000, 16,
                           PH_MEMCPY_DEVICE_TO_HOST));
  expect_invalid(ph_memcpy(host.data(), device.get(), 16,
                           PH_MEMCPY_HOST_TO_HOST));
  expect_invalid(ph_memcpy(device.get(), host.data(), 16,
                           PH_MEMCPY_DEVICE_TO_DEVICE));
  // Past the end of an allocation (device and pinned).
  expect_invalid(ph_memcpy(device.get(), host.data(), 1001,
                           PH_MEMCPY_HOST_TO_DEVICE));
  expect_invalid(ph_memcpy(host.data(), device.bytes() + 900, 200,
                           PH_MEMCPY_DEVICE_TO_HOST));
  expect_invalid(ph_memcpy(pinned.bytes(), device.get(), 101,
                           PH_MEMCPY_DEVICE_TO_HOST));
  // Unknown kind and null pointers.
  expect_invalid(ph_memcpy(host.data(), host.data() + 2000, 16,
                           static_cast<ph_memcpy_kind_t>(9)));
  expect_invalid(ph_memcpy(nullptr, host.data(), 16, PH_MEMCPY_HOST_TO_HOST));
  // A freed allocation is no longer a valid copy target.
  void* freed = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 512, &freed));
  ASSERT_PH_OK(ph_free(freed));
  expect_invalid(ph_memcpy(freed, host.data(), 16, PH_MEMCPY_HOST_TO_DEVICE));
  // Zero bytes is a no-op.
  EXPECT_PH_OK(ph_memcpy(device.get(), host.data(), 0,
                         PH_MEMCPY_HOST_TO_DEVICE));
}

/* ---- Stream-ordered copies --------------------------------------------- */

TEST(MemcpyAsync, CopiesAreOrderedOnTheStream) {
  const size_t size = 65536;
  const std::vector<char> data = Pattern(size, 5);
  ScopedStream stream;
  DeviceBuffer a(0, size);
  DeviceBuffer b(0, size);
  PinnedBuffer in(size);
  PinnedBuffer out(size);
  std::memcpy(in.bytes(), data.data(), size);
  for (int round = 0; round < 20; ++round) {
    ASSERT_PH_OK(ph_memset_async(a.get(), round, size, stream));
    ASSERT_PH_OK(ph_memcpy_async(a.get(), in.bytes(), size / 2,
                                 PH_MEMCPY_HOST_TO_DEVICE, stream));
    ASSERT_PH_OK(ph_memcpy_async(b.get(), a.get(), size,
                                 PH_MEMCPY_DEVICE_TO_DEVICE, stream));
    ASSERT_PH_OK(ph_memcpy_async(out.bytes(), b.get(), size,
                                 PH_MEMCPY_DEVICE_TO_HOST, stream));
    ASSERT_PH_OK(ph_stream_synchronize(stream));
    ASSERT_EQ(std::memcmp(out.bytes(), data.data(), size / 2), 0);
    for (size_t i = size / 2; i < size; ++i) {
      ASSERT_EQ(out.bytes()[i], static_cast<char>(round)) << i;
    }
  }
}

TEST(MemcpyAsync, PinnedCopyReturnsBeforeItRuns) {
  ScopedStream stream;
  DeviceBuffer device(0, 4096);
  PinnedBuffer out(4096);
  std::memset(out.bytes(), 1, 4096);
  ASSERT_PH_OK(ph_memset_async(device.get(), 7, 4096, stream));
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(ph_memcpy_async(out.bytes(), device.get(), 4096,
                               PH_MEMCPY_DEVICE_TO_HOST, stream));
  EXPECT_EQ(ph_stream_query(stream), PH_NOT_READY);
  EXPECT_EQ(out.bytes()[0], 1) << "the copy ran before earlier work finished";
  gate.Open();
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(out.bytes()[0], 7);
  EXPECT_EQ(out.bytes()[4095], 7);
}

TEST(MemcpyAsync, PageableCopyWaitsForEarlierWorkAndItself) {
  ScopedStream stream;
  DeviceBuffer device(0, 4096);
  ASSERT_PH_OK(Launch(stream, "slow", [](char*, size_t) {
    std::this_thread::sleep_for(milliseconds(30));
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_memset_async(device.get(), 9, 4096, stream));
  std::vector<char> host(4096, 0);
  ASSERT_PH_OK(ph_memcpy_async(host.data(), device.get(), 4096,
                               PH_MEMCPY_DEVICE_TO_HOST, stream));
  EXPECT_EQ(host[0], 9) << "a pageable copy must be complete on return";
  EXPECT_EQ(host[4095], 9);
  // The other direction: the source may be reused at once.
  std::vector<char> source(4096, 3);
  ASSERT_PH_OK(ph_memcpy_async(device.get(), source.data(), 4096,
                               PH_MEMCPY_HOST_TO_DEVICE, stream));
  std::fill(source.begin(), source.end(), 4);
  ASSERT_PH_OK(ph_memcpy(host.data(), device.get(), 4096,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(host[100], 3);
}

// Large copies are split over the copy engine's channels (the fake moves
// the halves on two threads): every byte still arrives, in each direction,
// from pinned and from pageable memory.
TEST(MemcpyAsync, LargeCopiesArriveWholeInEveryDirection) {
  const size_t size = (size_t{24} << 20) + 4099;  // over the split size, odd
  std::vector<char> source(size);
  uint32_t state = 12345;
  for (char& byte : source) {  // no period a misplaced half could hide in
    state = state * 1103515245u + 12345u;
    byte = static_cast<char>(state >> 16);
  }
  ScopedStream stream;
  DeviceBuffer a(0, size);
  DeviceBuffer b(0, size);
  PinnedBuffer pinned(size);
  std::memcpy(pinned.bytes(), source.data(), size);
  ASSERT_PH_OK(ph_memcpy_async(a.get(), pinned.bytes(), size,
                               PH_MEMCPY_HOST_TO_DEVICE, stream));
  ASSERT_PH_OK(ph_memcpy_async(b.get(), a.get(), size,
                               PH_MEMCPY_DEVICE_TO_DEVICE, stream));
  std::vector<char> pageable(size, 0);
  ASSERT_PH_OK(ph_memcpy_async(pageable.data(), b.get(), size,
                               PH_MEMCPY_DEVICE_TO_HOST, stream));
  EXPECT_TRUE(pageable == source) << "H2D (pinned), D2D, D2H (pageable)";
  ASSERT_PH_OK(ph_memset_async(a.get(), 0, size, stream));
  ASSERT_PH_OK(ph_memcpy_async(a.get(), pageable.data(), size,
                               PH_MEMCPY_HOST_TO_DEVICE, stream));
  std::memset(pinned.bytes(), 0, size);
  ASSERT_PH_OK(ph_memcpy_async(pinned.bytes(), a.get(), size,
                               PH_MEMCPY_DEVICE_TO_HOST, stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(std::memcmp(pinned.bytes(), source.data(), size), 0)
      << "H2D (pageable), D2H (pinned)";
  std::vector<char> synchronous(size, 0);
  ASSERT_PH_OK(ph_memcpy(synchronous.data(), a.get(), size,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_TRUE(synchronous == source) << "ph_memcpy";
}

// A copy from or to pageable memory returns the stream's error, and copies
// nothing, whether the stream failed before the call or while the copy
// waited behind the failing work.
TEST(MemcpyAsync, PageableCopyOnAFailedStreamCopiesNothing) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  DeviceBuffer device(0, 4096);
  ASSERT_PH_OK(ph_memset_async(device.get(), 5, 4096, stream));
  ASSERT_PH_OK(Launch(stream, "failing_op", [](char* error, size_t n) {
    std::this_thread::sleep_for(milliseconds(20));
    std::snprintf(error, n, "the kernel failed");
    return PH_ERROR_DEVICE;
  }));
  std::vector<char> host(4096, 1);
  EXPECT_EQ(ph_memcpy_async(host.data(), device.get(), 4096,
                            PH_MEMCPY_DEVICE_TO_HOST, stream),
            PH_ERROR_DEVICE) << "waited behind the failing work";
  EXPECT_NE(std::string(ph_last_error_message()).find("failing_op"),
            std::string::npos) << ph_last_error_message();
  EXPECT_EQ(host[0], 1);
  EXPECT_EQ(ph_memcpy_async(host.data(), device.get(), 4096,
                            PH_MEMCPY_DEVICE_TO_HOST, stream),
            PH_ERROR_DEVICE) << "called on the failed stream";
  EXPECT_EQ(host[4095], 1);
  EXPECT_PH_OK(ph_stream_destroy(stream));
}

TEST(MemcpyAsync, CrossDeviceAndValidation) {
  REQUIRE_TWO_DEVICES();
  ScopedStream stream(1);
  DeviceBuffer on0(0, 1024);
  DeviceBuffer on1(1, 1024);
  ASSERT_PH_OK(ph_memset_async(on0.get(), 0x42, 1024, stream));
  ASSERT_PH_OK(ph_memcpy_async(on1.get(), on0.get(), 1024,
                               PH_MEMCPY_DEVICE_TO_DEVICE, stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  char byte = 0;
  ASSERT_PH_OK(ph_memcpy(&byte, on1.bytes() + 1023, 1,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(byte, 0x42);
  std::vector<char> host(16);
  EXPECT_EQ(ph_memcpy_async(host.data(), host.data(), 16,
                            PH_MEMCPY_DEVICE_TO_HOST, stream),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_memset_async(host.data(), 0, 16, stream),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_memset_async(on0.get(), 0, 2048, stream),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_memcpy_async(on1.get(), on0.get(), 16,
                            PH_MEMCPY_DEVICE_TO_DEVICE, nullptr),
            PH_ERROR_INVALID_HANDLE);
}

/* ---- Streams ----------------------------------------------------------- */

TEST(Stream, PriorityIsClampedAndDeviceReported) {
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  ASSERT_PH_OK(ph_device_get_properties(0, &props));
  ph_stream_t high = nullptr;
  ph_stream_t low = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, props.stream_priority_high - 100, &high));
  ASSERT_PH_OK(ph_stream_create(0, props.stream_priority_low + 100, &low));
  int priority = 99;
  ASSERT_PH_OK(ph_stream_get_priority(high, &priority));
  EXPECT_EQ(priority, props.stream_priority_high);
  ASSERT_PH_OK(ph_stream_get_priority(low, &priority));
  EXPECT_EQ(priority, props.stream_priority_low);
  int device = -1;
  ASSERT_PH_OK(ph_stream_get_device(high, &device));
  EXPECT_EQ(device, 0);
  EXPECT_PH_OK(ph_stream_destroy(high));
  EXPECT_PH_OK(ph_stream_destroy(low));

  ph_stream_t bad = reinterpret_cast<ph_stream_t>(1);
  EXPECT_EQ(ph_stream_create(DeviceCount(), 0, &bad), PH_ERROR_INVALID_DEVICE);
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(ph_stream_create(0, 0, nullptr), PH_ERROR_INVALID_ARGUMENT);
}

TEST(Stream, ManyStreamsRunTheirWorkInOrder) {
  constexpr int kStreams = 16;
  constexpr int kTasks = 200;
  std::vector<ph_stream_t> streams(kStreams);
  std::vector<std::vector<int>> seen(kStreams);
  TaskProbe probe;
  for (auto& stream : streams) ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  for (int task = 0; task < kTasks; ++task) {
    for (int s = 0; s < kStreams; ++s) {
      ASSERT_PH_OK(Launch(streams[s], "append", [&seen, s, task](char*, size_t) {
        seen[s].push_back(task);
        return PH_SUCCESS;
      }, &probe));
    }
  }
  for (auto stream : streams) ASSERT_PH_OK(ph_stream_synchronize(stream));
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(seen[s].size(), static_cast<size_t>(kTasks));
    for (int task = 0; task < kTasks; ++task) ASSERT_EQ(seen[s][task], task);
  }
  EXPECT_EQ(probe.runs.load(), kStreams * kTasks);
  EXPECT_EQ(probe.releases.load(), kStreams * kTasks);
  for (auto stream : streams) EXPECT_PH_OK(ph_stream_destroy(stream));
}

TEST(Stream, QueryIsNotReadyUntilTheLastTaskFinishedRunning) {
  ScopedStream stream;
  EXPECT_PH_OK(ph_stream_query(stream));  // empty stream is ready
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  gate.WaitEntered();  // dequeued and running, but not finished
  std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(ph_stream_query(stream), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_PH_OK(ph_stream_query(stream));
}

TEST(Stream, DestroyRunsQueuedWorkAndReleasesEachTaskOnce) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  Gate gate;
  TaskProbe probe;
  ASSERT_PH_OK(gate.Block(stream));
  for (int i = 0; i < 10; ++i) {
    ASSERT_PH_OK(Launch(stream, "queued", nullptr, &probe));
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(milliseconds(20));
    gate.Open();
  });
  EXPECT_PH_OK(ph_stream_destroy(stream));  // waits for the gate
  opener.join();
  EXPECT_EQ(probe.runs.load(), 10);
  EXPECT_EQ(probe.releases.load(), 10);
  EXPECT_EQ(ph_stream_query(stream), PH_ERROR_INVALID_HANDLE);
}

TEST(Stream, ErrorIsStickyNamesTheWorkAndSkipsLaterTasks) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  Gate gate;
  TaskProbe later;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(Launch(stream, "my_failing_op", [](char* error, size_t n) {
    std::snprintf(error, n, "the kernel divided by zero");
    return PH_ERROR_DEVICE;
  }));
  ASSERT_PH_OK(Launch(stream, "after", nullptr, &later));  // queued earlier
  gate.Open();
  EXPECT_EQ(ph_stream_synchronize(stream), PH_ERROR_DEVICE);
  const std::string message = ph_last_error_message();
  EXPECT_NE(message.find("my_failing_op"), std::string::npos) << message;
  EXPECT_NE(message.find("the kernel divided by zero"), std::string::npos);
  EXPECT_EQ(later.runs.load(), 0);
  EXPECT_EQ(later.releases.load(), 1);

  EXPECT_EQ(ph_stream_query(stream), PH_ERROR_DEVICE);
  EXPECT_NE(std::string(ph_last_error_message()).find("my_failing_op"),
            std::string::npos);
  TaskProbe refused;
  EXPECT_EQ(Launch(stream, "refused", nullptr, &refused), PH_ERROR_DEVICE);
  EXPECT_EQ(refused.runs.load(), 0);
  EXPECT_EQ(refused.releases.load(), 1);
  DeviceBuffer device(0, 64);
  EXPECT_EQ(ph_memset_async(device.get(), 0, 64, stream), PH_ERROR_DEVICE);
  EXPECT_EQ(ph_stream_synchronize(stream), PH_ERROR_DEVICE);
  EXPECT_PH_OK(ph_stream_destroy(stream));  // the sticky error is discarded
}

TEST(Stream, StickyErrorKeepsTheTasksStatus) {
  ScopedStream stream;
  ASSERT_PH_OK(Launch(stream, "oom_in_work", [](char* error, size_t n) {
    std::snprintf(error, n, "scratch allocation failed");
    return PH_ERROR_OUT_OF_MEMORY;
  }));
  EXPECT_EQ(ph_stream_synchronize(stream), PH_ERROR_OUT_OF_MEMORY);
}

TEST(Stream, LaunchValidatesTheTaskAndReleasesOnError) {
  ScopedStream stream;
  EXPECT_EQ(ph_launch_host_func(stream, nullptr), PH_ERROR_INVALID_ARGUMENT);
  TaskProbe probe;
  ph_host_task_t no_run = {"no_run", nullptr, ReleaseClosure,
                           new Closure{nullptr, &probe}};
  EXPECT_EQ(ph_launch_host_func(stream, &no_run), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(probe.releases.load(), 1);
  EXPECT_EQ(Launch(nullptr, "no_stream", nullptr, &probe),
            PH_ERROR_INVALID_HANDLE);
  EXPECT_EQ(probe.releases.load(), 2);
  EXPECT_EQ(probe.runs.load(), 0);
  // A task without release is fine.
  static std::atomic<int> bare_runs{0};
  bare_runs = 0;
  ph_host_task_t bare = {"bare",
                         [](void*, char*, size_t) {
                           bare_runs++;
                           return PH_SUCCESS;
                         },
                         nullptr, nullptr};
  ASSERT_PH_OK(ph_launch_host_func(stream, &bare));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(bare_runs.load(), 1);
}

// Several host threads launching onto one stream: every task runs once,
// and each thread's tasks run in the order it launched them. The worker is
// held at first, so the queue grows past what a driver keeps in its fast
// path (the fake's ring: 1,024 tasks).
TEST(Stream, ConcurrentLaunchersKeepTheirOrderAndLoseNoTask) {
  constexpr int kThreads = 4;
  constexpr int kTasksEach = 1500;
  ScopedStream stream;
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  TaskProbe probe;
  std::vector<std::pair<int, int>> ran;  // appended by the stream's work
  ran.reserve(kThreads * kTasksEach);
  std::vector<std::thread> launchers;
  for (int t = 0; t < kThreads; ++t) {
    launchers.emplace_back([&, t] {
      for (int i = 0; i < kTasksEach; ++i) {
        EXPECT_PH_OK(Launch(stream, "append", [&ran, t, i](char*, size_t) {
          ran.emplace_back(t, i);
          return PH_SUCCESS;
        }, &probe));
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(20));
  gate.Open();
  for (auto& launcher : launchers) launcher.join();
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_EQ(ran.size(), static_cast<size_t>(kThreads * kTasksEach));
  std::vector<int> next(kThreads, 0);
  for (const auto& [thread, index] : ran) {
    ASSERT_EQ(index, next[thread]) << "thread " << thread << "'s tasks reordered";
    ++next[thread];
  }
  EXPECT_EQ(probe.runs.load(), kThreads * kTasksEach);
  EXPECT_EQ(probe.releases.load(), kThreads * kTasksEach);
}

// Destroying a stream while another thread launches onto it: a launch
// either succeeds (and its task runs) or is refused (and its task is
// released); none is lost or run twice.
TEST(Stream, DestroyWhileAnotherThreadLaunchesLosesNoTask) {
  for (int round = 0; round < 20; ++round) {
    ph_stream_t stream = nullptr;
    ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
    TaskProbe probe;
    std::atomic<int> accepted{0};
    std::atomic<int> attempts{0};
    std::atomic<bool> started{false};
    std::thread launcher([&] {
      for (;;) {
        attempts++;
        const ph_status_t status = Launch(stream, "late", nullptr, &probe);
        started = true;
        if (status != PH_SUCCESS) {
          EXPECT_EQ(status, PH_ERROR_INVALID_HANDLE) << ph_last_error_message();
          return;
        }
        accepted++;
      }
    });
    while (!started) std::this_thread::yield();
    EXPECT_PH_OK(ph_stream_destroy(stream));
    launcher.join();
    EXPECT_EQ(probe.runs.load(), accepted.load());
    EXPECT_EQ(probe.releases.load(), attempts.load());
  }
}

TEST(Stream, WaitingForItselfIsRefused) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  ph_status_t sync = PH_SUCCESS;
  ph_status_t destroy = PH_SUCCESS;
  ph_status_t device_sync = PH_SUCCESS;
  ASSERT_PH_OK(Launch(stream, "self_sync", [&](char*, size_t) {
    sync = ph_stream_synchronize(stream);
    destroy = ph_stream_destroy(stream);
    device_sync = ph_device_synchronize(0);
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(sync, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(destroy, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(device_sync, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_PH_OK(ph_stream_query(stream)) << "the refusals are not sticky";
  EXPECT_PH_OK(ph_stream_destroy(stream));
}

TEST(RunHostFunc, RunsAfterEarlierWorkAndReturnsOnlyWhenDone) {
  ScopedStream stream;
  Gate gate;
  std::atomic<bool> earlier_done{false};
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(Launch(stream, "earlier", [&](char*, size_t) {
    earlier_done = true;
    return PH_SUCCESS;
  }));
  std::thread opener([&] {
    gate.WaitEntered();
    std::this_thread::sleep_for(milliseconds(20));
    gate.Open();
  });
  bool saw_earlier = false;
  bool ran = false;
  TaskProbe probe;
  EXPECT_PH_OK(RunNow(stream, "now", [&](char*, size_t) {
    saw_earlier = earlier_done.load();
    ran = true;
    return PH_SUCCESS;
  }, &probe));
  opener.join();
  EXPECT_TRUE(ran) << "returned before the task ran";
  EXPECT_TRUE(saw_earlier) << "ran before work queued ahead of it";
  EXPECT_EQ(probe.runs.load(), 1);
  EXPECT_EQ(probe.releases.load(), 1);
  EXPECT_PH_OK(ph_stream_query(stream)) << "the stream is idle afterwards";
}

TEST(RunHostFunc, OnAnIdleStreamLaterWorkWaitsBehindIt) {
  ScopedStream stream;
  std::atomic<bool> first_done{false};
  std::atomic<bool> later_saw_first{false};
  std::atomic<int> query_while_running{PH_SUCCESS};
  EXPECT_PH_OK(RunNow(stream, "first", [&](char*, size_t) {
    // Another thread queues work and queries while this task runs.
    std::thread other([&] {
      EXPECT_PH_OK(Launch(stream, "later", [&](char*, size_t) {
        later_saw_first = first_done.load();
        return PH_SUCCESS;
      }));
      query_while_running = ph_stream_query(stream);
    });
    other.join();
    std::this_thread::sleep_for(milliseconds(10));
    first_done = true;
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_TRUE(later_saw_first.load()) << "later work overtook the task";
  EXPECT_EQ(query_while_running.load(), PH_NOT_READY);
}

TEST(RunHostFunc, AFailingTaskIsReturnedAndStickyLikeLaunchedWork) {
  ScopedStream stream;
  TaskProbe probe;
  EXPECT_EQ(RunNow(stream, "my_failing_op", [](char* error, size_t n) {
    std::snprintf(error, n, "bad input");
    return PH_ERROR_DEVICE;
  }, &probe), PH_ERROR_DEVICE);
  const std::string message = ph_last_error_message();
  EXPECT_NE(message.find("my_failing_op"), std::string::npos) << message;
  EXPECT_NE(message.find("bad input"), std::string::npos) << message;
  EXPECT_EQ(probe.releases.load(), 1);
  EXPECT_EQ(ph_stream_query(stream), PH_ERROR_DEVICE);
  TaskProbe refused;
  EXPECT_EQ(RunNow(stream, "refused", nullptr, &refused), PH_ERROR_DEVICE);
  EXPECT_EQ(refused.runs.load(), 0);
  EXPECT_EQ(refused.releases.load(), 1);
}

TEST(RunHostFunc, ATaskSkippedForAnEarlierFailureReportsThatFailure) {
  ScopedStream stream;
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(Launch(stream, "earlier_failure", [](char*, size_t) {
    return PH_ERROR_DEVICE;
  }));
  std::thread opener([&] {
    gate.WaitEntered();
    gate.Open();
  });
  TaskProbe probe;
  EXPECT_EQ(RunNow(stream, "skipped", nullptr, &probe), PH_ERROR_DEVICE);
  opener.join();
  EXPECT_NE(std::string(ph_last_error_message()).find("earlier_failure"),
            std::string::npos);
  EXPECT_EQ(probe.runs.load(), 0);
  EXPECT_EQ(probe.releases.load(), 1);
}

TEST(RunHostFunc, ValidatesTheTaskAndRefusesToWaitForItself) {
  ScopedStream stream;
  EXPECT_EQ(ph_run_host_func(stream, nullptr), PH_ERROR_INVALID_ARGUMENT);
  TaskProbe probe;
  ph_host_task_t no_run = {"no_run", nullptr, ReleaseClosure,
                           new Closure{nullptr, &probe}};
  EXPECT_EQ(ph_run_host_func(stream, &no_run), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(RunNow(nullptr, "no_stream", nullptr, &probe),
            PH_ERROR_INVALID_HANDLE);
  EXPECT_EQ(probe.releases.load(), 2);
  ph_status_t nested = PH_SUCCESS;
  TaskProbe inner;
  ASSERT_PH_OK(Launch(stream, "outer", [&](char*, size_t) {
    nested = RunNow(stream, "inner", nullptr, &inner);
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(nested, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(inner.runs.load(), 0);
  EXPECT_EQ(inner.releases.load(), 1);
  EXPECT_PH_OK(ph_stream_query(stream)) << "the refusal is not sticky";
}

TEST(RunHostFunc, TheTaskMayReachDeviceMemoryAsLaunchedWorkDoes) {
  ScopedStream stream;
  DeviceBuffer device(0, 256);
  ASSERT_PH_OK(ph_memset_async(device.get(), 7, 256, stream));
  unsigned char seen = 0;
  bool no_kernel_view = false;
  EXPECT_PH_OK(RunNow(stream, "read", [&](char*, size_t) {
    void* view = nullptr;
    const ph_status_t status = ph_kernel_address(device.get(), &view);
    if (status == PH_ERROR_UNIMPLEMENTED) {
      no_kernel_view = true;
      return PH_SUCCESS;
    }
    if (status != PH_SUCCESS) return status;
    seen = static_cast<unsigned char*>(view)[255];
    return PH_SUCCESS;
  }));
  if (no_kernel_view) {
    GTEST_SKIP() << "driver has no kernel view (ph_kernel_address is "
                    "OPTIONAL): host work cannot reach device memory";
  }
  EXPECT_EQ(seen, 7);
}

TEST(Stream, InvalidHandlesAreRefused) {
  ph_stream_t destroyed = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &destroyed));
  ASSERT_PH_OK(ph_stream_destroy(destroyed));
  ph_event_t event = nullptr;
  ASSERT_PH_OK(ph_event_create(0, &event));
  const ph_stream_t bad_streams[] = {
      nullptr, destroyed, reinterpret_cast<ph_stream_t>(event),
      reinterpret_cast<ph_stream_t>(uintptr_t{0xdeadbeef})};
  for (ph_stream_t bad : bad_streams) {
    int out = 5;
    EXPECT_EQ(ph_stream_destroy(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_query(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_synchronize(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_get_device(bad, &out), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_get_priority(bad, &out), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(out, 0);
    EXPECT_EQ(ph_stream_wait_event(bad, event), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_record(event, bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_memset_async(nullptr, 0, 0, bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(Launch(bad, "x", nullptr), PH_ERROR_INVALID_HANDLE);
  }
  ASSERT_PH_OK(ph_event_destroy(event));
}

/* ---- Kernel addresses -------------------------------------------------- */

TEST(KernelAddress, OnlyInsideWorkAndOnlyForDeviceMemory) {
  DeviceBuffer device(0, 4096);
  void* out = reinterpret_cast<void*>(1);
  const ph_status_t outside = ph_kernel_address(device.get(), &out);
  if (outside == PH_ERROR_UNIMPLEMENTED) {
    GTEST_SKIP() << "driver has no kernel view (OPTIONAL entry point)";
  }
  EXPECT_EQ(outside, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  ScopedStream stream;
  ph_status_t on_host = PH_SUCCESS;
  ph_status_t on_device = PH_ERROR_DEVICE;
  int host = 0;
  ASSERT_PH_OK(Launch(stream, "kernel", [&](char* error, size_t n) {
    void* view = nullptr;
    on_host = ph_kernel_address(&host, &view);
    on_device = ph_kernel_address(device.bytes() + 100, &view);
    if (on_device != PH_SUCCESS) {
      std::snprintf(error, n, "%s", ph_last_error_message());
      return on_device;
    }
    std::memset(view, 0x5c, 16);  // writes land in device memory
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(on_host, PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(on_device, PH_SUCCESS);
  char bytes[18] = {};
  ASSERT_PH_OK(ph_memcpy(bytes, device.bytes() + 99, 18,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_NE(bytes[0], 0x5c);
  EXPECT_EQ(bytes[1], 0x5c);
  EXPECT_EQ(bytes[16], 0x5c);
  EXPECT_EQ(ph_kernel_address(device.get(), nullptr),
            PH_ERROR_INVALID_ARGUMENT);
}

/* ---- Events ------------------------------------------------------------ */

TEST(Event, WaitOrdersWorkAcrossStreams) {
  ScopedStream a(0);
  ScopedStream b(DeviceCount() > 1 ? 1 : 0);  // cross-device when possible
  ScopedEvent event;
  Gate gate;
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(ph_event_record(event, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, event));
  std::atomic<bool> ran{false};
  ASSERT_PH_OK(Launch(b, "after_wait", [&](char*, size_t) {
    ran = true;
    return PH_SUCCESS;
  }));
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(ran.load()) << "B ran before the event on A was reached";
  EXPECT_EQ(ph_stream_query(b), PH_NOT_READY);
  EXPECT_EQ(ph_event_query(event), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_stream_synchronize(b));
  EXPECT_TRUE(ran.load());
  EXPECT_PH_OK(ph_event_query(event));
}

TEST(Event, WaitObservesTheRecordAtTheTimeOfTheCall) {
  ScopedStream a;
  ScopedStream b;
  ScopedEvent event;
  ASSERT_PH_OK(ph_event_record(event, a));
  ASSERT_PH_OK(ph_event_synchronize(event));
  ASSERT_PH_OK(ph_stream_wait_event(b, event));  // refers to the reached record
  Gate gate;
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(ph_event_record(event, a));  // re-record: pending
  std::atomic<bool> ran{false};
  ASSERT_PH_OK(Launch(b, "after_wait", [&](char*, size_t) {
    ran = true;
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_stream_synchronize(b));  // would hang if the wait re-read
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(ph_event_query(event), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_event_synchronize(event));
}

TEST(Event, NeverRecordedImposesNoWait) {
  ScopedStream stream;
  ScopedEvent event;
  EXPECT_PH_OK(ph_event_query(event));
  EXPECT_PH_OK(ph_event_synchronize(event));
  EXPECT_PH_OK(ph_stream_wait_event(stream, event));
  EXPECT_PH_OK(ph_stream_synchronize(stream));
  float ms = 1.0f;
  EXPECT_EQ(ph_event_elapsed_time(event, event, &ms),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ms, 0.0f);
}

TEST(Event, ElapsedTimeMeasuresBetweenReachedRecords) {
  ScopedStream stream;
  ScopedEvent start;
  ScopedEvent end;
  ASSERT_PH_OK(ph_event_record(start, stream));
  ASSERT_PH_OK(Launch(stream, "sleep", [](char*, size_t) {
    std::this_thread::sleep_for(milliseconds(20));
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_event_record(end, stream));
  ASSERT_PH_OK(ph_event_synchronize(end));
  float ms = 0.0f;
  ASSERT_PH_OK(ph_event_elapsed_time(start, end, &ms));
  EXPECT_GE(ms, 15.0f);
  EXPECT_LT(ms, 5000.0f);

  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(ph_event_record(end, stream));
  EXPECT_EQ(ph_event_elapsed_time(start, end, &ms), PH_NOT_READY);
  gate.Open();
  ASSERT_PH_OK(ph_event_synchronize(end));
  EXPECT_PH_OK(ph_event_elapsed_time(start, end, &ms));

  ScopedEvent untimed(PH_EVENT_DISABLE_TIMING);
  ASSERT_PH_OK(ph_event_record(untimed, stream));
  ASSERT_PH_OK(ph_event_synchronize(untimed));
  EXPECT_EQ(ph_event_elapsed_time(start, untimed, &ms),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_event_elapsed_time(start, end, nullptr),
            PH_ERROR_INVALID_ARGUMENT);
}

TEST(Event, DestroyWithQueuedWaitsIsSafe) {
  ScopedStream a;
  ScopedStream b;
  ph_event_t event = nullptr;
  ASSERT_PH_OK(ph_event_create(0, &event));
  Gate gate;
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(ph_event_record(event, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, event));
  std::atomic<bool> ran{false};
  ASSERT_PH_OK(Launch(b, "after_wait", [&](char*, size_t) {
    ran = true;
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_event_destroy(event));
  std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(ran.load()) << "destroying the event must not release the wait";
  gate.Open();
  ASSERT_PH_OK(ph_stream_synchronize(b));
  EXPECT_TRUE(ran.load());
}

TEST(Event, SynchronizeAndQueryReportTheFailureBeforeTheRecord) {
  ScopedStream stream;
  ScopedEvent event;
  ASSERT_PH_OK(Launch(stream, "fails_before_record", [](char* error, size_t n) {
    std::snprintf(error, n, "bad");
    return PH_ERROR_DEVICE;
  }));
  ASSERT_PH_OK(ph_event_record(event, stream));
  EXPECT_EQ(ph_event_synchronize(event), PH_ERROR_DEVICE);  // and no hang
  EXPECT_NE(std::string(ph_last_error_message()).find("fails_before_record"),
            std::string::npos);
  EXPECT_EQ(ph_event_query(event), PH_ERROR_DEVICE) << "reached, but failed";
  EXPECT_NE(std::string(ph_last_error_message()).find("fails_before_record"),
            std::string::npos);
}

TEST(Event, InvalidHandlesAndFlagsAreRefused) {
  ph_event_t destroyed = nullptr;
  ASSERT_PH_OK(ph_event_create(0, &destroyed));
  ASSERT_PH_OK(ph_event_destroy(destroyed));
  ScopedStream stream;
  ScopedEvent good;
  const ph_event_t bad_events[] = {
      nullptr, destroyed, reinterpret_cast<ph_event_t>(stream.get()),
      reinterpret_cast<ph_event_t>(uintptr_t{0x12345})};
  for (ph_event_t bad : bad_events) {
    float ms = 1.0f;
    EXPECT_EQ(ph_event_destroy(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_record(bad, stream), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_query(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_synchronize(bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_stream_wait_event(stream, bad), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_elapsed_time(bad, good, &ms), PH_ERROR_INVALID_HANDLE);
    EXPECT_EQ(ph_event_elapsed_time(good, bad, &ms), PH_ERROR_INVALID_HANDLE);
  }
  ph_event_t event = reinterpret_cast<ph_event_t>(1);
  EXPECT_EQ(ph_event_create(0x80, &event), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(event, nullptr);
  EXPECT_EQ(ph_event_create(0, nullptr), PH_ERROR_INVALID_ARGUMENT);
}

/* ---- The error model: a failure reaches what depends on it ------------ */

// Queues a task that fails with `status`, naming itself `name` and saying
// `sentence`.
ph_status_t LaunchFailure(ph_stream_t stream, const char* name,
                          const char* sentence,
                          ph_status_t status = PH_ERROR_DEVICE) {
  return Launch(stream, name, [sentence, status](char* error, size_t n) {
    std::snprintf(error, n, "%s", sentence);
    return status;
  });
}

// How often `needle` occurs in `text`.
size_t Occurrences(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// The message of the last failing call holds the original failure: the
// failed work's name and its own sentence, once each.
#define EXPECT_ORIGINAL_FAILURE(name, sentence)                              \
  do {                                                                       \
    const std::string message_ = ph_last_error_message();                    \
    EXPECT_EQ(Occurrences(message_, name), 1u) << message_;                  \
    EXPECT_EQ(Occurrences(message_, sentence), 1u) << message_;              \
  } while (0)

TEST(ErrorModel, AnEventRecordedAfterAFailureCarriesItUntilRecordedAgain) {
  ph_stream_t failing = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &failing));
  ScopedEvent event;
  ASSERT_PH_OK(LaunchFailure(failing, "op_that_failed", "index 7 is out"));
  ASSERT_PH_OK(ph_event_record(event, failing));
  EXPECT_EQ(ph_event_synchronize(event), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("op_that_failed", "index 7 is out");
  EXPECT_EQ(ph_event_query(event), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("op_that_failed", "index 7 is out");
  // Reporting the stream's error and destroying the stream does not make
  // the work before the record good.
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_DEVICE);
  ASSERT_PH_OK(ph_stream_destroy(failing));
  EXPECT_EQ(ph_event_query(event), PH_ERROR_DEVICE);
  EXPECT_EQ(ph_event_synchronize(event), PH_ERROR_DEVICE);
  ScopedStream waiter;
  ASSERT_PH_OK(ph_stream_wait_event(waiter, event));
  EXPECT_EQ(ph_stream_synchronize(waiter), PH_ERROR_DEVICE);
  // A record on a fresh stream marks a point after good work.
  ScopedStream fresh;
  ASSERT_PH_OK(ph_event_record(event, fresh));
  EXPECT_PH_OK(ph_event_synchronize(event));
  EXPECT_PH_OK(ph_event_query(event));
}

TEST(ErrorModel, ARecordBeforeTheFailureCarriesNothing) {
  ScopedStream failing;
  ScopedEvent before;
  ScopedEvent after;
  Gate gate;
  ASSERT_PH_OK(gate.Block(failing));
  ASSERT_PH_OK(ph_event_record(before, failing));
  ASSERT_PH_OK(LaunchFailure(failing, "late_failure", "went wrong"));
  ASSERT_PH_OK(ph_event_record(after, failing));
  ScopedStream waiter;
  TaskProbe ran;
  ASSERT_PH_OK(ph_stream_wait_event(waiter, before));
  ASSERT_PH_OK(Launch(waiter, "depends_on_good_work", nullptr, &ran));
  gate.Open();
  EXPECT_EQ(ph_event_synchronize(after), PH_ERROR_DEVICE);
  EXPECT_PH_OK(ph_event_synchronize(before)) << "the failure came after it";
  EXPECT_PH_OK(ph_event_query(before));
  EXPECT_PH_OK(ph_stream_synchronize(waiter));
  EXPECT_EQ(ran.runs.load(), 1);
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_DEVICE);
}

// The waiting stream fails at the wait's place in its queue, with the
// original status and message, said to be inherited.
TEST(ErrorModel, AWaitOnAFailedRecordFailsTheWorkAfterItOnly) {
  ScopedStream failing;
  ScopedStream waiter;
  ScopedEvent event;
  ScopedEvent waiter_done;
  Gate gate;
  ASSERT_PH_OK(gate.Block(failing));
  ASSERT_PH_OK(LaunchFailure(failing, "scratch_op", "no scratch memory",
                             PH_ERROR_OUT_OF_MEMORY));
  ASSERT_PH_OK(ph_event_record(event, failing));
  TaskProbe before_wait;
  TaskProbe after_wait;
  ASSERT_PH_OK(Launch(waiter, "before_the_wait", nullptr, &before_wait));
  ASSERT_PH_OK(ph_stream_wait_event(waiter, event));
  ASSERT_PH_OK(Launch(waiter, "after_the_wait", nullptr, &after_wait));
  DeviceBuffer device(0, 256);
  ASSERT_PH_OK(ph_memset_async(device.get(), 9, 256, waiter));
  ASSERT_PH_OK(ph_event_record(waiter_done, waiter));
  gate.Open();
  EXPECT_EQ(ph_stream_synchronize(waiter), PH_ERROR_OUT_OF_MEMORY);
  const std::string message = ph_last_error_message();
  EXPECT_ORIGINAL_FAILURE("scratch_op", "no scratch memory");
  EXPECT_NE(message.find("inherit"), std::string::npos) << message;
  EXPECT_EQ(before_wait.runs.load(), 1);
  EXPECT_EQ(after_wait.runs.load(), 0);
  EXPECT_EQ(after_wait.releases.load(), 1);
  // Sticky like a failure of its own: query, launches, records.
  EXPECT_EQ(ph_stream_query(waiter), PH_ERROR_OUT_OF_MEMORY);
  TaskProbe refused;
  EXPECT_EQ(Launch(waiter, "refused", nullptr, &refused),
            PH_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(refused.releases.load(), 1);
  EXPECT_EQ(ph_event_synchronize(waiter_done), PH_ERROR_OUT_OF_MEMORY);
  EXPECT_ORIGINAL_FAILURE("scratch_op", "no scratch memory");
  char byte = 0;
  ASSERT_PH_OK(ph_memcpy(&byte, device.get(), 1, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_NE(byte, 9) << "the fill after the wait ran";
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_OUT_OF_MEMORY);
}

// A -> B -> C, across two devices when there are two: C's copies after its
// wait copy nothing and report A's failure, told once.
TEST(ErrorModel, AFailureTravelsAlongAChainOfStreamsAndDevices) {
  const int other = DeviceCount() > 1 ? 1 : 0;
  ScopedStream a(0);
  ScopedStream b(other);
  ScopedStream c(0);
  ScopedEvent after_a;
  ScopedEvent after_b;
  Gate gate;
  DeviceBuffer source(other, 4096);
  DeviceBuffer target(0, 4096);
  ASSERT_PH_OK(ph_memset_async(source.get(), 1, 4096, b));
  ASSERT_PH_OK(ph_memset_async(target.get(), 2, 4096, c));
  ASSERT_PH_OK(ph_stream_synchronize(b));
  ASSERT_PH_OK(ph_stream_synchronize(c));
  ASSERT_PH_OK(gate.Block(a));
  ASSERT_PH_OK(LaunchFailure(a, "first_op", "the first op failed"));
  ASSERT_PH_OK(ph_event_record(after_a, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, after_a));
  ASSERT_PH_OK(ph_memset_async(source.get(), 3, 4096, b));
  ASSERT_PH_OK(ph_event_record(after_b, b));
  ASSERT_PH_OK(ph_stream_wait_event(c, after_b));
  // A copy across devices on C, then one to pageable memory, which blocks.
  ASSERT_PH_OK(ph_memcpy_async(target.get(), source.get(), 4096,
                               PH_MEMCPY_DEVICE_TO_DEVICE, c));
  gate.Open();
  std::vector<char> host(4096, 4);
  EXPECT_EQ(ph_memcpy_async(host.data(), target.get(), 4096,
                            PH_MEMCPY_DEVICE_TO_HOST, c),
            PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("first_op", "the first op failed");
  EXPECT_EQ(host[0], 4);
  EXPECT_EQ(ph_stream_synchronize(c), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("first_op", "the first op failed");
  EXPECT_EQ(ph_stream_synchronize(b), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("first_op", "the first op failed");
  char byte = 0;
  ASSERT_PH_OK(ph_memcpy(&byte, target.get(), 1, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(byte, 2) << "the cross-device copy after the wait ran";
  ASSERT_PH_OK(ph_memcpy(&byte, source.get(), 1, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(byte, 1) << "the fill after B's wait ran";
}

TEST(ErrorModel, DeviceSynchronizeReportsAnInheritedFailure) {
  REQUIRE_TWO_DEVICES();
  ph_stream_t failing = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &failing));
  ScopedStream waiter(1);
  ScopedEvent event;
  ASSERT_PH_OK(LaunchFailure(failing, "device0_op", "bad index"));
  ASSERT_PH_OK(ph_event_record(event, failing));
  ASSERT_PH_OK(ph_stream_wait_event(waiter, event));
  EXPECT_EQ(ph_device_synchronize(1), PH_ERROR_DEVICE);
  EXPECT_ORIGINAL_FAILURE("device0_op", "bad index");
  // Reported on device 0 too, until that stream is gone.
  EXPECT_EQ(ph_device_synchronize(0), PH_ERROR_DEVICE);
  ASSERT_PH_OK(ph_stream_destroy(failing));
  EXPECT_PH_OK(ph_device_synchronize(0));
}

// Work that depends on nothing that failed succeeds, and a stream created
// after a failure, or one that replaced the failed stream, works.
TEST(ErrorModel, IndependentAndLaterWorkIsUnaffected) {
  ph_stream_t failing = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &failing));
  ScopedStream healthy;
  ScopedStream waiter;
  ScopedEvent good;
  ASSERT_PH_OK(LaunchFailure(failing, "bad_op", "it failed"));
  TaskProbe independent;
  ASSERT_PH_OK(Launch(healthy, "independent", nullptr, &independent));
  ASSERT_PH_OK(ph_event_record(good, healthy));
  ASSERT_PH_OK(ph_stream_wait_event(waiter, good));
  TaskProbe after_good;
  ASSERT_PH_OK(Launch(waiter, "after_good", nullptr, &after_good));
  EXPECT_PH_OK(ph_stream_synchronize(waiter));
  EXPECT_PH_OK(ph_stream_synchronize(healthy));
  EXPECT_PH_OK(ph_event_query(good));
  EXPECT_EQ(independent.runs.load(), 1);
  EXPECT_EQ(after_good.runs.load(), 1);
  EXPECT_EQ(ph_stream_synchronize(failing), PH_ERROR_DEVICE);
  ASSERT_PH_OK(ph_stream_destroy(failing));
  ScopedStream replacement;
  TaskProbe later;
  ASSERT_PH_OK(Launch(replacement, "later", nullptr, &later));
  EXPECT_PH_OK(ph_stream_synchronize(replacement));
  EXPECT_EQ(later.runs.load(), 1);
  EXPECT_PH_OK(ph_device_synchronize(0));
}

/* ---- Start-up failure -------------------------------------------------- */

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

int main(int argc, char** argv) {
  // Small devices keep out-of-memory tests fast. The environment wins, so a
  // death-test child inherits the configuration its test arranged.
  setenv("PHANTOM_DEVICE_COUNT", "2", 0);
  setenv("PHANTOM_DEVICE_MEMORY", "64MiB", 0);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
