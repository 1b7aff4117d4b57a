// Tests of the fake driver's work machinery, below what hal.h promises:
// waited work run on the caller, queued work run by a waiting host
// thread, the launch queue's overflow (copies and fills queued as plain
// data among kernels), copy validation's messages, the copy
// channels, the activity meters, process exit with live streams, and how a
// failure travels along events (its messages, and random graphs run from
// several threads, which the TSan build checks for races). Links the
// driver's objects directly, so private headers are fair game.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

/* ---- Running waited work on the caller -------------------------------- */

struct ThreadProbe {
  std::thread::id ran_on;
};

ph_status_t RecordThread(void* user_data, char*, size_t) {
  static_cast<ThreadProbe*>(user_data)->ran_on = std::this_thread::get_id();
  return PH_SUCCESS;
}

// The fake's promise behind ph_run_host_func's speed: the task runs on the
// calling thread, at once on an idle stream (no hand-off) and after the
// queued work on a busy one (one hand-off, the queued work's completion,
// instead of two: the worker never sees the task). What `.item()` after a
// kernel makes is such a blocking copy on a busy stream.
TEST(RunHostFunc, RunsOnTheCallerWhenIdleAndAfterTheQueuedWorkWhenBusy) {
  ph_stream_t stream = nullptr;
  ASSERT_EQ(ph_stream_create(0, 0, &stream), PH_SUCCESS);
  ThreadProbe idle;
  const ph_host_task_t on_idle = {"idle", RecordThread, nullptr, &idle};
  ASSERT_EQ(ph_run_host_func(stream, &on_idle), PH_SUCCESS);
  EXPECT_EQ(idle.ran_on, std::this_thread::get_id());

  struct Gate {
    std::atomic<bool> open{false};
    std::atomic<bool> finished{false};
    bool finished_before_busy = false;
    std::thread::id busy_ran_on;
  } gate;
  ph_host_task_t gate_task = {};
  gate_task.name = "gate";
  gate_task.user_data = &gate;
  gate_task.run = [](void* data, char*, size_t) {
    auto* g = static_cast<Gate*>(data);
    while (!g->open.load()) std::this_thread::yield();
    g->finished = true;
    return PH_SUCCESS;
  };
  ASSERT_EQ(ph_launch_host_func(stream, &gate_task), PH_SUCCESS);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.open = true;
  });
  ph_host_task_t on_busy = {};
  on_busy.name = "busy";
  on_busy.user_data = &gate;
  on_busy.run = [](void* data, char*, size_t) {
    auto* g = static_cast<Gate*>(data);
    g->finished_before_busy = g->finished.load();
    g->busy_ran_on = std::this_thread::get_id();
    return PH_SUCCESS;
  };
  ASSERT_EQ(ph_run_host_func(stream, &on_busy), PH_SUCCESS);
  EXPECT_TRUE(gate.finished_before_busy);
  EXPECT_EQ(gate.busy_ran_on, std::this_thread::get_id());
  EXPECT_EQ(ph_stream_query(stream), PH_SUCCESS);
  opener.join();
  EXPECT_EQ(ph_stream_destroy(stream), PH_SUCCESS);
}

/* ---- Launch queue ------------------------------------------------------ */

// A task that spins until *flag is true: holds its stream's worker.
ph_host_task_t SpinGate(std::atomic<bool>* flag) {
  ph_host_task_t gate = {};
  gate.name = "gate";
  gate.user_data = flag;
  gate.run = [](void* open, char*, size_t) {
    while (!static_cast<std::atomic<bool>*>(open)->load()) {
      std::this_thread::yield();
    }
    return PH_SUCCESS;
  };
  return gate;
}

// Counts the tasks that ran and checks they ran in launch order.
struct OrderProbe {
  std::atomic<int> next{0};
  std::atomic<int> out_of_order{0};
};

struct OrderedTask {
  OrderProbe* probe;
  int index;
};

ph_host_task_t Ordered(OrderProbe* probe, int index) {
  ph_host_task_t task = {};
  task.name = "ordered";
  task.user_data = new OrderedTask{probe, index};
  task.run = [](void* data, char*, size_t) {
    auto* self = static_cast<OrderedTask*>(data);
    if (self->probe->next.fetch_add(1) != self->index) {
      self->probe->out_of_order++;
    }
    return PH_SUCCESS;
  };
  task.release = [](void* data) { delete static_cast<OrderedTask*>(data); };
  return task;
}

// The ring holds kLaunchQueueSlots tasks; more pending tasks overflow and
// still run, in order. A launch never waits for room: it may be made under
// a lock the stream's work needs (the caching allocator records events
// under its mutex), so here every launch returns while the worker is held.
TEST(LaunchQueue, MoreTasksThanTheRingHoldsOverflowAndRunInOrder) {
  constexpr int kTasks = 3 * static_cast<int>(kLaunchQueueSlots) + 7;
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  std::atomic<bool> open{false};
  const ph_host_task_t gate = SpinGate(&open);
  ASSERT_PH_OK(ph_launch_host_func(stream, &gate));
  OrderProbe probe;
  std::atomic<int> launched{0};
  std::thread launcher([&] {
    for (int i = 0; i < kTasks; ++i) {
      const ph_host_task_t task = Ordered(&probe, i);
      ASSERT_PH_OK(ph_launch_host_func(stream, &task));
      launched++;
    }
  });
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (launched.load() < kTasks &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(launched.load(), kTasks) << "a launch waited for room";
  EXPECT_EQ(probe.next.load(), 0) << "work ran past the gate";
  open = true;
  launcher.join();
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(probe.next.load(), kTasks);
  EXPECT_EQ(probe.out_of_order.load(), 0);
  EXPECT_EQ(ph_stream_destroy(stream), PH_SUCCESS);
}

// Work may queue more than the ring holds onto its own stream: it cannot
// wait for its own worker, and does not have to.
TEST(LaunchQueue, WorkMayQueueMoreThanTheRingHoldsOntoItsOwnStream) {
  constexpr int kTasks = static_cast<int>(kLaunchQueueSlots) + 100;
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  struct Outcome {
    ph_stream_t stream;
    OrderProbe probe;
    int accepted = 0;
  } outcome;
  outcome.stream = stream;
  ph_host_task_t filler = {};
  filler.name = "filler";
  filler.user_data = &outcome;
  filler.run = [](void* data, char* error, size_t error_size) {
    auto* out = static_cast<Outcome*>(data);
    for (int i = 0; i < kTasks; ++i) {
      const ph_host_task_t task = Ordered(&out->probe, i);
      const ph_status_t status = ph_launch_host_func(out->stream, &task);
      if (status != PH_SUCCESS) {
        std::snprintf(error, error_size, "%s", ph_last_error_message());
        return status;
      }
      out->accepted++;
    }
    return PH_SUCCESS;
  };
  ASSERT_PH_OK(ph_launch_host_func(stream, &filler));
  ASSERT_PH_OK(ph_stream_synchronize(stream));  // the filler has finished:
  ASSERT_PH_OK(ph_stream_synchronize(stream));  // and now what it queued
  EXPECT_EQ(outcome.accepted, kTasks);
  EXPECT_EQ(outcome.probe.next.load(), kTasks);
  EXPECT_EQ(outcome.probe.out_of_order.load(), 0);
  EXPECT_EQ(ph_stream_destroy(stream), PH_SUCCESS);
}

// Copies and fills are queued as plain data (no closure), kernels as the
// caller's struct: mixed in one queue, through the ring and its overflow,
// each runs its own bytes in launch order. Round i fills block i of a
// device buffer, copies it to block i of pinned memory, and then a host
// task checks that block, so a fill or copy run late, early, twice or
// with another task's fields shows as a wrong byte.
TEST(LaunchQueue, CopiesFillsAndKernelsQueuedTogetherRunInOrder) {
  constexpr int kRounds = static_cast<int>(kLaunchQueueSlots) / 2 + 50;
  constexpr size_t kBlock = 64;
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  void* device = nullptr;
  void* host = nullptr;
  ASSERT_PH_OK(ph_malloc(0, kRounds * kBlock, &device));
  ASSERT_PH_OK(ph_host_malloc(kRounds * kBlock, &host));
  std::memset(host, 0, kRounds * kBlock);
  struct Check {
    const unsigned char* block;
    unsigned char expected;
    std::atomic<int>* wrong;
  };
  std::atomic<int> wrong{0};
  std::vector<Check> checks(kRounds);
  std::atomic<bool> open{false};
  const ph_host_task_t gate = SpinGate(&open);
  ASSERT_PH_OK(ph_launch_host_func(stream, &gate));  // all of it queues
  for (int i = 0; i < kRounds; ++i) {
    auto* block = static_cast<unsigned char*>(device) + i * kBlock;
    auto* copy = static_cast<unsigned char*>(host) + i * kBlock;
    const auto byte = static_cast<unsigned char>(i * 7 + 1);
    ASSERT_PH_OK(ph_memset_async(block, byte, kBlock, stream));
    ASSERT_PH_OK(ph_memcpy_async(copy, block, kBlock,
                                 PH_MEMCPY_DEVICE_TO_HOST, stream));
    checks[i] = {copy, byte, &wrong};
    ph_host_task_t check = {};
    check.name = "check";
    check.user_data = &checks[i];
    check.run = [](void* data, char*, size_t) {
      const auto* self = static_cast<Check*>(data);
      for (size_t b = 0; b < kBlock; ++b) {
        if (self->block[b] != self->expected) {
          self->wrong->fetch_add(1);
          break;
        }
      }
      return PH_SUCCESS;
    };
    ASSERT_PH_OK(ph_launch_host_func(stream, &check));
  }
  open = true;
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(wrong.load(), 0) << "blocks that held another round's bytes";
  for (int i = 0; i < kRounds; ++i) {
    EXPECT_EQ(static_cast<unsigned char*>(host)[i * kBlock + kBlock - 1],
              static_cast<unsigned char>(i * 7 + 1))
        << "block " << i;
  }
  EXPECT_EQ(ph_free(device), PH_SUCCESS);
  EXPECT_EQ(ph_host_free(host), PH_SUCCESS);
  EXPECT_EQ(ph_stream_destroy(stream), PH_SUCCESS);
}

// A refused copy or fill says which call and which side was wrong. The
// fake spells these messages out only when a check fails (a copy that
// passes builds no string), so each message is checked whole here.
TEST(CopyValidation, ARefusalNamesTheCallTheSideAndTheRange) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 1024, &device));
  std::vector<char> host(16);
  const auto message = [] { return std::string(ph_last_error_message()); };
  // The last error starts with `start` and then says `why`.
  const auto expect_message = [&](const char* start, const char* why) {
    EXPECT_EQ(message().find(start), 0u) << message();
    EXPECT_NE(message().find(why), std::string::npos) << message();
  };

  EXPECT_EQ(ph_memcpy_async(host.data(), host.data(), 16,
                            PH_MEMCPY_DEVICE_TO_HOST, stream),
            PH_ERROR_INVALID_ARGUMENT);
  expect_message("ph_memcpy_async: source ",
                 "is not device memory, but the copy kind says it is");

  EXPECT_EQ(ph_memcpy_async(device, device, 16, PH_MEMCPY_DEVICE_TO_HOST,
                            stream),
            PH_ERROR_INVALID_ARGUMENT);
  expect_message("ph_memcpy_async: destination ",
                 "is memory of phantom device 0, but the copy kind says it "
                 "is host memory");

  EXPECT_EQ(ph_memset_async(device, 0, 2048, stream),
            PH_ERROR_INVALID_ARGUMENT);
  expect_message("ph_memset_async: destination range of 2048 bytes at ",
                 "runs past the end of its allocation of 1024 bytes on "
                 "phantom device 0");

  EXPECT_EQ(ph_memcpy(nullptr, device, 16, PH_MEMCPY_DEVICE_TO_HOST),
            PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(message(), "ph_memcpy: null destination for a copy of 16 bytes");

  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(ph_free(device), PH_SUCCESS);
  EXPECT_EQ(ph_stream_destroy(stream), PH_SUCCESS);
}

/* ---- Waiters run queued work ------------------------------------------ */

// A task for a Stream used directly: records where and in which order it
// ran, and fails with a sentence when asked to.
struct Probe {
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  int released = 0;
};

Task ProbeTask(Probe* probe, int index, bool fails = false) {
  Task task;
  task.name = fails ? "failing probe" : "probe";
  task.run = [probe, index, fails](char* error, size_t error_size) {
    probe->order.push_back(index);
    probe->threads.push_back(std::this_thread::get_id());
    if (!fails) return PH_SUCCESS;
    std::snprintf(error, error_size, "probe %d failed", index);
    return PH_ERROR_DEVICE;
  };
  task.release = [probe] { probe->released++; };
  return task;
}

// A host thread that waits runs the queued work itself when the worker is
// not running it (here there is no worker at all: the stream is never
// started), in order, each task once, as the stream's work.
TEST(Waiters, AWaitingHostThreadRunsTheQueuedWorkInOrder) {
  Stream stream(0, 0);  // not started: nothing but the waiter runs work
  Probe probe;
  uint64_t generation = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_PH_OK(stream.Enqueue(ProbeTask(&probe, i), true, &generation));
  }
  EXPECT_EQ(stream.Query(), PH_NOT_READY);
  stream.WaitForGeneration(3);  // the first three only
  EXPECT_EQ(probe.order, (std::vector<int>{0, 1, 2}));
  ASSERT_PH_OK(stream.Synchronize());
  EXPECT_EQ(probe.order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(probe.released, 5);
  for (const std::thread::id ran_on : probe.threads) {
    EXPECT_EQ(ran_on, std::this_thread::get_id());
  }
  EXPECT_EQ(stream.Query(), PH_SUCCESS);
  stream.Shutdown();
}

// Work the waiter ran that failed is reported at that wait and after, as
// the worker's failures are: the stream is sticky, later work is released
// without running, and event markers still complete.
TEST(Waiters, AFailureInWorkTheWaiterRanIsStickyAtTheWait) {
  Stream stream(0, 0);
  Probe probe;
  uint64_t generation = 0;
  ASSERT_PH_OK(stream.Enqueue(ProbeTask(&probe, 0), true, &generation));
  ASSERT_PH_OK(stream.Enqueue(ProbeTask(&probe, 1, /*fails=*/true), true,
                              &generation));
  ASSERT_PH_OK(stream.Enqueue(ProbeTask(&probe, 2), true, &generation));
  bool marker_completed = false;
  Task marker;
  marker.kind = TaskKind::kEventMarker;
  marker.runs_when_sticky = true;
  marker.on_complete = [&](ph_status_t failure, const std::string& origin) {
    marker_completed = true;
    EXPECT_EQ(failure, PH_ERROR_DEVICE);
    EXPECT_NE(origin.find("probe 1 failed"), std::string::npos) << origin;
  };
  ASSERT_PH_OK(stream.Enqueue(std::move(marker), false, &generation));
  EXPECT_EQ(stream.Synchronize(), PH_ERROR_DEVICE);
  const std::string message = ph_last_error_message();
  EXPECT_NE(message.find("work 'failing probe' failed on phantom device 0: "
                         "probe 1 failed"),
            std::string::npos)
      << message;
  EXPECT_EQ(probe.order, (std::vector<int>{0, 1}));  // 2 was skipped
  EXPECT_EQ(probe.released, 3);
  EXPECT_TRUE(marker_completed);
  EXPECT_EQ(stream.Query(), PH_ERROR_DEVICE);
  Task refused = ProbeTask(&probe, 3);
  EXPECT_EQ(stream.Enqueue(std::move(refused), true, &generation),
            PH_ERROR_DEVICE);
  stream.Shutdown();
}

// A task that takes long on the worker is not taken over or run twice: the
// wait returns only once it has finished, and the work queued behind it
// then runs once, in order (on the worker or the waiter).
TEST(Waiters, AWaitForAStreamBusyOnALongTaskReturnsAfterIt) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  struct Gate {
    std::atomic<bool> open{false};
    std::atomic<bool> finished{false};
  } gate;
  ph_host_task_t long_task = {};
  long_task.name = "long";
  long_task.user_data = &gate;
  long_task.run = [](void* data, char*, size_t) {
    auto* g = static_cast<Gate*>(data);
    while (!g->open.load()) std::this_thread::yield();
    g->finished = true;
    return PH_SUCCESS;
  };
  ASSERT_PH_OK(ph_launch_host_func(stream, &long_task));
  OrderProbe probe;
  for (int i = 0; i < 8; ++i) {
    const ph_host_task_t task = Ordered(&probe, i);
    ASSERT_PH_OK(ph_launch_host_func(stream, &task));
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.open = true;
  });
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_TRUE(gate.finished.load());
  EXPECT_EQ(probe.next.load(), 8);
  EXPECT_EQ(probe.out_of_order.load(), 0);
  opener.join();
  EXPECT_EQ(ph_stream_destroy(stream), PH_SUCCESS);
}

// Several host threads launching and waiting on one stream at once (the
// waiters and the worker taking turns at the queue): every task runs
// exactly once, and each thread's tasks in the order it launched them.
TEST(Waiters, ThreadsThatLaunchAndWaitTogetherRunEveryTaskOnceInOrder) {
  constexpr int kThreads = 3;
  constexpr int kRounds = 300;
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  OrderProbe probes[kThreads];
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const ph_host_task_t task = Ordered(&probes[t], i);
        ASSERT_PH_OK(ph_launch_host_func(stream, &task));
        if (i % 3 == 0) ASSERT_PH_OK(ph_stream_synchronize(stream));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  for (const OrderProbe& probe : probes) {
    EXPECT_EQ(probe.next.load(), kRounds);
    EXPECT_EQ(probe.out_of_order.load(), 0);
  }
  EXPECT_EQ(ph_stream_destroy(stream), PH_SUCCESS);
}

/* ---- Copy channels ----------------------------------------------------- */

// Bytes that differ from page to page (a pattern with a short period would
// hide a half copied to the wrong place).
std::vector<unsigned char> Unrepeating(size_t size, uint32_t seed) {
  std::vector<unsigned char> bytes(size);
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    bytes[i] = static_cast<unsigned char>(state);
  }
  return bytes;
}

TEST(CopyChannels, LargeCopiesAreSharedByTwoChannelsAndEveryByteArrives) {
  // Sizes that are not a whole number of 2 MiB chunks end in a short one.
  for (size_t size : {kSplitCopyBytes, 2 * kSplitCopyBytes + 12345, size_t{64} << 20}) {
    const auto src = Unrepeating(size, static_cast<uint32_t>(size));
    int shared = 0;
    for (int attempt = 0; attempt < 5; ++attempt) {
      std::vector<unsigned char> dst(size, 0);
      // 1 only if the caller took every chunk before the helper woke.
      shared += ChannelCopy(dst.data(), src.data(), size) == 2;
      EXPECT_TRUE(dst == src) << size << " bytes did not arrive intact";
    }
    // The helper sleeps between copies; a small split copy may be over
    // before it wakes on a loaded machine, a 64 MiB one (~5 ms) is not.
    if (size >= (size_t{64} << 20)) {
      EXPECT_GT(shared, 0) << "the helper never took part in a " << size << "-byte copy";
    }
  }
}

TEST(CopyChannels, SmallAndOverlappingCopiesKeepMemmoveOnOneChannel) {
  const size_t small = kSplitCopyBytes - 1;
  const auto src = Unrepeating(small, 7);
  std::vector<unsigned char> dst(small, 0);
  EXPECT_EQ(ChannelCopy(dst.data(), src.data(), small), 1);
  EXPECT_TRUE(dst == src);

  // A D2D copy inside one allocation may overlap, in either direction;
  // split in two it would read bytes its other half already overwrote.
  const size_t size = 2 * kSplitCopyBytes;
  const size_t shift = kSplitCopyBytes / 2 + 3;
  for (bool forward : {true, false}) {
    auto buffer = Unrepeating(size + shift, forward ? 11 : 12);
    auto expected = buffer;
    unsigned char* from = buffer.data() + (forward ? 0 : shift);
    unsigned char* to = buffer.data() + (forward ? shift : 0);
    std::memmove(expected.data() + (to - buffer.data()),
                 expected.data() + (from - buffer.data()), size);
    EXPECT_EQ(ChannelCopy(to, from, size), 1);
    EXPECT_TRUE(buffer == expected) << (forward ? "forward" : "backward");
  }
}

// Streaming stores write whole aligned lines; the bytes before the first
// line boundary and after the last are copied apart. Every split of a
// copy into head, lines and tail must put each byte in its place and
// touch nothing outside the destination range.
TEST(CopyChannels, StreamingCopyOfOddSizesAndAlignmentsMovesExactlyItsBytes) {
  const size_t room = 4096;
  const auto src = Unrepeating(room, 21);
  for (size_t dst_offset : {0, 1, 15, 16, 17, 63, 64, 65}) {
    for (size_t src_offset : {0, 3, 64}) {
      for (size_t size : {0, 1, 15, 63, 64, 65, 127, 128, 1000, 2049}) {
        std::vector<unsigned char> dst(room + 128, 0xA5);
        StreamingCopy(dst.data() + dst_offset, src.data() + src_offset, size);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_offset && i < dst_offset + size;
          const unsigned char want =
              inside ? src[src_offset + (i - dst_offset)] : 0xA5;
          ASSERT_EQ(dst[i], want)
              << "byte " << i << " of a " << size << "-byte copy to offset "
              << dst_offset << " from offset " << src_offset;
        }
      }
    }
  }
}

// A copy large enough for streaming stores, not a whole number of chunks,
// to a destination off any line boundary: both channels' chunks, each
// with an unaligned head, and the short last chunk arrive intact.
TEST(CopyChannels, StreamedCopyAtAnOddOffsetAndSizeArrivesIntact) {
  const size_t size = kStreamingCopyBytes + 3 * 4096 + 77;
  const auto src = Unrepeating(size + 5, 33);
  std::vector<unsigned char> dst(size + 16, 0);
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::fill(dst.begin(), dst.end(), 0);
    ChannelCopy(dst.data() + 7, src.data() + 5, size);
    EXPECT_TRUE(std::equal(src.begin() + 5, src.begin() + 5 + size,
                           dst.begin() + 7));
    EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + 7,
                            [](unsigned char b) { return b == 0; }));
    EXPECT_TRUE(std::all_of(dst.begin() + 7 + size, dst.end(),
                            [](unsigned char b) { return b == 0; }));
  }
}

// Streams on several devices copy at once; whoever finds the second
// channel busy copies alone, and no copy waits for or mixes with another:
// split copies with ordinary stores, and streamed ones (whose stores each
// channel fences before it reports its chunks done).
TEST(CopyChannels, ConcurrentLargeCopiesAllArriveIntact) {
  constexpr int kThreads = 4;
  for (size_t size : {kSplitCopyBytes + 4096 * 3 + 17,
                      kStreamingCopyBytes + 4096 * 5 + 29}) {
    std::vector<std::thread> threads;
    std::atomic<int> intact{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const auto src = Unrepeating(size, 100 + t);
        std::vector<unsigned char> dst(size);
        for (int round = 0; round < 5; ++round) {
          std::fill(dst.begin(), dst.end(), 0);
          ChannelCopy(dst.data(), src.data(), size);
          if (dst == src) intact++;
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(intact.load(), kThreads * 5) << size << "-byte copies";
  }
}

/* ---- Process exit ------------------------------------------------------ */

// Streams alive at exit (even with a worker blocked in user work) must not
// hang or crash the exit: the driver state is deliberately never destroyed.
void ExitWithBusyStreams() {
  ph_stream_t stream = nullptr;
  ph_stream_create(0, 0, &stream);
  ph_host_task_t forever = {};
  forever.name = "forever";
  forever.run = [](void*, char*, size_t) {
    for (;;) pause();
    return PH_SUCCESS;
  };
  ph_launch_host_func(stream, &forever);
  ph_launch_host_func(stream, &forever);
  ph_stream_t idle = nullptr;
  ph_stream_create(1, 0, &idle);
  exit(0);
}

/* ---- Activity meters ---------------------------------------------------- */

TEST(ActivityMeter, OverlappingWorkCountsOnce) {
  ActivityMeter meter;
  meter.Begin(1000);
  meter.Begin(1010);  // a second stream starts while the first runs
  meter.End(1020);
  EXPECT_EQ(meter.BusyNs(1025), 25u) << "still busy: counted up to now";
  meter.End(1030);
  EXPECT_EQ(meter.BusyNs(2000), 30u) << "idle time is not busy";
  meter.Begin(3000);
  meter.End(3005);
  EXPECT_EQ(meter.BusyNs(4000), 35u);
}

TEST(ActivityMeter, AClockReadingThatArrivesLateAddsNothing) {
  ActivityMeter meter;
  meter.Begin(1000);
  meter.Begin(1100);
  meter.End(1050);  // read the clock before the Begin at 1100 landed
  meter.End(1200);
  EXPECT_EQ(meter.BusyNs(1200), 200u);
}

TEST(ActivityMeter, SurvivesTheClockWrappingPast48Bits) {
  ActivityMeter meter;
  const uint64_t wrap = uint64_t{1} << 48;
  meter.Begin(wrap - 10);
  meter.End(wrap + 15);
  EXPECT_EQ(meter.BusyNs(wrap + 100), 25u);
}

TEST(ActivitySample, CoversAtLeastAPeriodAndTwoQueriesAgree) {
  // Device 1 is used by no other test here.
  const ActivitySample first = SampleActivity(1);
  EXPECT_EQ(first.period_ns, 0u) << "the first sample starts the meters";
  {
    const MeteredSpan busy(&ComputeMeter(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  const ActivitySample busy = SampleActivity(1);
  const ActivitySample again = SampleActivity(1);
  EXPECT_GE(busy.period_ns, uint64_t{150'000'000});
  EXPECT_GE(busy.compute_percent, 60u);
  EXPECT_EQ(busy.memory_percent, 0u);
  EXPECT_NEAR(again.compute_percent, busy.compute_percent, 1)
      << "a query right after another covers the same stretch";
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const ActivitySample idle = SampleActivity(1);
  EXPECT_GE(idle.period_ns, kMinSamplePeriodNs);
  EXPECT_LE(idle.compute_percent, 40u);
}

TEST(ExitDeathTest, ExitWithLiveBusyStreamsDoesNotHang) {
  EXPECT_EXIT(ExitWithBusyStreams(), ::testing::ExitedWithCode(0), "");
}

/* ---- Failures travel along events -------------------------------------- */

ph_status_t RunFailing(void* user_data, char* error, size_t error_size) {
  std::snprintf(error, error_size, "%s", static_cast<const char*>(user_data));
  return PH_ERROR_DEVICE;
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

// A -> B -> C over two devices: C's message says through which device's
// event it inherited, then gives A's message whole, with one "inherited"
// however many hops there were.
TEST(ErrorPropagation, InheritedMessagesSayHowAndKeepTheOriginalOnce) {
  ph_stream_t a = nullptr, b = nullptr, c = nullptr;
  ph_event_t after_a = nullptr, after_b = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &a));
  ASSERT_PH_OK(ph_stream_create(1, 0, &b));
  ASSERT_PH_OK(ph_stream_create(0, 0, &c));
  ASSERT_PH_OK(ph_event_create(PH_EVENT_DEFAULT, &after_a));
  ASSERT_PH_OK(ph_event_create(PH_EVENT_DEFAULT, &after_b));
  static char sentence[] = "index 7 is out of bounds";
  const ph_host_task_t failing{"aten::index", RunFailing, nullptr, sentence};
  ASSERT_PH_OK(ph_launch_host_func(a, &failing));
  ASSERT_PH_OK(ph_event_record(after_a, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, after_a));
  ASSERT_PH_OK(ph_event_record(after_b, b));
  ASSERT_PH_OK(ph_stream_wait_event(c, after_b));
  const std::string original =
      "work 'aten::index' failed on phantom device 0: index 7 is out of bounds";
  ASSERT_EQ(ph_stream_synchronize(a), PH_ERROR_DEVICE);
  EXPECT_EQ(std::string(ph_last_error_message()), original);
  ASSERT_EQ(ph_stream_synchronize(c), PH_ERROR_DEVICE);
  const std::string inherited = ph_last_error_message();
  EXPECT_EQ(inherited.rfind("this stream waited for an event recorded on "
                            "phantom device 1 after work that failed",
                            0),
            0u)
      << inherited;
  EXPECT_EQ(Count(inherited, "inherited"), 1u) << inherited;
  EXPECT_EQ(Count(inherited, original), 1u) << inherited;
  EXPECT_EQ(inherited.substr(inherited.size() - original.size()), original);
  ASSERT_EQ(ph_event_query(after_b), PH_ERROR_DEVICE);
  EXPECT_EQ(std::string(ph_last_error_message()),
            "the event was recorded on phantom device 1 after work that "
            "failed; the original error: " + original);
  for (ph_event_t event : {after_a, after_b}) ph_event_destroy(event);
  for (ph_stream_t stream : {a, b, c}) ph_stream_destroy(stream);
}

// Random graphs of streams, failing and good tasks, records and waits, run
// by several threads at once, against a model: a stream fails exactly when
// work of its own failed or it waited on a record made after a failure,
// and an event reports exactly the failure before its record. The TSan
// build runs it for races between markers, waits and records.
struct GraphModel {
  std::vector<ph_stream_t> streams;
  std::vector<bool> doomed;
  std::vector<ph_event_t> events;
  std::vector<int> recorded_doom;  // -1 never recorded, 0 good, 1 failed
};

void RunRandomGraph(uint32_t seed, std::string* failure) {
  std::mt19937 random(seed);
  static char sentence[] = "injected";
  const ph_host_task_t failing{"graph_op", RunFailing, nullptr, sentence};
  const ph_host_task_t good{"graph_good", [](void*, char*, size_t) {
                              return PH_SUCCESS;
                            },
                            nullptr, nullptr};
  GraphModel model;
  for (int i = 0; i < 4; ++i) {
    ph_stream_t stream = nullptr;
    if (ph_stream_create(i % 2, 0, &stream) != PH_SUCCESS) {
      *failure = ph_last_error_message();
      return;
    }
    model.streams.push_back(stream);
    model.doomed.push_back(false);
    ph_event_t event = nullptr;
    ph_event_create(PH_EVENT_DISABLE_TIMING, &event);
    model.events.push_back(event);
    model.recorded_doom.push_back(-1);
  }
  for (int step = 0; step < 40; ++step) {
    const size_t s = random() % model.streams.size();
    const size_t e = random() % model.events.size();
    switch (random() % 6) {
      case 0:
        if (random() % 4 == 0) {
          ph_launch_host_func(model.streams[s], &failing);
          model.doomed[s] = true;
        }
        break;
      case 1:
      case 2:
        ph_launch_host_func(model.streams[s], &good);
        break;
      case 3:
      case 4:
        ph_event_record(model.events[e], model.streams[s]);
        model.recorded_doom[e] = model.doomed[s] ? 1 : 0;
        break;
      case 5:
        ph_stream_wait_event(model.streams[s], model.events[e]);
        if (model.recorded_doom[e] == 1) model.doomed[s] = true;
        break;
    }
  }
  for (size_t i = 0; i < model.streams.size() && failure->empty(); ++i) {
    const ph_status_t status = ph_stream_synchronize(model.streams[i]);
    if (status != (model.doomed[i] ? PH_ERROR_DEVICE : PH_SUCCESS)) {
      *failure = "seed " + std::to_string(seed) + ": stream " +
                 std::to_string(i) + " gave " + ph_status_name(status);
    }
  }
  for (size_t i = 0; i < model.events.size() && failure->empty(); ++i) {
    const ph_status_t status = ph_event_synchronize(model.events[i]);
    const ph_status_t expected =
        model.recorded_doom[i] == 1 ? PH_ERROR_DEVICE : PH_SUCCESS;
    if (status != expected) {
      *failure = "seed " + std::to_string(seed) + ": event " +
                 std::to_string(i) + " gave " + ph_status_name(status);
    }
  }
  for (ph_event_t event : model.events) ph_event_destroy(event);
  for (ph_stream_t stream : model.streams) ph_stream_destroy(stream);
}

TEST(ErrorPropagation, RandomGraphsFromSeveralThreadsMatchTheModel) {
  const uint32_t base = std::random_device{}();
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < failures.size(); ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t round = 0; round < 25 && failures[t].empty(); ++round) {
        RunRandomGraph(base + static_cast<uint32_t>(t * 1000 + round),
                       &failures[t]);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    EXPECT_TRUE(failure.empty()) << failure << " (base seed " << base << ")";
  }
}

/* ---- Regressions found by the HAL fuzzer (tests/fuzz) ------------------ */

// ph_stream_synchronize waits for all queued work, and an event record is
// queued work: once it returns, the event must query as reached. The worker
// used to count the marker complete (waking the synchronize) before marking
// the event reached, so a query right after could say PH_NOT_READY.
TEST(FuzzRegression, EventIsReachedOnceItsStreamIsSynchronized) {
  ph_stream_t stream = nullptr;
  ph_event_t event = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  ASSERT_PH_OK(ph_event_create(PH_EVENT_DEFAULT, &event));
  int not_ready = 0;
  for (int i = 0; i < 2000; ++i) {
    ASSERT_PH_OK(ph_event_record(event, stream));
    ASSERT_PH_OK(ph_stream_synchronize(stream));
    not_ready += ph_event_query(event) == PH_NOT_READY;
    ASSERT_PH_OK(ph_event_record(event, stream));
    ASSERT_PH_OK(ph_device_synchronize(0));
    not_ready += ph_event_query(event) == PH_NOT_READY;
  }
  EXPECT_EQ(not_ready, 0) << "queries that said PH_NOT_READY after a sync";
  ASSERT_PH_OK(ph_event_destroy(event));
  ASSERT_PH_OK(ph_stream_destroy(stream));
}

}  // namespace
}  // namespace phantom::fake
