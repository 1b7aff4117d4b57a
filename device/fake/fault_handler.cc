// Device range table and SIGSEGV/SIGBUS handler; see fault_handler.h.
#include "fault_handler.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "config.h"

namespace phantom::fake {
namespace {

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

// Appends `text` to buffer[*length], never past `capacity`.
void Append(char* buffer, size_t capacity, size_t* length, const char* text) {
  while (*text != '\0' && *length + 1 < capacity) buffer[(*length)++] = *text++;
}

void AppendHex(char* buffer, size_t capacity, size_t* length,
               uintptr_t value) {
  char digits[2 * sizeof(uintptr_t) + 3] = "0x";
  int count = 0;
  char reversed[2 * sizeof(uintptr_t)];
  do {
    reversed[count++] = "0123456789abcdef"[value & 0xf];
    value >>= 4;
  } while (value != 0);
  int at = 2;
  while (count > 0) digits[at++] = reversed[--count];
  digits[at] = '\0';
  Append(buffer, capacity, length, digits);
}

void AppendDecimal(char* buffer, size_t capacity, size_t* length, int value) {
  char digits[16];
  int count = 0;
  unsigned v = static_cast<unsigned>(value);
  do {
    digits[count++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  char ordered[16];
  for (int i = 0; i < count; ++i) ordered[i] = digits[count - 1 - i];
  ordered[count] = '\0';
  Append(buffer, capacity, length, ordered);
}

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
    AppendHex(message, sizeof message, &length, address);
    Append(message, sizeof message, &length, " (phantom device ");
    AppendDecimal(message, sizeof message, &length, device);
    Append(message, sizeof message, &length,
           "). Device memory is not host-addressable: copy the tensor to the "
           "host first (e.g. tensor.cpu()).\n");
    ssize_t ignored = write(STDERR_FILENO, message, length);
    (void)ignored;
    // Returning with the default action re-executes the faulting
    // instruction, which now kills the process with the original signal.
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(signal_number, &default_action, nullptr);
    errno = saved_errno;
    return;
  }
  const struct sigaction& previous =
      signal_number == SIGBUS ? g_previous_bus : g_previous_segv;
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    previous.sa_sigaction(signal_number, info, context);
  } else if (previous.sa_handler == SIG_DFL ||
             previous.sa_handler == SIG_IGN) {
    // Restore and return: the fault recurs and takes its default course
    // (the kernel does not let a synchronous fault be ignored).
    sigaction(signal_number, &previous, nullptr);
  } else {
    previous.sa_handler(signal_number);
  }
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
