// Pinned host memory's two mappings (device/fake/host_memory.h): the
// address ph_host_malloc returns and the alias the copy engine writes
// through. What the runtime's host guard (phantom/HostGuard.h) relies on:
// bytes written through the alias appear at the user's address, and a
// queued copy into (or out of) a pinned block whose user mapping is
// protected completes without faulting — the fake declares
// PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION for it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "fake_test_support.h"
#include "host_memory.h"
#include "phantom/hal.h"

namespace phantom::fake {
namespace {

size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

TEST(PinnedAlias, BytesWrittenThroughTheAliasAppearAtTheUsersAddress) {
  ASSERT_TRUE(PinnedAliasesAvailable());
  const size_t size = 2 * Page() + 100;
  void* block = nullptr;
  ASSERT_PH_OK(ph_host_malloc(size, &block));
  uintptr_t base = 0;
  size_t found = 0;
  void* alias = nullptr;
  char* interior = static_cast<char*>(block) + Page() + 7;
  ASSERT_TRUE(LookupPinnedAlias(interior, &base, &found, &alias));
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>(block));
  EXPECT_EQ(found, size);
  EXPECT_NE(alias, static_cast<void*>(interior));  // a second mapping
  std::memcpy(alias, "phantom", 8);
  EXPECT_STREQ(interior, "phantom");
  ASSERT_PH_OK(ph_host_free(block));
}

TEST(PinnedAlias, TheDeviceDeclaresThatCopiesIgnoreHostProtection) {
  ph_device_properties_t props{};
  props.struct_size = sizeof props;
  ASSERT_PH_OK(ph_device_get_properties(0, &props));
  EXPECT_NE(props.flags & PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION, 0u);
}

TEST(PinnedAlias, QueuedCopiesIgnoreProtectionOfTheUsersMapping) {
  const size_t size = 3 * Page();
  std::vector<unsigned char> expected(size);
  for (size_t i = 0; i < size; ++i) expected[i] = static_cast<unsigned char>(i * 7);
  void* device = nullptr;
  void* pinned = nullptr;
  void* source = nullptr;
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_malloc(0, size, &device));
  ASSERT_PH_OK(ph_host_malloc(size, &pinned));
  ASSERT_PH_OK(ph_host_malloc(size, &source));
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  std::memcpy(source, expected.data(), size);
  ASSERT_PH_OK(ph_memcpy(device, source, size, PH_MEMCPY_HOST_TO_DEVICE));

  // Device to host into a protected destination: the copy engine writes
  // through the alias, so neither the copy nor the process faults.
  ASSERT_EQ(mprotect(pinned, size, PROT_NONE), 0);
  ASSERT_PH_OK(ph_memcpy_async(pinned, device, size, PH_MEMCPY_DEVICE_TO_HOST,
                               stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_EQ(mprotect(pinned, size, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(std::memcmp(pinned, expected.data(), size), 0);

  // Host to device from a protected source: read through the alias too.
  ASSERT_PH_OK(ph_memset_async(device, 0, size, stream));
  ASSERT_EQ(mprotect(source, size, PROT_NONE), 0);
  ASSERT_PH_OK(ph_memcpy_async(device, source, size, PH_MEMCPY_HOST_TO_DEVICE,
                               stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_EQ(mprotect(source, size, PROT_READ | PROT_WRITE), 0);
  std::memset(pinned, 0, size);
  ASSERT_PH_OK(ph_memcpy(pinned, device, size, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(std::memcmp(pinned, expected.data(), size), 0);

  ASSERT_PH_OK(ph_stream_destroy(stream));
  ASSERT_PH_OK(ph_host_free(source));
  ASSERT_PH_OK(ph_host_free(pinned));
  ASSERT_PH_OK(ph_free(device));
}

TEST(PinnedAlias, FreeingUnmapsBothMappings) {
  const size_t size = Page();
  void* block = nullptr;
  ASSERT_PH_OK(ph_host_malloc(size, &block));
  uintptr_t base = 0;
  size_t found = 0;
  void* alias = nullptr;
  ASSERT_TRUE(LookupPinnedAlias(block, &base, &found, &alias));
  ASSERT_PH_OK(ph_host_free(block));
  // msync on an unmapped range fails with ENOMEM.
  EXPECT_NE(msync(alias, size, MS_ASYNC), 0);
  EXPECT_NE(msync(block, size, MS_ASYNC), 0);
  EXPECT_FALSE(LookupPinned(block, &base, &found));
}

}  // namespace
}  // namespace phantom::fake
