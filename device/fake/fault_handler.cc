// Device range table and SIGSEGV/SIGBUS handler; see fault_handler.h.
#include "fault_handler.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include <phantom/common/fault_signals.h>

#include "config.h"

namespace phantom::fake {
namespace {

using fault_signals::Append;
using fault_signals::AppendNumber;
using fault_signals::EndWithTheSignal;
using fault_signals::ForwardFault;
using fault_signals::WriteToStderr;

struct DeviceRangeSlot {
  std::atomic<uintptr_t> base{0};  // 0 = device not mapped; written last
  std::atomic<uintptr_t> size{0};
  std::atomic<uintptr_t> view{0};
  // The view range being moved to shared memory ([0, 0) when none).
  std::atomic<uintptr_t> migrating_begin{0};
  std::atomic<uintptr_t> migrating_end{0};
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free,
              "the fault handler needs lock-free atomics");

DeviceRangeSlot g_ranges[kMaxDevices];
struct sigaction g_previous_segv;
struct sigaction g_previous_bus;

bool InMigrationWindow(const DeviceRangeSlot& slot, uintptr_t address) {
  return address >= slot.migrating_begin.load(std::memory_order_acquire) &&
         address < slot.migrating_end.load(std::memory_order_acquire);
}

// A write into a view range that is being moved to shared memory: wait for
// the move, then let the write be retried. True if `address` was one.
bool WaitOutMigration(uintptr_t address) {
  for (DeviceRangeSlot& slot : g_ranges) {
    if (!InMigrationWindow(slot, address)) continue;
    while (InMigrationWindow(slot, address)) sched_yield();
    return true;
  }
  return false;
}

void OnFault(int signal_number, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  if (signal_number == SIGSEGV && WaitOutMigration(address)) {
    errno = saved_errno;
    return;  // the faulting write is retried, now on shared pages
  }
  const int device = DeviceOfAddress(address);
  if (device >= 0) {
    char message[384];
    size_t length = 0;
    Append(message, sizeof message, &length,
           "phantom: host code touched device memory at ");
    AppendNumber(message, sizeof message, &length, address, 16);
    Append(message, sizeof message, &length, " (phantom device ");
    AppendNumber(message, sizeof message, &length,
                 static_cast<uintptr_t>(device), 10);
    Append(message, sizeof message, &length,
           "). Device memory is not host-addressable: copy the tensor to the "
           "host first (e.g. tensor.cpu()).\n");
    WriteToStderr(message, length);
    EndWithTheSignal(signal_number);
    errno = saved_errno;
    return;
  }
  ForwardFault(signal_number, info, context,
               signal_number == SIGBUS ? g_previous_bus : g_previous_segv);
  errno = saved_errno;
}

struct sigaction OurAction() {
  struct sigaction action = {};
  action.sa_sigaction = OnFault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  return action;
}

void InstallFaultHandler() {
  const struct sigaction action = OurAction();
  sigaction(SIGSEGV, &action, &g_previous_segv);
  sigaction(SIGBUS, &action, &g_previous_bus);
}

std::mutex g_reinstall_mutex;

}  // namespace

void PublishDeviceRange(int device, uintptr_t base, size_t size,
                        uintptr_t view) {
  static std::once_flag installed;
  std::call_once(installed, InstallFaultHandler);
  DeviceRangeSlot& slot = g_ranges[device];
  slot.size.store(size, std::memory_order_relaxed);
  slot.view.store(view, std::memory_order_relaxed);
  slot.base.store(base, std::memory_order_release);
}

void BeginViewMigration(int device, uintptr_t begin, uintptr_t end) {
  {
    // Put our handler back on top if someone replaced it; what they
    // installed becomes the handler we chain to.
    std::lock_guard<std::mutex> lock(g_reinstall_mutex);
    struct sigaction current = {};
    sigaction(SIGSEGV, nullptr, &current);
    const bool ours = (current.sa_flags & SA_SIGINFO) != 0 &&
                      current.sa_sigaction == OnFault;
    if (!ours) {
      const struct sigaction action = OurAction();
      sigaction(SIGSEGV, &action, &g_previous_segv);
    }
  }
  DeviceRangeSlot& slot = g_ranges[device];
  slot.migrating_end.store(end, std::memory_order_relaxed);
  slot.migrating_begin.store(begin, std::memory_order_release);
}

void EndViewMigration(int device) {
  DeviceRangeSlot& slot = g_ranges[device];
  slot.migrating_begin.store(0, std::memory_order_release);
  slot.migrating_end.store(0, std::memory_order_release);
}

int DeviceOfAddress(uintptr_t address) {
  for (int device = 0; device < kMaxDevices; ++device) {
    const uintptr_t base = g_ranges[device].base.load(std::memory_order_acquire);
    if (base == 0) continue;
    const uintptr_t size = g_ranges[device].size.load(std::memory_order_relaxed);
    if (address >= base && address - base < size) return device;
  }
  return -1;
}

uintptr_t DeviceRangeBase(int device) {
  return g_ranges[device].base.load(std::memory_order_acquire);
}

uintptr_t DeviceViewBase(int device) {
  if (g_ranges[device].base.load(std::memory_order_acquire) == 0) return 0;
  return g_ranges[device].view.load(std::memory_order_relaxed);
}

}  // namespace phantom::fake
