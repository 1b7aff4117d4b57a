// HAL conformance: device memory (alignment, accounting, out of memory,
// what ph_free refuses), pinned host memory and pointer attributes. The
// out-of-memory test allocates the whole device, so the suite is run with
// small devices (CMake sets the driver's configuration per driver).
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

}  // namespace
