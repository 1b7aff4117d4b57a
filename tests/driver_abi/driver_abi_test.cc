// The driver table as the runtime uses it (phantom/hal.h, "The driver
// table"; device/runtime/DriverLoader.cpp, HalDispatch.cpp), torch-free:
// the loader and the dispatch are linked in without the rest of the
// runtime.
//
//   Loader.*, LoaderRefuses.*  load each test driver (wrapper_driver.cc)
//                              side by side and check what the loader
//                              accepts and the sentence it refuses with
//   HostWork.*                 ph_run_host_func through the dispatch, run
//                              by ctest once per driver (PHANTOM_DRIVER):
//                              the fake's own call, a table without it (an
//                              older minor) and one answering UNIMPLEMENTED
//                              must behave the same, the last two through
//                              the launch-then-wait fallback
//   OlderMinor.*               the other OPTIONAL calls of a table too short
//                              to hold them answer PH_ERROR_UNIMPLEMENTED
//   NoDriver.*                 with a driver that was refused, every call
//                              fails with the loader's sentence
//
// The flags --host-func=native|absent|unimplemented and
// --expect-error=<text> say what the driver of this run is (CMakeLists).
#include <phantom/DriverLoader.h>
#include <phantom/hal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using phantom::driver::activeDriver;
using phantom::driver::defaultDriverName;
using phantom::driver::loadDriver;
using phantom::driver::LoadedDriver;

std::string g_host_func = "native";
std::string g_expect_error;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

#define ASSERT_PH_OK(call)                                        \
  do {                                                            \
    const ph_status_t status_ = (call);                           \
    ASSERT_EQ(status_, PH_SUCCESS) << #call << ": "               \
                                   << ph_last_error_message();    \
  } while (0)

/* ---- Loading ------------------------------------------------------------ */

TEST(Loader, TheBuildsDriverLoadsByDefault) {
  const LoadedDriver driver = loadDriver(defaultDriverName());
  ASSERT_TRUE(driver.ok()) << driver.error;
  EXPECT_EQ(driver.table.abi_version, static_cast<uint32_t>(PH_HAL_ABI_VERSION));
  EXPECT_EQ(driver.table.struct_size, sizeof(ph_driver_table_t));
  EXPECT_EQ(driver.library.front(), '/') << driver.library;
  EXPECT_TRUE(Contains(driver.library, defaultDriverName())) << driver.library;
  EXPECT_NE(driver.table.run_host_func, nullptr);
}

TEST(Loader, AnOlderMinorLoadsWithItsLaterCallsAbsent) {
  const LoadedDriver driver = loadDriver(OLDER_MINOR_DRIVER);
  ASSERT_TRUE(driver.ok()) << driver.error;
  EXPECT_EQ(driver.table.abi_version, 1000u);
  EXPECT_EQ(driver.table.struct_size,
            offsetof(ph_driver_table_t, run_host_func));
  EXPECT_NE(driver.table.launch_host_func, nullptr);
  EXPECT_NE(driver.table.event_elapsed_time, nullptr);
  EXPECT_EQ(driver.table.run_host_func, nullptr);
  EXPECT_EQ(driver.table.device_get_telemetry, nullptr);
  EXPECT_EQ(driver.table.ipc_open_event_handle, nullptr);
}

TEST(LoaderRefuses, AMissingFileNamingItAndTheSetting) {
  const LoadedDriver driver = loadDriver("/no/such/folder/libmy_driver.so");
  ASSERT_FALSE(driver.ok());
  EXPECT_TRUE(Contains(driver.error,
                       "cannot load the phantom driver "
                       "'/no/such/folder/libmy_driver.so'"))
      << driver.error;
  EXPECT_TRUE(Contains(driver.error, "set PHANTOM_DRIVER to")) << driver.error;
  EXPECT_TRUE(Contains(driver.error, defaultDriverName())) << driver.error;
}

TEST(LoaderRefuses, AnotherMajorSayingBothVersions) {
  const LoadedDriver driver = loadDriver(OTHER_MAJOR_DRIVER);
  ASSERT_FALSE(driver.ok());
  EXPECT_TRUE(Contains(driver.error, OTHER_MAJOR_DRIVER)) << driver.error;
  EXPECT_TRUE(Contains(driver.error, "implements HAL ABI 2003 (major 2"))
      << driver.error;
  EXPECT_TRUE(Contains(driver.error, "this runtime needs major 1"))
      << driver.error;
  EXPECT_TRUE(Contains(driver.error, "rebuild the driver")) << driver.error;
}

TEST(LoaderRefuses, ANullRequiredCallNamingEachOne) {
  const LoadedDriver driver = loadDriver(NULL_REQUIRED_DRIVER);
  ASSERT_FALSE(driver.ok());
  EXPECT_TRUE(Contains(driver.error, NULL_REQUIRED_DRIVER)) << driver.error;
  EXPECT_TRUE(Contains(driver.error,
                       "leaves required calls out of its table: ph_memcpy, "
                       "ph_event_query;"))
      << driver.error;
  EXPECT_TRUE(Contains(driver.error, "OPTIONAL")) << driver.error;
}

TEST(LoaderRefuses, ALibraryWithoutTheEntryPoint) {
  const LoadedDriver driver = loadDriver(NOT_A_DRIVER);
  ASSERT_FALSE(driver.ok());
  EXPECT_TRUE(Contains(driver.error, "is not a phantom driver: it does not "
                                     "export ph_driver_get_table"))
      << driver.error;
}

TEST(LoaderRefuses, ADriverThatRefusesTheRuntimesVersion) {
  const LoadedDriver driver = loadDriver(REFUSES_DRIVER);
  ASSERT_FALSE(driver.ok());
  EXPECT_TRUE(Contains(driver.error, "refused this runtime's HAL ABI " + std::to_string(PH_HAL_ABI_VERSION)))
      << driver.error;
}

/* ---- ph_run_host_func, native or by fallback ---------------------------- */

// A task that appends `value` to `order` (after `delay`), and counts its
// runs and releases.
struct Probe {
  std::mutex* mutex;
  std::vector<int>* order;
  int value;
  std::chrono::milliseconds delay{0};
  ph_status_t result = PH_SUCCESS;
  std::atomic<int> runs{0};
  std::atomic<int> releases{0};

  static ph_status_t Run(void* user, char* error, size_t error_size) {
    auto* probe = static_cast<Probe*>(user);
    std::this_thread::sleep_for(probe->delay);
    {
      std::lock_guard<std::mutex> lock(*probe->mutex);
      probe->order->push_back(probe->value);
    }
    probe->runs++;
    if (probe->result != PH_SUCCESS) {
      std::snprintf(error, error_size, "probe %d failed on purpose",
                    probe->value);
    }
    return probe->result;
  }
  static void Release(void* user) { static_cast<Probe*>(user)->releases++; }

  ph_host_task_t Task() { return {"probe", &Run, &Release, this}; }
};

class HostWork : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_PH_OK(ph_stream_create(0, 0, &stream_)); }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(ph_stream_destroy(stream_), PH_SUCCESS);
    }
  }
  ph_stream_t stream_ = nullptr;
  std::mutex mutex_;
  std::vector<int> order_;
};

TEST_F(HostWork, TheDriverOfThisRunIsTheOneExpected) {
  const LoadedDriver& driver = activeDriver();
  ASSERT_TRUE(driver.ok()) << driver.error;
  if (g_host_func == "absent") {
    EXPECT_EQ(driver.table.run_host_func, nullptr);
  } else {
    ASSERT_NE(driver.table.run_host_func, nullptr);
    // Straight to the driver, past the dispatch.
    Probe probe{&mutex_, &order_, 1};
    const ph_host_task_t task = probe.Task();
    const ph_status_t status = driver.table.run_host_func(stream_, &task);
    EXPECT_EQ(status, g_host_func == "unimplemented" ? PH_ERROR_UNIMPLEMENTED
                                                     : PH_SUCCESS);
    EXPECT_EQ(probe.releases.load(), 1);
    ASSERT_PH_OK(ph_stream_synchronize(stream_));
  }
}

TEST_F(HostWork, RunsAfterTheStreamsEarlierWorkAndReturnsWhenDone) {
  Probe earlier{&mutex_, &order_, 1, std::chrono::milliseconds(30)};
  Probe waited{&mutex_, &order_, 2};
  const ph_host_task_t first = earlier.Task();
  ASSERT_PH_OK(ph_launch_host_func(stream_, &first));
  const ph_host_task_t second = waited.Task();
  ASSERT_PH_OK(ph_run_host_func(stream_, &second));
  // Returned: the task ran, after the work queued before it.
  EXPECT_EQ(waited.runs.load(), 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    EXPECT_EQ(order_, (std::vector<int>{1, 2}));
  }
  ASSERT_PH_OK(ph_stream_synchronize(stream_));
  EXPECT_EQ(waited.releases.load(), 1);
  EXPECT_EQ(earlier.releases.load(), 1);
}

TEST_F(HostWork, AFailingTaskReturnsItsStatusAndSentence) {
  Probe failing{&mutex_, &order_, 7};
  failing.result = PH_ERROR_DEVICE;
  const ph_host_task_t task = failing.Task();
  EXPECT_EQ(ph_run_host_func(stream_, &task), PH_ERROR_DEVICE);
  EXPECT_TRUE(Contains(ph_last_error_message(), "probe 7 failed on purpose"))
      << ph_last_error_message();
  EXPECT_EQ(failing.runs.load(), 1);
  EXPECT_EQ(failing.releases.load(), 1);
  // The stream is sticky with it, as after any failed work.
  EXPECT_EQ(ph_stream_query(stream_), PH_ERROR_DEVICE);
}

TEST_F(HostWork, OnAStickyStreamTheTaskIsReleasedWithoutRunning) {
  Probe failing{&mutex_, &order_, 1};
  failing.result = PH_ERROR_DEVICE;
  const ph_host_task_t first = failing.Task();
  ASSERT_PH_OK(ph_launch_host_func(stream_, &first));
  EXPECT_EQ(ph_stream_synchronize(stream_), PH_ERROR_DEVICE);
  Probe skipped{&mutex_, &order_, 2};
  const ph_host_task_t second = skipped.Task();
  EXPECT_EQ(ph_run_host_func(stream_, &second), PH_ERROR_DEVICE);
  EXPECT_EQ(skipped.runs.load(), 0);
  EXPECT_EQ(skipped.releases.load(), 1);
}

TEST_F(HostWork, ManyCallsFromSeveralThreadsEachRunOnce) {
  constexpr int kThreads = 4;
  constexpr int kCalls = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::vector<std::unique_ptr<Probe>> probes;
  for (int i = 0; i < kThreads * kCalls; ++i) {
    probes.push_back(std::make_unique<Probe>());
    probes.back()->mutex = &mutex_;
    probes.back()->order = &order_;
    probes.back()->value = i;
  }
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < kCalls; ++c) {
        const ph_host_task_t task = probes[t * kCalls + c]->Task();
        if (ph_run_host_func(stream_, &task) != PH_SUCCESS) failures++;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_PH_OK(ph_stream_synchronize(stream_));
  EXPECT_EQ(failures.load(), 0);
  for (const auto& probe : probes) {
    EXPECT_EQ(probe->runs.load(), 1);
    EXPECT_EQ(probe->releases.load(), 1);
  }
}

/* ---- The other OPTIONAL calls of an older minor -------------------------- */

TEST(OlderMinor, CallsItsTableDoesNotHoldAnswerUnimplemented) {
  void* device_ptr = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 4096, &device_ptr));
  void* host_view = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(ph_kernel_address(device_ptr, &host_view),
            PH_ERROR_INVALID_ARGUMENT)
      << "an ABI 1000 member, still the driver's: outside work on a stream "
         "it refuses, it does not answer UNIMPLEMENTED";
  ph_ipc_mem_handle_t handle{};
  EXPECT_EQ(ph_ipc_get_mem_handle(device_ptr, &handle), PH_ERROR_UNIMPLEMENTED);
  EXPECT_TRUE(Contains(ph_last_error_message(),
                       "ph_ipc_get_mem_handle: the phantom driver"))
      << ph_last_error_message();
  EXPECT_TRUE(Contains(ph_last_error_message(), "OPTIONAL"));
  ph_device_telemetry_t telemetry{};
  telemetry.struct_size = sizeof telemetry;
  EXPECT_EQ(ph_device_get_telemetry(0, &telemetry), PH_ERROR_UNIMPLEMENTED);
  ph_event_t event = reinterpret_cast<ph_event_t>(0x1);
  ph_ipc_event_handle_t event_handle{};
  EXPECT_EQ(ph_ipc_open_event_handle(&event_handle, &event),
            PH_ERROR_UNIMPLEMENTED);
  EXPECT_EQ(event, nullptr) << "out parameters are cleared";
  // A failing call of the driver's own makes its message the latest again.
  EXPECT_EQ(ph_set_device(-1), PH_ERROR_INVALID_DEVICE);
  EXPECT_FALSE(Contains(ph_last_error_message(), "OPTIONAL"))
      << ph_last_error_message();
  ASSERT_PH_OK(ph_free(device_ptr));
}

/* ---- No driver ---------------------------------------------------------- */

TEST(NoDriver, EveryCallFailsWithTheLoadersSentence) {
  ASSERT_FALSE(g_expect_error.empty()) << "run with --expect-error=<text>";
  int count = 5;
  EXPECT_EQ(ph_device_count(&count), PH_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(count, 0);
  EXPECT_TRUE(Contains(ph_last_error_message(), g_expect_error))
      << ph_last_error_message();
  void* ptr = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(ph_malloc(0, 64, &ptr), PH_ERROR_NOT_INITIALIZED);
  EXPECT_TRUE(Contains(ph_last_error_message(), g_expect_error));
  std::mutex mutex;
  std::vector<int> order;
  Probe probe{&mutex, &order, 1};
  const ph_host_task_t task = probe.Task();
  EXPECT_EQ(ph_launch_host_func(nullptr, &task), PH_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(ph_run_host_func(nullptr, &task), PH_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(probe.runs.load(), 0);
  EXPECT_EQ(probe.releases.load(), 2) << "a refused task is still released";
  EXPECT_STREQ(ph_status_name(PH_ERROR_DEVICE), "PH_ERROR_DEVICE");
  EXPECT_EQ(ph_abi_version(), 0u);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--host-func=", 0) == 0) {
      g_host_func = arg.substr(std::strlen("--host-func="));
    } else if (arg.rfind("--expect-error=", 0) == 0) {
      g_expect_error = arg.substr(std::strlen("--expect-error="));
    }
  }
  return RUN_ALL_TESTS();
}
