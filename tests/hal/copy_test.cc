// HAL conformance: copies. Synchronous ph_memcpy in every direction and
// between devices with its argument checks, and the stream-ordered
// ph_memcpy_async / ph_memset_async: ordering on the stream, what returns
// before the copy runs (pinned) and what waits (pageable), large copies, a
// failed stream copying nothing, and, from a driver that declares
// PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION, copies that do.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

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

TEST(MemcpyAsync, ADeclaredCopyIgnoresHostProtectionOfItsPinnedSide) {
  ph_device_properties_t props{};
  props.struct_size = sizeof props;
  ASSERT_PH_OK(ph_device_get_properties(0, &props));
  if ((props.flags & PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION) == 0) {
    GTEST_SKIP() << "the driver does not declare "
                    "PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION "
                    "(ph_device_properties_t.flags, OPTIONAL)";
  }
  const size_t size = 2 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ScopedStream stream;
  DeviceBuffer device(0, size);
  PinnedBuffer out(size);
  PinnedBuffer in(size);
  ASSERT_PH_OK(ph_memset_async(device.get(), 7, size, stream));
  // The host's view of both pinned blocks protected: the copies must not
  // notice (nor fault the process).
  ASSERT_EQ(mprotect(out.bytes(), size, PROT_NONE), 0);
  ASSERT_PH_OK(ph_memcpy_async(out.bytes(), device.get(), size,
                               PH_MEMCPY_DEVICE_TO_HOST, stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_EQ(mprotect(out.bytes(), size, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(out.bytes()[0], 7);
  EXPECT_EQ(out.bytes()[size - 1], 7);
  std::memset(in.bytes(), 9, size);
  ASSERT_EQ(mprotect(in.bytes(), size, PROT_NONE), 0);
  ASSERT_PH_OK(ph_memcpy_async(device.get(), in.bytes(), size,
                               PH_MEMCPY_HOST_TO_DEVICE, stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_EQ(mprotect(in.bytes(), size, PROT_READ | PROT_WRITE), 0);
  ASSERT_PH_OK(ph_memcpy(out.bytes(), device.get(), size,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(out.bytes()[size - 1], 9);
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

}  // namespace
