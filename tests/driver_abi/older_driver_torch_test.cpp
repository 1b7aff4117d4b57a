// The whole backend over a driver of an older minor: ctest runs this
// LibTorch program with PHANTOM_DRIVER naming the ABI 1000 test driver
// (wrapper_driver.cc, WRAPPER_OLDER_MINOR), whose table ends before
// ph_run_host_func, telemetry and interprocess sharing. It loads, and ops
// that wait for their result (the launch-then-wait fallback of
// ph_run_host_func) and ops that are only queued both compute what the CPU
// does; the calls it lacks read as unavailable, and so does the device
// property flag of a later minor (ABI 1006) its wrapped fake would set.
#include <phantom/DeviceState.h>
#include <phantom/DriverLoader.h>
#include <phantom/HostGuard.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

const c10::Device kPhantom(c10::DeviceType::PrivateUse1, 0);

TEST(OlderMinorDriver, IsTheDriverThisRunLoaded) {
  const phantom::driver::LoadedDriver& driver = phantom::driver::activeDriver();
  ASSERT_TRUE(driver.ok()) << driver.error;
  EXPECT_EQ(driver.table.abi_version, 1000u);
  EXPECT_EQ(driver.table.run_host_func, nullptr);
  // The device reports the driver's ABI, not the runtime's.
  const phantom::DeviceProperties props = phantom::deviceProperties(0);
  EXPECT_EQ(props.major, 1);
  EXPECT_EQ(props.minor, 0);
}

TEST(OlderMinorDriver, OpsComputeWhatTheCpuDoes) {
  const at::Tensor cpu = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor device = cpu.to(kPhantom);
  // Queued work, then work whose output shape depends on the data (it
  // waits for its result: ph_run_host_func, here its fallback).
  const at::Tensor product = (device * 2 + 1).sin();
  EXPECT_TRUE(at::allclose(product.cpu(), (cpu * 2 + 1).sin()));
  const at::Tensor picked = at::nonzero(device > 5);
  EXPECT_TRUE(at::equal(picked.cpu(), at::nonzero(cpu > 5)));
  EXPECT_EQ(device.sum().item<float>(), 66.0f);
}

TEST(OlderMinorDriver, TelemetryItLacksReadsAsUnavailable) {
  const phantom::DeviceTelemetry telemetry = phantom::deviceTelemetry(0);
  EXPECT_FALSE(telemetry.driver_reports);
  EXPECT_FALSE(telemetry.utilization_percent.has_value());
}

TEST(OlderMinorDriver, ItsCopiesAreNotTakenToIgnoreHostProtection) {
  // The wrapped fake sets PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION; a driver
  // of ABI 1000 cannot declare it, so the runtime never protects pinned
  // memory on it.
  EXPECT_FALSE(phantom::host_guard::available(0));
}

}  // namespace
