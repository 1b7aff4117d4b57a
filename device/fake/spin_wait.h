// Bounded spinning before blocking.
//
// A thread that blocks on a condition variable and is woken by another
// pays the kernel's wake-up latency: on the virtual machines phantom is
// developed on, 30-40 us per hand-off, so a queued op followed by a wait
// cost ~70 us while the op itself took ~1 us. A GPU driver avoids this the
// same way: cudaStreamSynchronize spins on the completion flag for a while
// before yielding (cudaDeviceScheduleAuto), and the device's command
// processor polls its queue. So the fake's waits first poll an atomic for
// a short, fixed budget, then fall back to blocking; a stream worker that
// ran out of work polls its queue for the same budget before sleeping.
//
// The budget bounds what spinning can cost: at most kSpinBudget of one
// core per wait, and nothing while work is long (the waiter blocks after
// the budget). The condition must be a cheap, lock-free read.
#ifndef PHANTOM_FAKE_SPIN_WAIT_H_
#define PHANTOM_FAKE_SPIN_WAIT_H_

#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace phantom::fake {

constexpr std::chrono::microseconds kSpinBudget{50};

// An idle stream worker polls its queue longer, as a GPU's command
// processor polls its ring: in a training step the host often takes more
// than 50 us between two launches (Python, autograd), and a worker that
// fell asleep then cost every such launch a kernel wake-up (the DDP step
// measurements that chose this budget are in docs/distributed.md). It
// costs at most 1 ms of one core after each burst of work, and the worker
// yields its core every 64 polls.
constexpr std::chrono::microseconds kIdlePollBudget{1000};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::this_thread::yield();
#endif
}

// Polls `ready` until it returns true (returns true) or the budget is
// spent (returns false). The clock is read every 64 polls.
template <typename Ready>
bool SpinUntil(Ready&& ready,
               std::chrono::steady_clock::duration budget = kSpinBudget) {
  if (ready()) return true;
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      CpuRelax();
      if (ready()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    // Let a thread sharing this core run: it may be the one we wait for.
    std::this_thread::yield();
  }
}

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_SPIN_WAIT_H_
