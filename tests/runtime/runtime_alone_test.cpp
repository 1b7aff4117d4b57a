// The runtime without the CPU-kernel execution layer (device/hostexec): a
// program linking libphantom_runtime alone. The runtime must not need that
// layer (it reaches it only through phantom/DeviceWork.h's hooks), so what
// it asks of the layer has a default that is correct without it: work the
// runtime queues (a foreign pinned buffer kept alive past a copy) runs
// once the stream has passed the point where it was queued, and nothing
// else happens. tests/CMakeLists.txt checks that this program does not
// load libphantom_hostexec (Layering.RuntimeAloneDoesNotLoadHostExec).
#include <phantom/Device.h>
#include <phantom/DeviceWork.h>
#include <phantom/Stream.h>

#include <phantom/hal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace {

const bool kSettings = [] {
  setenv("PHANTOM_DEVICE_COUNT", "1", /*overwrite=*/1);
  setenv("PHANTOM_DEVICE_MEMORY", "64MiB", /*overwrite=*/1);
  return true;
}();

// Host work queued straight through the HAL: sleeps, then records that it
// ran.
struct Sleeper {
  std::atomic<bool> done{false};
  static ph_status_t run(void* self, char*, size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    static_cast<Sleeper*>(self)->done = true;
    return PH_SUCCESS;
  }
  static void release(void*) {}
};

TEST(RuntimeAlone, QueuedHostWorkRunsAfterTheStreamHasPassedItsPoint) {
  ASSERT_GT(phantom::deviceCountNoThrow(), 0);
  const auto stream = phantom::getStreamFromPool(false, 0);
  Sleeper earlier;
  const ph_host_task_t task{"earlier work", &Sleeper::run, &Sleeper::release,
                            &earlier};
  ASSERT_EQ(ph_launch_host_func(stream.handle(), &task), PH_SUCCESS);
  bool saw_earlier_done = false;
  bool ran = false;
  phantom::hostExecHooks().launch_async(stream, "keep alive", [&] {
    saw_earlier_done = earlier.done.load();
    ran = true;
  });
  EXPECT_TRUE(ran) << "without the execution layer the work runs at once, "
                      "after waiting for the stream";
  EXPECT_TRUE(saw_earlier_done) << "it ran before the stream's earlier work";
  EXPECT_FALSE(phantom::inDeviceWork());
}

TEST(RuntimeAlone, TheOtherHooksDoNothing) {
  EXPECT_FALSE(phantom::hostExecHooks().release_finished_work());
  phantom::hostExecHooks().release_host_memory();  // must not crash
  const auto stream = phantom::getStreamFromPool(false, 0);
  stream.synchronize();  // calls release_finished_work
}

TEST(RuntimeAlone, DeviceWorkScopeMarksTheThreadAndRestoresIt) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  EXPECT_EQ(phantom::currentWorkStream(), nullptr);
  {
    phantom::DeviceWorkScope scope(stream);
    EXPECT_TRUE(phantom::inDeviceWork());
    EXPECT_EQ(phantom::currentWorkStream(), stream.handle());
    EXPECT_EQ(phantom::getCurrentPhantomStream(0), stream);
  }
  EXPECT_FALSE(phantom::inDeviceWork());
  EXPECT_NE(phantom::getCurrentPhantomStream(0), stream);
}

}  // namespace
