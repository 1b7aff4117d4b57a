// The torch runtime as a LibTorch C++ program sees it: backend name, device
// guard, streams, events, device allocator, generator and host work on
// streams. ctest runs each test in its own process; the driver reads its
// settings at first use, after the static initialiser below.
#include <phantom/DeviceAllocator.h>
#include <phantom/Device.h>
#include <phantom/Generator.h>
#include <phantom/KernelHostMemory.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

const bool kSettings = [] {
  setenv("PHANTOM_DEVICE_COUNT", "2", /*overwrite=*/1);
  setenv("PHANTOM_DEVICE_MEMORY", "256MiB", /*overwrite=*/1);
  return true;
}();

const c10::Device kPhantom0(c10::DeviceType::PrivateUse1, 0);
const c10::Device kPhantom1(c10::DeviceType::PrivateUse1, 1);

// Blocks a stream until release() is called, so tests can observe work
// that is still queued or running.
class StreamBlocker {
 public:
  explicit StreamBlocker(const phantom::PhantomStream& stream) {
    phantom::launchAsync(stream, "test blocker", [this] {
      started_ = true;
      while (!released_) {
        std::this_thread::sleep_for(1ms);
      }
    });
    while (!started_) {
      std::this_thread::sleep_for(1ms);
    }
  }
  void release() { released_ = true; }
  ~StreamBlocker() { release(); }

 private:
  std::atomic<bool> started_{false};
  std::atomic<bool> released_{false};
};

int64_t allocatedBytes(c10::DeviceIndex device) {
  return phantom::deviceAllocator()
      .getDeviceStats(device)
      .allocated_bytes[0]
      .current;
}

TEST(Backend, IsNamedPhantomAndKeepsPrivateUseOneAlias) {
  EXPECT_EQ(c10::get_privateuse1_backend(), "phantom");
  EXPECT_EQ(c10::Device("phantom:1"), kPhantom1);
  EXPECT_EQ(c10::Device("privateuseone:0"), kPhantom0);
}

TEST(DeviceGuard, SwitchesAndRestoresTheCurrentDevice) {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::PrivateUse1);
  EXPECT_EQ(impl.deviceCount(), 2);
  EXPECT_EQ(impl.getDevice(), kPhantom0);
  {
    c10::DeviceGuard guard(kPhantom1);
    EXPECT_EQ(impl.getDevice(), kPhantom1);
  }
  EXPECT_EQ(impl.getDevice(), kPhantom0);
  try {
    c10::DeviceGuard guard(kPhantom1);
    throw std::runtime_error("unwind");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(impl.getDevice(), kPhantom0);
}

TEST(DeviceGuard, RejectsAnOutOfRangeIndexWithAClearMessage) {
  try {
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, 7));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos);
  }
  EXPECT_NO_THROW(at::ones({2}, at::device(kPhantom1)));
}

TEST(Streams, PoolHandsOutDistinctStreamsAndGuardSetsTheCurrentOne) {
  const auto a = phantom::getStreamFromPool(false, 0);
  const auto b = phantom::getStreamFromPool(false, 0);
  const auto high = phantom::getStreamFromPool(true, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.priority(), phantom::kLowPriority);
  EXPECT_EQ(high.priority(), phantom::kHighPriority);
  EXPECT_EQ(phantom::getCurrentPhantomStream(0),
            phantom::getDefaultPhantomStream(0));
  {
    c10::StreamGuard guard(a.unwrap());
    EXPECT_EQ(phantom::getCurrentPhantomStream(0), a);
  }
  EXPECT_EQ(phantom::getCurrentPhantomStream(0),
            phantom::getDefaultPhantomStream(0));
}

TEST(Streams, CurrentStreamIsPerThread) {
  const auto a = phantom::getStreamFromPool(false, 0);
  phantom::setCurrentPhantomStream(a);
  phantom::PhantomStream seen = a;
  std::thread([&] { seen = phantom::getCurrentPhantomStream(0); }).join();
  EXPECT_EQ(seen, phantom::getDefaultPhantomStream(0));
  EXPECT_EQ(phantom::getCurrentPhantomStream(0), a);
}

TEST(Streams, QueryIsFalseWhileTheLastWorkIsStillRunning) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  StreamBlocker blocker(stream);
  EXPECT_FALSE(stream.query());
  blocker.release();
  stream.synchronize();
  EXPECT_TRUE(stream.query());
}

TEST(Streams, OpsAreQueuedOnTheCurrentStreamAndReturnBeforeTheyRun) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  c10::StreamGuard guard(stream.unwrap());
  at::Tensor x = at::zeros({1024}, at::device(kPhantom0));
  stream.synchronize();
  StreamBlocker blocker(stream);
  x.fill_(3);  // queued behind the blocker: the host must not wait
  EXPECT_FALSE(stream.query());
  blocker.release();
  EXPECT_EQ(x.sum().item<float>(), 3 * 1024);
}

TEST(Events, WaitOrdersWorkAcrossStreams) {
  const auto producer = phantom::getStreamFromPool(false, 0);
  const auto consumer = phantom::getStreamFromPool(false, 0);
  at::Tensor x = at::zeros({16}, at::device(kPhantom0));
  // The zero fill is queued on the default stream, which nothing below
  // orders against the producer: without this wait it could run after the
  // producer's fill_ (it did, about once in 20 runs under ASan).
  phantom::getCurrentPhantomStream(0).synchronize();
  at::Tensor y;
  {
    c10::StreamGuard guard(producer.unwrap());
    StreamBlocker blocker(producer);
    x.fill_(5);  // runs only after the blocker
    c10::Event done(c10::DeviceType::PrivateUse1);
    done.record(producer.unwrap());
    EXPECT_FALSE(done.query());
    done.block(consumer.unwrap());
    c10::StreamGuard consumer_guard(consumer.unwrap());
    y = at::empty({16}, at::device(kPhantom0));
    y.copy_(x);  // queued on the consumer, after the wait
    EXPECT_FALSE(consumer.query());
    blocker.release();
    consumer.synchronize();
    EXPECT_TRUE(done.query());
  }
  EXPECT_TRUE(at::equal(y.cpu(), at::full({16}, 5.0)));
}

TEST(Events, ElapsedTimeNeedsTimingAndMeasuresQueuedWork) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  c10::Event start(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event end(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  start.record(stream.unwrap());
  phantom::launchAsync(stream, "sleep", [] { std::this_thread::sleep_for(20ms); });
  end.record(stream.unwrap());
  end.synchronize();
  EXPECT_GE(start.elapsedTime(end), 15.0);

  c10::Event untimed(c10::DeviceType::PrivateUse1);
  untimed.record(stream.unwrap());
  untimed.synchronize();
  EXPECT_THROW(start.elapsedTime(untimed), c10::Error);
}

TEST(Launch, AnErrorInAsyncWorkIsReportedOnceNamingTheWorkThenTheStreamGoesOn) {
  const auto stream = phantom::getStreamFromPool(false, 1);
  phantom::launchAsync(stream, "exploding kernel",
                       [] { throw std::runtime_error("boom"); });
  bool ran_after_failure = false;
  phantom::launchAsync(stream, "behind the failure",
                       [&] { ran_after_failure = true; });
  try {
    stream.synchronize();
    FAIL() << "expected the work's error";
  } catch (const c10::AcceleratorError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("exploding kernel"), std::string::npos) << message;
    EXPECT_NE(message.find("boom"), std::string::npos) << message;
  }
  // Work queued behind the failure was discarded, as on a GPU.
  EXPECT_FALSE(ran_after_failure);
  // Reported once; the stream then runs new work normally.
  EXPECT_TRUE(stream.query());
  bool ran = false;
  phantom::launchAsync(stream, "after the report", [&] { ran = true; });
  stream.synchronize();
  EXPECT_TRUE(ran);
}

// What a launch's closure holds was made on the host, and is destroyed on
// the host (Launch.h, releaseFinishedWork), not on the stream's worker:
// by the next launch, or by the synchronize that waited for the work.
TEST(Launch, FinishedClosuresAreDestroyedOnTheHostBySynchronize) {
  struct Destroyed {
    std::thread::id on;
    bool happened = false;
  };
  struct Witness {  // held by a shared_ptr: destroyed with the closure
    explicit Witness(Destroyed* d) : destroyed(d) {}
    ~Witness() {
      destroyed->on = std::this_thread::get_id();
      destroyed->happened = true;
    }
    Destroyed* destroyed;
  };
  const auto stream = phantom::getStreamFromPool(false, 0);
  Destroyed first;
  Destroyed second;
  std::thread::id ran_on;
  phantom::launchAsync(stream, "holds a witness",
                       [witness = std::make_shared<Witness>(&first), &ran_on] {
                         ran_on = std::this_thread::get_id();
                       });
  // Polled first: a synchronize may run queued work on the waiting thread
  // (the fake's waiters run the queue), and this checks where the closure
  // is destroyed when the work ran on the worker.
  while (!stream.query()) std::this_thread::yield();
  stream.synchronize();
  EXPECT_TRUE(first.happened) << "synchronize left the finished closure alive";
  EXPECT_EQ(first.on, std::this_thread::get_id());
  EXPECT_NE(ran_on, std::this_thread::get_id()) << "the work ran on the host";

  phantom::launchAsync(stream, "holds another",
                       [witness = std::make_shared<Witness>(&second)] {});
  while (!stream.query()) std::this_thread::yield();
  phantom::launchAsync(stream, "reaps", [] {});  // the launch reaps
  EXPECT_TRUE(second.happened);
  EXPECT_EQ(second.on, std::this_thread::get_id());
  stream.synchronize();
}

TEST(Launch, DeviceSynchronizeReportsTheErrorOfAnyStream) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  phantom::launchAsync(stream, "failing kernel",
                       [] { throw std::runtime_error("bad index"); });
  try {
    phantom::synchronizeDevice(0);
    FAIL() << "expected the work's error";
  } catch (const c10::AcceleratorError& e) {
    EXPECT_NE(std::string(e.what()).find("failing kernel"), std::string::npos);
  }
  EXPECT_NO_THROW(phantom::synchronizeDevice(0));
}

TEST(Launch, AnExceptionInWaitedWorkIsRethrownAndTheStreamGoesOn) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  EXPECT_THROW(phantom::launchAndWait(stream, "bad shape",
                                      [] { TORCH_CHECK_INDEX(false, "idx"); }),
               c10::IndexError);
  bool ran = false;
  phantom::launchAndWait(stream, "fine", [&] { ran = true; });
  EXPECT_TRUE(ran);
}

TEST(Launch, WaitedWorkLeavesTheCallersDeviceAndStreamAsTheyWere) {
  // The driver may run waited work on the calling thread; the work makes
  // its stream's device and the stream current, and must put back the
  // caller's afterwards.
  const c10::DeviceGuard device_guard(kPhantom0);
  const auto caller_stream = phantom::getCurrentPhantomStream(0);
  const auto other_device_stream = phantom::getCurrentPhantomStream(1);
  const auto work_stream = phantom::getStreamFromPool(false, 1);
  c10::DeviceIndex device_in_work = -1;
  c10::StreamId stream_in_work = -1;
  phantom::launchAndWait(work_stream, "look", [&] {
    device_in_work = phantom::currentDevice();
    stream_in_work = phantom::getCurrentPhantomStream(1).id();
  });
  EXPECT_EQ(device_in_work, 1);
  EXPECT_EQ(stream_in_work, work_stream.id());
  EXPECT_EQ(phantom::currentDevice(), 0);
  EXPECT_EQ(phantom::getCurrentPhantomStream(0), caller_stream);
  EXPECT_EQ(phantom::getCurrentPhantomStream(1), other_device_stream);
}

// The CPU kernels' large allocations made as device work come from a
// cache (KernelHostMemory.h): freed, they are handed to the next call
// instead of going back to the OS. The host's own allocations, and small
// ones, are left to the CPU allocator.
TEST(KernelHostMemory, DeviceWorkReusesLargeHostBlocksAndTheHostDoesNot) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  phantom::launchAndWait(stream, "warm up", [] {});  // installs the cache
  phantom::releaseKernelHostMemory();
  const auto before = phantom::kernelHostMemoryStats();
  const size_t big = phantom::kMinCachedBytes * 4 + 123;
  for (int call = 0; call < 3; ++call) {
    phantom::launchAndWait(stream, "kernel", [&] {
      at::Tensor scratch = at::empty({static_cast<int64_t>(big)}, at::kByte);
      scratch.fill_(static_cast<uint8_t>(call));
      at::Tensor small = at::empty({1024}, at::kByte);  // left to the CPU's
      // oneDNN allocates its buffers through raw_allocate/raw_deallocate.
      c10::Allocator* cpu = c10::GetCPUAllocator();
      void* raw = cpu->raw_allocate(big);
      static_cast<char*>(raw)[big - 1] = 1;
      cpu->raw_deallocate(raw);
    });
  }
  auto after = phantom::kernelHostMemoryStats();
  EXPECT_EQ(after.fresh - before.fresh, 2u)
      << "the first call allocates the tensor and the raw buffer";
  EXPECT_EQ(after.reused - before.reused, 4u) << "later calls reuse both";
  EXPECT_EQ(after.live_blocks, before.live_blocks);
  EXPECT_EQ(after.cached_blocks, 2u);

  // On the host: neither a large tensor nor a raw buffer touches the cache.
  {
    at::Tensor host = at::empty({static_cast<int64_t>(big)}, at::kByte);
    void* raw = c10::GetCPUAllocator()->raw_allocate(big);
    c10::GetCPUAllocator()->raw_deallocate(raw);
  }
  const auto host = phantom::kernelHostMemoryStats();
  EXPECT_EQ(host.fresh, after.fresh);
  EXPECT_EQ(host.reused, after.reused);

  // A block made by device work and freed on the host goes back as well.
  at::Tensor escaped;
  phantom::launchAndWait(stream, "kernel", [&] {
    escaped = at::empty({static_cast<int64_t>(big)}, at::kByte);
  });
  EXPECT_EQ(phantom::kernelHostMemoryStats().live_blocks, after.live_blocks + 1);
  escaped.reset();
  EXPECT_EQ(phantom::kernelHostMemoryStats().live_blocks, after.live_blocks);

  phantom::deviceAllocator().emptyCache();  // torch.phantom.empty_cache()
  EXPECT_EQ(phantom::kernelHostMemoryStats().cached_bytes, 0u);
  EXPECT_EQ(phantom::kernelHostMemoryStats().cached_blocks, 0u);
}

// Lending (KernelHostMemory.h): inside device work, memory offered by a
// LendingScope serves the next CPU allocation of exactly its size, once,
// so a kernel computes its result there; freeing that allocation (as a
// tensor or a raw buffer) leaves the memory to its owner. Other sizes, a
// second allocation, allocations after close() and on the host are the
// CPU allocator's, and two offers of one size are both withdrawn (either
// result could land in either block). Here the "device output" is a host
// buffer the test owns: were the allocator to free it, the vector's own
// free would fail.
TEST(KernelHostMemory, LendingServesOneAllocationOfTheOfferedSizeAtATime) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  phantom::launchAndWait(stream, "warm up", [] {});  // installs the cache
  const size_t size = phantom::kMinCachedBytes * 2;
  const auto bytes = [](size_t n) { return static_cast<int64_t>(n); };
  std::vector<char> output(size), small(1024), same_a(size * 3), same_b(size * 3);
  const uint64_t lent_before = phantom::kernelHostMemoryStats().lent;
  phantom::launchAndWait(stream, "kernel", [&] {
    phantom::LendingScope lending;
    EXPECT_TRUE(lending.accepts(size));
    EXPECT_FALSE(lending.accepts(small.size()));
    EXPECT_TRUE(lending.offer(output.data(), size));
    EXPECT_FALSE(lending.offer(small.data(), small.size())) << "below kMinCachedBytes";
    EXPECT_TRUE(lending.offer(same_a.data(), same_a.size()));
    EXPECT_FALSE(lending.offer(same_b.data(), same_b.size()));
    at::Tensor of_withdrawn_size = at::empty({bytes(same_a.size())}, at::kByte);
    EXPECT_NE(of_withdrawn_size.data_ptr(), static_cast<void*>(same_a.data()));
    EXPECT_NE(of_withdrawn_size.data_ptr(), static_cast<void*>(same_b.data()));
    // A scratch buffer of the size takes the block first; once it is
    // freed, the block serves the next allocation: the result.
    at::Tensor scratch = at::empty({bytes(size)}, at::kByte);
    EXPECT_EQ(scratch.data_ptr(), static_cast<void*>(output.data()));
    scratch.fill_(7);
    scratch.reset();
    at::Tensor result = at::empty({bytes(size / sizeof(float))}, at::kFloat);
    EXPECT_EQ(result.data_ptr(), static_cast<void*>(output.data()))
        << "lent again once the scratch buffer was freed";
    result.fill_(2.0f);
    at::Tensor second = at::empty({bytes(size / sizeof(float))}, at::kFloat);
    EXPECT_NE(second.data_ptr(), static_cast<void*>(output.data()))
        << "one allocation at a time";
    result.reset();
    lending.close();
    EXPECT_FALSE(lending.lentBlockStillAlive());
  });
  EXPECT_EQ(reinterpret_cast<const float*>(output.data())[0], 2.0f)
      << "the kernel's result is in the lent memory";
  EXPECT_EQ(phantom::kernelHostMemoryStats().lent - lent_before, 2u);

  // oneDNN allocates through raw_allocate; raw_deallocate must not free.
  phantom::launchAndWait(stream, "kernel", [&] {
    phantom::LendingScope lending;
    ASSERT_TRUE(lending.offer(output.data(), size));
    c10::Allocator* cpu = c10::GetCPUAllocator();
    void* raw = cpu->raw_allocate(size);
    EXPECT_EQ(raw, static_cast<void*>(output.data()));
    cpu->raw_deallocate(raw);
    EXPECT_FALSE(lending.lentBlockStillAlive());
  });

  // Closed, nothing is lent; on the host, nothing is offered.
  phantom::launchAndWait(stream, "kernel", [&] {
    phantom::LendingScope lending;
    ASSERT_TRUE(lending.offer(output.data(), size));
    lending.close();
    at::Tensor after = at::empty({bytes(size)}, at::kByte);
    EXPECT_NE(after.data_ptr(), static_cast<void*>(output.data()));
  });
  phantom::LendingScope on_host;
  EXPECT_FALSE(on_host.accepts(size));
  EXPECT_FALSE(on_host.offer(output.data(), size));
  EXPECT_EQ(phantom::kernelHostMemoryStats().lent - lent_before, 3u);
}

// A kernel that keeps a buffer past its return (a cache) in lent memory
// would share the device output with it: the scope reports it, so the op
// can fail instead of handing out that output.
TEST(KernelHostMemory, LendingReportsABufferTheKernelKept) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  const size_t size = phantom::kMinCachedBytes * 2;
  std::vector<char> output(size);
  at::Tensor kept;
  bool reported = false;
  std::string message;
  phantom::launchAndWait(stream, "kernel", [&] {
    phantom::LendingScope lending;
    ASSERT_TRUE(lending.offer(output.data(), size));
    kept = at::empty({static_cast<int64_t>(size)}, at::kByte);
    ASSERT_EQ(kept.data_ptr(), static_cast<void*>(output.data()));
    lending.close();
    reported = lending.lentBlockStillAlive();
    try {
      lending.requireNothingKept("aten::kept_op");
    } catch (const c10::Error& error) {
      message = error.what_without_backtrace();
    }
  });
  EXPECT_TRUE(reported);
  EXPECT_NE(message.find("aten::kept_op's CPU kernel kept a buffer"), std::string::npos)
      << message;
  EXPECT_NE(message.find("PHANTOM_NO_LENDING=1"), std::string::npos) << message;
  kept.reset();  // forgets the block; the vector still owns it
  // Freed, nothing is kept any more.
  phantom::launchAndWait(stream, "kernel", [&] {
    phantom::LendingScope lending;
    ASSERT_TRUE(lending.offer(output.data(), size));
    at::Tensor result = at::empty({static_cast<int64_t>(size)}, at::kByte);
    result.reset();
    lending.close();
    EXPECT_NO_THROW(lending.requireNothingKept("aten::tidy_op"));
  });
}

TEST(Allocator, IsTheDeviceAllocatorAndAccountsEveryByte) {
  c10::DeviceAllocator* allocator =
      c10::getDeviceAllocator(c10::DeviceType::PrivateUse1);
  EXPECT_EQ(allocator, &phantom::deviceAllocator());
  const int64_t before = allocatedBytes(1);
  {
    at::Tensor x = at::empty({1000}, at::device(kPhantom1));
    // Sizes are rounded up to 512-byte blocks; the request is kept too.
    EXPECT_EQ(allocatedBytes(1), before + 4096);
    EXPECT_EQ(phantom::deviceAllocator().getDeviceStats(1).requested_bytes[0].current,
              4000);
    auto [free_bytes, total] = allocator->getMemoryInfo(1);
    EXPECT_EQ(total, 256u << 20);
    EXPECT_LT(free_bytes, total);
  }
  EXPECT_EQ(allocatedBytes(1), before);
}

TEST(Allocator, OutOfMemoryIsTypedCarriesTheAccountingAndIsRecoverable) {
  const int64_t before = allocatedBytes(0);
  try {
    at::empty({512 << 20}, at::device(kPhantom0));  // 2 GiB of float
    FAIL() << "expected out of memory";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what();
    for (const char* part : {"tried to allocate", "capacity", "allocated",
                             "reserved", "free", "PHANTOM_DEVICE_MEMORY"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << ": " << message;
    }
  }
  EXPECT_EQ(allocatedBytes(0), before);
  EXPECT_NO_THROW(at::empty({1 << 20}, at::device(kPhantom0)));
}

TEST(Allocator, MemoryReleasedByDeviceWorkIsFreedWithoutDeadlock) {
  const auto stream = phantom::getStreamFromPool(false, 0);
  const int64_t before = allocatedBytes(0);
  {
    at::Tensor x = at::empty({4096}, at::device(kPhantom0));
    // The work holds the last reference: it is dropped on the worker.
    phantom::launchAsync(stream, "hold", [x] {});
  }
  stream.synchronize();
  phantom::deviceAllocator().emptyCache();
  EXPECT_EQ(allocatedBytes(0), before);
}

int64_t reservedBytes(c10::DeviceIndex device) {
  return phantom::deviceAllocator()
      .getDeviceStats(device)
      .reserved_bytes[0]
      .current;
}

TEST(CachingAllocator, ReusesAFreedBlockOnTheSameStreamWithoutTheDriver) {
  void* first = nullptr;
  {
    at::Tensor x = at::empty({256}, at::device(kPhantom0));
    first = x.data_ptr();
  }
  const auto driver_allocs =
      phantom::deviceAllocator().getDeviceStats(0).num_device_alloc;
  at::Tensor y = at::empty({256}, at::device(kPhantom0));
  EXPECT_EQ(y.data_ptr(), first);
  EXPECT_EQ(phantom::deviceAllocator().getDeviceStats(0).num_device_alloc,
            driver_allocs);
}

TEST(CachingAllocator, SmallRequestsShareASegmentAndMergeBackOnFree) {
  phantom::deviceAllocator().emptyCache();
  const int64_t reserved_before = reservedBytes(0);
  {
    at::Tensor a = at::empty({1000}, at::device(kPhantom0));
    at::Tensor b = at::empty({1000}, at::device(kPhantom0));
    // Both carved out of one 2 MiB small segment, next to each other.
    EXPECT_EQ(reservedBytes(0), reserved_before + int64_t(phantom::kSmallBuffer));
    EXPECT_EQ(static_cast<char*>(b.data_ptr()) - static_cast<char*>(a.data_ptr()),
              4096);
    const auto stats = phantom::deviceAllocator().getDeviceStats(0);
    EXPECT_EQ(stats.inactive_split[0].current, 1);  // the rest of the segment
  }
  auto stats = phantom::deviceAllocator().getDeviceStats(0);
  EXPECT_EQ(stats.inactive_split[0].current, 0);  // merged back whole
  phantom::deviceAllocator().emptyCache();
  EXPECT_EQ(reservedBytes(0), reserved_before);
}

TEST(CachingAllocator, SmallRequestsGetTheSmallestFreeBlockThatFits) {
  // Free holes of 4 KiB, 600 KiB and 16 KiB, kept apart by live blocks so
  // they cannot merge; the bins are exact sizes, so every request must land
  // in the smallest hole that holds it, including a search that has to
  // skip hundreds of empty bins (64 KiB -> 600 KiB).
  phantom::deviceAllocator().emptyCache();
  const auto bytes = [](int64_t n) {
    return at::empty({n}, at::device(kPhantom0).dtype(at::kByte));
  };
  at::Tensor hole_4k = bytes(4 << 10);
  at::Tensor guard_1 = bytes(512);
  at::Tensor hole_600k = bytes(600 << 10);
  at::Tensor guard_2 = bytes(512);
  at::Tensor hole_16k = bytes(16 << 10);
  at::Tensor guard_3 = bytes(512);
  void* const at_4k = hole_4k.data_ptr();
  void* const at_600k = hole_600k.data_ptr();
  void* const at_16k = hole_16k.data_ptr();
  hole_4k.reset();
  hole_600k.reset();
  hole_16k.reset();

  at::Tensor a = bytes(10 << 10);   // 4 KiB is too small: the 16 KiB hole
  at::Tensor b = bytes(3 << 10);    // the 4 KiB hole
  at::Tensor c = bytes(64 << 10);   // only the 600 KiB hole is left
  EXPECT_EQ(a.data_ptr(), at_16k);
  EXPECT_EQ(b.data_ptr(), at_4k);
  EXPECT_EQ(c.data_ptr(), at_600k);
}

TEST(CachingAllocator, AFreedBlockIsNotHandedToAnotherStream) {
  const auto other = phantom::getStreamFromPool(false, 0);
  void* first = nullptr;
  {
    at::Tensor x = at::empty({4096}, at::device(kPhantom0));
    first = x.data_ptr();
  }
  c10::StreamGuard guard(other.unwrap());
  at::Tensor y = at::empty({4096}, at::device(kPhantom0));
  EXPECT_NE(y.data_ptr(), first);
}

TEST(CachingAllocator, RecordStreamKeepsMemoryUntilTheOtherStreamIsDone) {
  const auto side = phantom::getStreamFromPool(false, 0);
  at::Tensor result = at::zeros({1 << 16}, at::device(kPhantom0));
  void* first = nullptr;
  at::Tensor y;
  {
    at::Tensor x = at::full({1 << 16}, 7.0, at::device(kPhantom0));
    first = x.data_ptr();
    phantom::getCurrentPhantomStream(0).synchronize();
    StreamBlocker blocker(side);
    {
      c10::StreamGuard guard(side.unwrap());
      result.copy_(x);  // queued on the side stream behind the blocker
    }
    x.record_stream(side.unwrap());
    x.reset();  // freed on the host while the side stream still needs it
    y = at::full({1 << 16}, 1.0, at::device(kPhantom0));
    EXPECT_NE(y.data_ptr(), first) << "block reused before the side stream ran";
    blocker.release();
    side.synchronize();
  }
  EXPECT_EQ(result.sum().item<double>(), 7.0 * (1 << 16));
  // Once the side stream has passed, the block goes back to its pool: the
  // next request of its size on its stream gets it (y, alive, holds the
  // only other block of that size; the rest of the segment is larger).
  at::Tensor z = at::empty({1 << 16}, at::device(kPhantom0));
  EXPECT_EQ(z.data_ptr(), first) << "the block was not returned to its pool";
}

TEST(CachingAllocator, OutOfMemoryFreesTheCacheAndRetriesFirst) {
  // 256 MiB device: cache 200 MiB, free it, then ask for 200 MiB again on
  // another stream, which cannot reuse the cached block.
  { at::Tensor big = at::empty({50 << 20}, at::device(kPhantom0)); }
  EXPECT_GE(reservedBytes(0), 200 << 20);
  const auto other = phantom::getStreamFromPool(false, 0);
  c10::StreamGuard guard(other.unwrap());
  at::Tensor again = at::empty({50 << 20}, at::device(kPhantom0));
  const auto stats = phantom::deviceAllocator().getDeviceStats(0);
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_ooms, 0);
}

TEST(CachingAllocator, SettingsAreParsedAndBadOnesAreClearErrors) {
  auto settings = phantom::parseAllocatorSettings(
      "max_split_size_mb:64,garbage_collection_threshold:0.5");
  EXPECT_EQ(settings.max_split_size, size_t{64} << 20);
  EXPECT_DOUBLE_EQ(settings.garbage_collection_threshold, 0.5);
  EXPECT_EQ(phantom::parseAllocatorSettings("").max_split_size, SIZE_MAX);
  // Spelled as every PHANTOM_* value may be (phantom/common/settings.h).
  settings = phantom::parseAllocatorSettings(" MAX_SPLIT_SIZE_MB : 64 ");
  EXPECT_EQ(settings.max_split_size, size_t{64} << 20);
  for (const char* bad : {"max_split_size_mb:abc", "max_split_size_mb:4",
                          "garbage_collection_threshold:1.5", "bogus:1",
                          "max_split_size_mb",
                          "max_split_size_mb:99999999999999999999"}) {
    try {
      phantom::parseAllocatorSettings(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const c10::ValueError& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_EQ(message.rfind(std::string("PHANTOM_ALLOC_CONF='") + bad + "' is not ", 0), 0u)
          << message;
      EXPECT_NE(message.find("unset it for the default"), std::string::npos) << message;
    }
  }
}

TEST(Generator, SameSeedDrawsTheCpuNumbers) {
  at::manual_seed(42);  // seeds CPU and every phantom device
  at::Tensor cpu = at::randn({64});
  at::manual_seed(42);
  at::Tensor phantom = at::randn({64}, at::device(kPhantom1));
  EXPECT_TRUE(at::equal(phantom.cpu(), cpu));
}

// Draws queued on two streams run in the order they were queued, and the
// host's view of the generator waits for them (phantom/Generator.h).
TEST(Generator, QueuedDrawsRunInHostOrderAcrossStreamsAndStateWaitsForThem) {
  at::Generator generator = phantom::newGenerator(0);
  auto* impl = generator.get<phantom::PhantomGeneratorImpl>();
  const auto slow = phantom::getStreamFromPool(false, 0);
  const auto idle = phantom::getStreamFromPool(false, 0);
  std::mutex mutex;
  std::vector<int> order;
  auto draw = [&](const phantom::PhantomStream& stream, int id) {
    impl->queueDraw(stream, [&, id] {
      phantom::launchAsync(stream, "test draw", [&, id] {
        std::lock_guard<std::mutex> lock(mutex);
        order.push_back(id);
      });
    });
  };
  StreamBlocker blocker(slow);
  draw(slow, 1);  // behind the blocker
  draw(idle, 2);  // an idle stream: must still wait for draw 1
  std::this_thread::sleep_for(20ms);
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_TRUE(order.empty()) << "draw 2 overtook draw 1";
  }
  std::thread release([&] {
    std::this_thread::sleep_for(20ms);
    blocker.release();
  });
  generator.get_state();  // waits for both draws
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(order, (std::vector<int>{1, 2}));
  }
  release.join();
}

TEST(Ops, ComputeOnTheDeviceAndMatchTheCpu) {
  at::Tensor a = at::randn({8, 16});
  at::Tensor b = at::randn({16, 4});
  at::Tensor result = at::relu(at::mm(a.to(kPhantom0), b.to(kPhantom0)) + 1);
  EXPECT_EQ(result.device(), kPhantom0);
  EXPECT_TRUE(at::allclose(result.cpu(), at::relu(at::mm(a, b) + 1)));
}

}  // namespace
