// Tests of the fake driver's interprocess sharing machinery, below what
// hal.h promises (tests/hal/ipc_test.cc checks the
// promises across real processes): moving an exported allocation's pages
// into the device memory file without losing a concurrent write, giving
// pages back to private memory on free, mapping an export into another
// device's view (both ends in one process here, which the HAL entry points
// refuse), the fault handler's migration window, and the test-only switch
// that plays a driver without the capability.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "device_memory.h"
#include "fault_handler.h"
#include "fake_test_support.h"
#include "phantom/hal.h"

namespace phantom::fake {
namespace {

size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

void Fill(void* device, size_t size, int seed) {
  std::vector<unsigned char> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>(i * 31 + seed);
  ASSERT_PH_OK(ph_memcpy(device, bytes.data(), size, PH_MEMCPY_HOST_TO_DEVICE));
}

bool Holds(const void* device, size_t size, int seed) {
  std::vector<unsigned char> bytes(size);
  if (ph_memcpy(bytes.data(), device, size, PH_MEMCPY_DEVICE_TO_HOST) != PH_SUCCESS) {
    return false;
  }
  for (size_t i = 0; i < size; ++i) {
    if (bytes[i] != static_cast<unsigned char>(i * 31 + seed)) return false;
  }
  return true;
}

TEST(Sharing, ExportMovesTheAllocationsPagesIntoTheFileKeepingItsBytes) {
  constexpr size_t kSize = 3 << 20;
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(0, kSize, &device));
  Fill(device, kSize, 5);
  DeviceMemory& memory = GetDeviceMemory(0);
  const size_t before = memory.SharedViewBytes();
  ExportedAllocation exported;
  ASSERT_PH_OK(memory.Export(reinterpret_cast<uintptr_t>(device) + 100, &exported));
  EXPECT_GE(memory.SharedViewBytes(), before + kSize);
  EXPECT_EQ(exported.size, kSize) << "the whole allocation, from an interior pointer";
  EXPECT_TRUE(Holds(device, kSize, 5));
  // The file holds the bytes at the allocation's offset.
  std::vector<unsigned char> first(64);
  ASSERT_EQ(pread(exported.fd, first.data(), first.size(),
                  static_cast<off_t>(exported.offset)),
            static_cast<ssize_t>(first.size()));
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i], static_cast<unsigned char>(i * 31 + 5));
  }
  // Exporting again moves nothing more.
  const size_t shared = memory.SharedViewBytes();
  ASSERT_PH_OK(memory.Export(reinterpret_cast<uintptr_t>(device), &exported));
  EXPECT_EQ(memory.SharedViewBytes(), shared);
  ASSERT_PH_OK(ph_free(device));
  EXPECT_EQ(memory.SharedViewBytes(), before) << "freed pages go back to private memory";
}

#if defined(__SANITIZE_THREAD__)
#define PHANTOM_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PHANTOM_UNDER_TSAN 1
#endif
#endif

TEST(Sharing, AWriteDuringTheMoveLandsInTheSharedPages) {
#ifdef PHANTOM_UNDER_TSAN
  GTEST_SKIP() << "the move reads pages that this test's writer writes: "
                  "mprotect orders them, which ThreadSanitizer does not model";
#endif
  // A "kernel" writes each word of a block once, in order, while the block
  // is exported: the copy into the file overtakes it, so without the
  // read-only window its writes between the copy and the remapping would
  // be lost.
  constexpr size_t kBytes = 32 << 20;
  constexpr size_t kWords = kBytes / sizeof(uint64_t);
  void* block = nullptr;
  ASSERT_PH_OK(ph_malloc(0, kBytes, &block));
  auto* words = static_cast<std::atomic<uint64_t>*>(KernelViewOf(block));
  // Non-zero everywhere, so every page is copied (zero pages are skipped)
  // and the move lasts a while.
  std::memset(KernelViewOf(block), 0xff, kBytes);
  std::atomic<size_t> progress{0};
  std::thread writer([&] {
    const auto start = std::chrono::steady_clock::now();
    for (size_t k = 0; k < kWords; ++k) {
      words[k].store(k + 1, std::memory_order_relaxed);
      progress.store(k, std::memory_order_relaxed);
      if (k % 64 == 0) {  // ~40 ns a word: the pass takes ~170 ms
        while (std::chrono::steady_clock::now() - start <
               std::chrono::nanoseconds(40 * k)) {
        }
      }
    }
  });
  while (progress.load() < kWords / 8) std::this_thread::yield();
  ExportedAllocation exported;
  ASSERT_PH_OK(GetDeviceMemory(0).Export(reinterpret_cast<uintptr_t>(block), &exported));
  const size_t exported_at = progress.load();
  writer.join();
  EXPECT_LT(exported_at, kWords) << "the export ended before the writer did";
  size_t lost = 0;
  for (size_t k = 0; k < kWords; ++k) {
    if (words[k].load() != k + 1) ++lost;
  }
  EXPECT_EQ(lost, 0u) << "writes made while the pages moved were lost";
  // The file has them too (the view is now the file).
  uint64_t last = 0;
  ASSERT_EQ(pread(exported.fd, &last, sizeof last,
                  static_cast<off_t>(exported.offset + kBytes - sizeof last)),
            static_cast<ssize_t>(sizeof last));
  EXPECT_EQ(last, kWords);
  ASSERT_PH_OK(ph_free(block));
}

TEST(Sharing, APageStaysSharedWhileALiveNeighbourUsesIt) {
  DeviceMemory& memory = GetDeviceMemory(1);
  const size_t before = memory.SharedViewBytes();
  // Two 512-byte neighbours in one page (earlier tests may have left
  // holes, so allocate until a pair lands in one page).
  std::vector<void*> spare;
  void* first = nullptr;
  void* second = nullptr;
  for (int attempt = 0; attempt < 16; ++attempt) {
    ASSERT_PH_OK(ph_malloc(1, 512, &first));
    ASSERT_PH_OK(ph_malloc(1, 512, &second));
    if (reinterpret_cast<uintptr_t>(first) / Page() ==
        reinterpret_cast<uintptr_t>(second) / Page()) {
      break;
    }
    spare.push_back(first);
    spare.push_back(second);
    first = second = nullptr;
  }
  for (void* block : spare) ASSERT_PH_OK(ph_free(block));
  ASSERT_NE(second, nullptr) << "no two neighbours in one page";
  Fill(second, 512, 9);
  ExportedAllocation exported;
  ASSERT_PH_OK(memory.Export(reinterpret_cast<uintptr_t>(first), &exported));
  EXPECT_EQ(memory.SharedViewBytes(), before + Page());
  ASSERT_PH_OK(ph_free(first));
  EXPECT_EQ(memory.SharedViewBytes(), before + Page()) << "the neighbour still uses it";
  EXPECT_TRUE(Holds(second, 512, 9));
  ASSERT_PH_OK(ph_free(second));
  EXPECT_EQ(memory.SharedViewBytes(), before);
}

TEST(Sharing, AnImportIsDeviceMemoryWhoseViewIsTheExportersBytes) {
  constexpr size_t kSize = 1 << 20;
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(0, kSize + 1000, &device));
  Fill(device, kSize, 3);
  ExportedAllocation exported;
  ASSERT_PH_OK(GetDeviceMemory(0).Export(reinterpret_cast<uintptr_t>(device), &exported));
  DeviceMemory& importer = GetDeviceMemory(1);
  size_t free_before = 0;
  size_t total = 0;
  importer.GetInfo(&free_before, &total);
  ImportKey key;
  key.pid = 1;  // any exporter id: both ends are this process here
  key.inode = exported.inode;
  key.dev = exported.dev;
  key.offset = exported.offset;
  key.size = exported.size;
  void* imported = nullptr;
  ASSERT_PH_OK(importer.OpenImport(key, exported.fd, &imported));
  EXPECT_EQ(DeviceOfAddress(reinterpret_cast<uintptr_t>(imported)), 1);
  size_t free_after = 0;
  importer.GetInfo(&free_after, &total);
  EXPECT_EQ(free_after, free_before) << "an import does not use the importer's capacity";
  ph_pointer_attributes_t attributes{};
  ASSERT_PH_OK(ph_pointer_get_attributes(static_cast<char*>(imported) + 10, &attributes));
  EXPECT_EQ(attributes.type, PH_MEMORY_DEVICE);
  EXPECT_EQ(attributes.device, 1);
  EXPECT_EQ(attributes.base, imported);
  EXPECT_EQ(attributes.size, kSize + 1000);
  EXPECT_TRUE(Holds(imported, kSize, 3)) << "the importer reads the exporter's bytes";
  Fill(imported, 4096, 77);
  EXPECT_TRUE(Holds(device, 4096, 77)) << "and the exporter reads the importer's";
  // Copies are bounded by the imported allocation.
  std::vector<char> host(16);
  EXPECT_EQ(ph_memcpy(host.data(), static_cast<char*>(imported) + kSize + 1000 - 8,
                      16, PH_MEMCPY_DEVICE_TO_HOST),
            PH_ERROR_INVALID_ARGUMENT);
  // A second open is the same mapping, counted.
  void* again = nullptr;
  ASSERT_PH_OK(importer.OpenImport(key, exported.fd, &again));
  EXPECT_EQ(again, imported);
  EXPECT_EQ(ph_free(imported), PH_ERROR_INVALID_HANDLE);
  EXPECT_NE(std::string(ph_last_error_message()).find("ph_ipc_close_mem_handle"),
            std::string::npos);
  ASSERT_PH_OK(importer.CloseImport(reinterpret_cast<uintptr_t>(imported)));
  EXPECT_TRUE(Holds(imported, 4096, 77)) << "still open once";
  ASSERT_PH_OK(importer.CloseImport(reinterpret_cast<uintptr_t>(imported)));
  EXPECT_EQ(importer.CloseImport(reinterpret_cast<uintptr_t>(imported)),
            PH_ERROR_INVALID_HANDLE);
  ASSERT_PH_OK(ph_free(device));
}

// A SIGSEGV handler installed after the driver's: it would end the process.
void ForeignHandler(int) { _exit(99); }

TEST(Sharing, AWriterInTheMigrationWindowWaitsEvenUnderAForeignHandler) {
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(1, 1 << 20, &device));
  char* view = static_cast<char*>(KernelViewOf(device));
  char* page = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(view) + Page() - 1) / Page() * Page());
  struct sigaction previous = {};
  struct sigaction foreign = {};
  foreign.sa_handler = ForeignHandler;
  sigemptyset(&foreign.sa_mask);
  sigaction(SIGSEGV, &foreign, &previous);  // as torch's DataLoader workers do
  BeginViewMigration(1, reinterpret_cast<uintptr_t>(page),
                     reinterpret_cast<uintptr_t>(page) + Page());
  ASSERT_EQ(mprotect(page, Page(), PROT_READ), 0);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    *reinterpret_cast<volatile char*>(page) = 42;
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done) << "the write waits while the window is open";
  ASSERT_EQ(mprotect(page, Page(), PROT_READ | PROT_WRITE), 0);
  EndViewMigration(1);
  writer.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(page[0], 42) << "and is retried once it closes";
  sigaction(SIGSEGV, &previous, nullptr);
  ASSERT_PH_OK(ph_free(device));
}

TEST(Sharing, TheNoIpcSwitchIsParsedStrictly) {
  EXPECT_TRUE(MakeConfig(nullptr, nullptr, nullptr).ipc);
  EXPECT_TRUE(MakeConfig(nullptr, nullptr, "").ipc);
  EXPECT_TRUE(MakeConfig(nullptr, nullptr, "0").ipc);
  const Config off = MakeConfig(nullptr, nullptr, "1");
  EXPECT_TRUE(off.ok);
  EXPECT_FALSE(off.ipc);
  const Config bad = MakeConfig(nullptr, nullptr, "yes");
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.error.find("PHANTOM_FAKE_NO_IPC='yes' is not 0 or 1"),
            std::string::npos);
}

// The switch makes every sharing call a driver without the capability's.
TEST(SharingDeathTest, WithTheNoIpcSwitchEverySharingCallIsUnimplemented) {
  setenv("PHANTOM_FAKE_NO_IPC", "1", 1);
  EXPECT_EXIT(
      {
        void* device = nullptr;
        ph_malloc(0, 4096, &device);
        ph_ipc_mem_handle_t handle{};
        ph_event_t event = nullptr;
        ph_ipc_event_handle_t event_handle{};
        void* opened = nullptr;
        const bool ok =
            ph_ipc_get_mem_handle(device, &handle) == PH_ERROR_UNIMPLEMENTED &&
            std::string(ph_last_error_message()).find("PHANTOM_FAKE_NO_IPC=1") !=
                std::string::npos &&
            ph_ipc_open_mem_handle(&handle, &opened) == PH_ERROR_UNIMPLEMENTED &&
            ph_ipc_close_mem_handle(device) == PH_ERROR_UNIMPLEMENTED &&
            ph_event_create(PH_EVENT_INTERPROCESS | PH_EVENT_DISABLE_TIMING,
                            &event) == PH_ERROR_UNIMPLEMENTED &&
            ph_ipc_open_event_handle(&event_handle, &event) ==
                PH_ERROR_UNIMPLEMENTED;
        std::fprintf(stderr, "%s\n", ok ? "all unimplemented" : "no");
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "all unimplemented");
  unsetenv("PHANTOM_FAKE_NO_IPC");
}

}  // namespace
}  // namespace phantom::fake
