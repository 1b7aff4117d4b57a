// Tests of the fake driver's memory machinery, below what hal.h promises:
// environment parsing, the offset allocator, the two-mapping memory model,
// page release, huge pages and the fault handler. Links the driver's
// objects directly, so private headers are fair game.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "activity.h"
#include "config.h"
#include "copy_channels.h"
#include "device_memory.h"
#include "phantom/hal.h"
#include "range_allocator.h"
#include "stream.h"
#include "fake_test_support.h"

namespace phantom::fake {
namespace {

/* ---- Configuration ----------------------------------------------------- */

// The spellings themselves are the settings parser's (tests/common); here,
// what the driver makes of them.
TEST(Config, InvalidValueStopsTheDriverAndEmptyMeansUnset) {
  using settings::kGiB;
  using settings::kMiB;
  Config config = MakeConfig(nullptr, nullptr);
  EXPECT_TRUE(config.ok);
  EXPECT_EQ(config.device_count, 2);
  EXPECT_EQ(config.device_memory, 8 * kGiB);
  config = MakeConfig("", " ");
  EXPECT_TRUE(config.ok);
  EXPECT_EQ(config.device_count, 2);
  config = MakeConfig(" 3 ", "16M");
  EXPECT_TRUE(config.ok);
  EXPECT_EQ(config.device_count, 3);
  EXPECT_EQ(config.device_memory, 16 * kMiB);
  config = MakeConfig("3", "lots");
  EXPECT_FALSE(config.ok);
  EXPECT_EQ(config.device_count, 0);
  std::string expected;
  settings::Value unused;
  settings::Parse(settings::kDeviceMemory, "lots", &unused, &expected);
  EXPECT_EQ(config.error, expected);
  EXPECT_EQ(config.error.rfind("PHANTOM_DEVICE_MEMORY='lots' is not a size;", 0), 0u);
  config = MakeConfig("65", "16M");
  EXPECT_FALSE(config.ok);
  EXPECT_EQ(config.error.rfind("PHANTOM_DEVICE_COUNT='65' is not in range", 0), 0u);
}

// The whole process refuses to start on a bad value (checked in a fresh
// child, since the environment is read once per process).
TEST(Config, BadMemoryValueMakesEveryCallNotInitialized) {
  setenv("PHANTOM_DEVICE_MEMORY", "12 parsecs", 1);
  EXPECT_EXIT(
      {
        int count = 5;
        size_t free_bytes = 0;
        size_t total = 0;
        const bool ok =
            ph_device_count(&count) == PH_ERROR_NOT_INITIALIZED &&
            count == 0 &&
            ph_mem_get_info(0, &free_bytes, &total) ==
                PH_ERROR_NOT_INITIALIZED;
        fprintf(stderr, "%s\n", ph_last_error_message());
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "PHANTOM_DEVICE_MEMORY='12 parsecs' is not a size: 'parsecs' is not a "
      "unit; accepted: .*; unset it for the default 8GiB");
  setenv("PHANTOM_DEVICE_MEMORY", "64MiB", 1);
}

TEST(Config, ZeroDevicesIsAValidConfiguration) {
  setenv("PHANTOM_DEVICE_COUNT", "0", 1);
  EXPECT_EXIT(
      {
        int count = 5;
        void* ptr = nullptr;
        const bool ok = ph_device_count(&count) == PH_SUCCESS && count == 0 &&
                        ph_malloc(0, 16, &ptr) == PH_ERROR_INVALID_DEVICE;
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  setenv("PHANTOM_DEVICE_COUNT", "2", 1);
}

// PHANTOM_FAKE_NO_KERNEL_VIEW=1 plays a discrete device's driver: the
// table's ph_kernel_address is NULL (every other member stays), so the
// runtime takes the copying CPU fallback. Checked in a fresh child, since
// the environment is read once per process.
TEST(Config, NoKernelViewSwitchTakesTheMemberOutOfTheTable) {
  EXPECT_TRUE(MakeConfig(nullptr, nullptr, nullptr, nullptr).kernel_view);
  EXPECT_TRUE(MakeConfig(nullptr, nullptr, nullptr, "0").kernel_view);
  EXPECT_FALSE(MakeConfig(nullptr, nullptr, nullptr, "1").kernel_view);
  EXPECT_FALSE(MakeConfig(nullptr, nullptr, nullptr, "yes").ok);
  EXPECT_NE(ph_driver_get_table(PH_HAL_ABI_VERSION)->kernel_address, nullptr);
  setenv("PHANTOM_FAKE_NO_KERNEL_VIEW", "1", 1);
  EXPECT_EXIT(
      {
        const ph_driver_table_t* table = ph_driver_get_table(PH_HAL_ABI_VERSION);
        const bool ok = table->kernel_address == nullptr &&
                        table->malloc != nullptr &&
                        table->memcpy_async != nullptr;
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  unsetenv("PHANTOM_FAKE_NO_KERNEL_VIEW");
}

/* ---- Offset allocator -------------------------------------------------- */

TEST(RangeAllocator, FreedNeighboursCoalesceIntoOneRange) {
  RangeAllocator allocator(3 * 4096);
  size_t a = 0;
  size_t b = 0;
  size_t c = 0;
  ASSERT_TRUE(allocator.Allocate(4096, &a));
  ASSERT_TRUE(allocator.Allocate(4096, &b));
  ASSERT_TRUE(allocator.Allocate(4096, &c));
  size_t none = 0;
  EXPECT_FALSE(allocator.Allocate(1, &none));
  RangeAllocator::Block block;
  ASSERT_TRUE(allocator.Free(b, &block));  // middle first: no neighbour free
  ASSERT_TRUE(allocator.Free(a, &block));  // merges with b's range
  ASSERT_TRUE(allocator.Free(c, &block));  // merges on the left
  EXPECT_EQ(allocator.free_range_count(), 1u);
  EXPECT_EQ(allocator.allocated(), 0u);
  size_t whole = 1;
  ASSERT_TRUE(allocator.Allocate(3 * 4096, &whole));
  EXPECT_EQ(whole, 0u);
}

TEST(RangeAllocator, BestFitPicksTheSmallestHoleThatFits) {
  RangeAllocator allocator(64 * 1024);
  size_t offsets[6];
  const size_t sizes[6] = {8192, 512, 2048, 512, 4096, 512};
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(allocator.Allocate(sizes[i], &offsets[i]));
  RangeAllocator::Block block;
  ASSERT_TRUE(allocator.Free(offsets[0], &block));  // 8 KiB hole
  ASSERT_TRUE(allocator.Free(offsets[2], &block));  // 2 KiB hole
  ASSERT_TRUE(allocator.Free(offsets[4], &block));  // 4 KiB hole
  size_t got = 0;
  ASSERT_TRUE(allocator.Allocate(1500, &got));
  EXPECT_EQ(got, offsets[2]);
  ASSERT_TRUE(allocator.Allocate(3000, &got));
  EXPECT_EQ(got, offsets[4]);
}

TEST(RangeAllocator, RoundsToGranulesAndRefusesNonStarts) {
  RangeAllocator allocator(1 << 20);
  size_t offset = 0;
  size_t second = 0;
  ASSERT_TRUE(allocator.Allocate(1, &offset));
  ASSERT_TRUE(allocator.Allocate(1, &second));
  EXPECT_EQ(second - offset, RangeAllocator::kGranule);
  EXPECT_EQ(allocator.allocated(), 2 * RangeAllocator::kGranule);
  RangeAllocator::Block block;
  EXPECT_FALSE(allocator.Free(offset + 8, &block));
  ASSERT_TRUE(allocator.Find(offset + 8, &block));
  EXPECT_EQ(block.offset, offset);
  EXPECT_EQ(block.size, 1u);
  ASSERT_TRUE(allocator.Free(offset, &block));
  EXPECT_FALSE(allocator.Free(offset, &block));
  EXPECT_FALSE(allocator.Find(offset, &block));
  EXPECT_FALSE(allocator.Allocate(0, &offset));
  EXPECT_FALSE(allocator.Allocate(2 << 20, &offset));
}

/* ---- Memory model ------------------------------------------------------ */

TEST(MemoryModel, KernelViewAliasesDeviceMemory) {
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 4096, &device));
  const char text[] = "written through the device address";
  ASSERT_PH_OK(ph_memcpy(device, text, sizeof text, PH_MEMCPY_HOST_TO_DEVICE));
  const char* view = static_cast<const char*>(KernelViewOf(device));
  ASSERT_NE(view, nullptr);
  EXPECT_NE(static_cast<const void*>(view), device);
  EXPECT_STREQ(view, text);
  ASSERT_PH_OK(ph_free(device));
}

TEST(MemoryModel, FreeingALargeBlockReturnsPagesToTheOs) {
  constexpr size_t kSize = 16 << 20;
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(1, kSize, &device));
  DeviceMemory& memory = GetDeviceMemory(1);
  const size_t before = memory.Residency().resident;
  std::memset(KernelViewOf(device), 1, kSize);  // touch every page
  const size_t touched = memory.Residency().resident;
  EXPECT_GE(touched, before + kSize);
  ASSERT_PH_OK(ph_free(device));
  EXPECT_LE(memory.Residency().resident, touched - kSize);
}

TEST(MemoryModel, SmallBlocksKeepTheirPages) {
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(1, 64 * 1024, &device));
  DeviceMemory& memory = GetDeviceMemory(1);
  std::memset(KernelViewOf(device), 1, 64 * 1024);
  const size_t touched = memory.Residency().resident;
  ASSERT_PH_OK(ph_free(device));
  EXPECT_EQ(memory.Residency().resident, touched) << "small frees keep their pages";
}

// True if the kernel gives huge pages to memory advised MADV_HUGEPAGE.
bool TransparentHugePagesOnAdvice() {
  std::FILE* file =
      std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (file == nullptr) return false;
  char text[128] = {};
  const size_t read = std::fread(text, 1, sizeof text - 1, file);
  std::fclose(file);
  text[read] = '\0';
  return std::strstr(text, "[always]") != nullptr ||
         std::strstr(text, "[madvise]") != nullptr;
}

TEST(MemoryModel, KernelViewUsesHugePagesWhereTheOsOffersThem) {
  if (!TransparentHugePagesOnAdvice()) {
    GTEST_SKIP() << "transparent huge pages are off on this machine";
  }
  constexpr size_t kSize = 64 << 20;
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(1, kSize, &device));
  std::memset(KernelViewOf(device), 1, kSize);
  // Most of it: earlier tests may have left 4 KiB pages in part of the
  // range, and the kernel may serve a fault with small pages when it has
  // no free 2 MiB of physical memory at hand.
  EXPECT_GE(GetDeviceMemory(1).Residency().huge, kSize / 2)
      << "a 64 MiB block touched through the view should sit in 2 MiB pages";
  ASSERT_PH_OK(ph_free(device));
}

TEST(MemoryModel, AForkedChildDoesNotInheritTheKernelView) {
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(1, 4096, &device));
  DeviceMemory& memory = GetDeviceMemory(1);
  ASSERT_TRUE(memory.Residency().mapped);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(memory.Residency().mapped ? 1 : 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "the child has the parent's device memory mapped";
  ASSERT_PH_OK(ph_free(device));
}

TEST(MemoryModel, AForkedChildGetsACopyOfPinnedMemory) {
  constexpr size_t kSize = 3 * 4096 + 100;
  void* pinned = nullptr;
  ASSERT_PH_OK(ph_host_malloc(kSize, &pinned));
  std::memset(pinned, 1, kSize);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child reads the parent's contents, then writes its own copy.
    unsigned char* bytes = static_cast<unsigned char*>(pinned);
    const bool inherited = bytes[0] == 1 && bytes[kSize - 1] == 1;
    std::memset(pinned, 2, kSize);
    _exit(inherited ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child did not see the parent's data";
  const unsigned char* bytes = static_cast<const unsigned char*>(pinned);
  EXPECT_EQ(bytes[0], 1) << "the child's write reached the parent's pinned memory";
  EXPECT_EQ(bytes[kSize - 1], 1);
  // The parent's copy engine still reaches the block through its alias.
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(0, kSize, &device));
  ASSERT_PH_OK(ph_memcpy(device, pinned, kSize, PH_MEMCPY_HOST_TO_DEVICE));
  std::memset(pinned, 0, kSize);
  ASSERT_PH_OK(ph_memcpy(pinned, device, kSize, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(bytes[kSize - 1], 1);
  ASSERT_PH_OK(ph_free(device));
  ASSERT_PH_OK(ph_host_free(pinned));
}

/* ---- Fault handler ----------------------------------------------------- */

TEST(FaultHandlerDeathTest, HostReadOfDeviceMemoryExplainsItself) {
  EXPECT_EXIT(
      {
        void* device = nullptr;
        ph_malloc(0, 256, &device);
        volatile char value = *static_cast<volatile char*>(device);
        (void)value;
      },
      ::testing::KilledBySignal(SIGSEGV),
      "host code touched device memory at 0x[0-9a-f]+ \\(phantom device 0\\)"
      ".*copy the tensor to the host");
}

TEST(FaultHandlerDeathTest, HostWriteOnSecondDeviceNamesIt) {
  EXPECT_EXIT(
      {
        void* device = nullptr;
        ph_malloc(1, 256, &device);
        *static_cast<volatile char*>(device) = 1;
      },
      ::testing::KilledBySignal(SIGSEGV), "device memory.*phantom device 1");
}

void ChainedHandler(int) {
  const char message[] = "previous handler ran\n";
  ssize_t ignored = write(STDERR_FILENO, message, sizeof message - 1);
  (void)ignored;
  _exit(42);
}

TEST(FaultHandlerDeathTest, OtherFaultsReachThePreviousHandler) {
  EXPECT_EXIT(
      {
        // Runs in a fresh process: our handler is installed first, then
        // the driver maps a device and installs its own on top.
        signal(SIGSEGV, ChainedHandler);
        void* device = nullptr;
        ph_malloc(0, 256, &device);
        void* page = mmap(nullptr, 4096, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        *static_cast<volatile char*>(page) = 1;
      },
      ::testing::ExitedWithCode(42), "previous handler ran");
}

// Killed by SIGSEGV normally; under a sanitizer, whose handler was there
// first and so is chained to, an error exit instead.
bool DiedAbnormally(int status) {
  return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

TEST(FaultHandlerDeathTest, OtherFaultsWithDefaultActionStillCrash) {
  EXPECT_EXIT(
      {
        void* device = nullptr;
        ph_malloc(0, 256, &device);
        void* page = mmap(nullptr, 4096, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        *static_cast<volatile char*>(page) = 1;
      },
      DiedAbnormally, "");
}

}  // namespace
}  // namespace phantom::fake
