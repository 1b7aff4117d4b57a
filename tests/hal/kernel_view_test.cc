// HAL conformance: the kernel view, ph_kernel_address (OPTIONAL): only
// inside host work on a stream and only for device memory, writes through
// the view landing in device memory. Skips on a driver without kKernelView
// (a discrete device, such as the remote driver).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hal_test_support.h"

namespace {

using namespace hal_test;

/* ---- Kernel addresses -------------------------------------------------- */

TEST(KernelAddress, OnlyInsideWorkAndOnlyForDeviceMemory) {
  REQUIRE_CAPABILITY(kKernelView);
  DeviceBuffer device(0, 4096);
  void* out = reinterpret_cast<void*>(1);
  const ph_status_t outside = ph_kernel_address(device.get(), &out);
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

}  // namespace
