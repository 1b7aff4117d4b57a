// See phantom/HostGuard.h.
//
// Slot states. kFree: unused. kActive: its pages are protected. kViolated:
// the handler caught an access, unprotected the pages and left the address
// for takeViolations/release. kBusy: a thread holding g_mutex is changing
// the slot's protection; the handler lets a fault there be retried.
// Only the handler moves a slot kActive -> kViolated (by compare-exchange);
// everything else happens under g_mutex. A slot's range is written while
// it is kFree and published by the release store of kActive.
//
// The table grows: slots live in chunks of kChunkSlots chained by an atomic
// pointer. When every slot is taken, protect (under g_mutex, never in the
// handler) appends a chunk and publishes it with a release store; chunks
// are never freed, so the handler walks the chain lock-free at any moment.
// The table is as large as the most guards outstanding at once, and its
// slots are reused as guards are released.
#include <phantom/HostGuard.h>

#include <phantom/common/fault_signals.h>
#include <phantom/hal.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <new>

namespace phantom::host_guard {
namespace {

enum : int { kFree = 0, kActive = 1, kViolated = 2, kBusy = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<uintptr_t> fault{0};
  uint64_t id = 0;  // under g_mutex only
};

constexpr int kChunkSlots = 256;
struct Chunk {
  Slot slots[kChunkSlots];
  std::atomic<Chunk*> next{nullptr};
};
Chunk g_first_chunk;
Chunk* g_last_chunk = &g_first_chunk;  // under g_mutex

// Calls `visit(slot)` on every slot of every chunk until it returns true;
// returns whether one did. Lock-free: safe in the handler.
template <typename Visit>
bool AnySlot(Visit&& visit) {
  for (Chunk* chunk = &g_first_chunk; chunk != nullptr;
       chunk = chunk->next.load(std::memory_order_acquire)) {
    for (Slot& slot : chunk->slots) {
      if (visit(slot)) return true;
    }
  }
  return false;
}

// Under g_mutex: a free slot, appending a chunk when every one is taken
// (nullptr when that allocation fails).
Slot* FreeSlotLocked() {
  Slot* found = nullptr;
  AnySlot([&](Slot& slot) {
    if (slot.state.load(std::memory_order_acquire) != kFree) return false;
    found = &slot;
    return true;
  });
  if (found != nullptr) return found;
  Chunk* chunk = new (std::nothrow) Chunk;
  if (chunk == nullptr) return nullptr;
  g_last_chunk->next.store(chunk, std::memory_order_release);
  g_last_chunk = chunk;
  return &chunk->slots[0];
}
std::mutex g_mutex;          // protect, release, take, install
uint64_t g_next_id = 1;      // under g_mutex
std::atomic<int> g_used{0};  // slots not kFree: the fast path of releaseRange
struct sigaction g_previous_segv;  // under g_mutex; read by the handler

// The calling thread is inside our handler: a chain that leads back to us
// (a handler installed over ours that chains to us, which then chains to
// it) ends with the default action instead of recursing.
__attribute__((tls_model("initial-exec"))) thread_local int t_in_handler = 0;

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

void SetProtection(const Slot& slot, int protection) {
  const uintptr_t begin = slot.begin.load(std::memory_order_relaxed);
  const uintptr_t end = slot.end.load(std::memory_order_relaxed);
  mprotect(reinterpret_cast<void*>(begin), end - begin, protection);
}

bool Overlaps(const Slot& slot, uintptr_t begin, uintptr_t end) {
  return slot.begin.load(std::memory_order_relaxed) < end &&
         begin < slot.end.load(std::memory_order_relaxed);
}

bool Contains(const Slot& slot, uintptr_t address) {
  return slot.begin.load(std::memory_order_relaxed) <= address &&
         address < slot.end.load(std::memory_order_relaxed);
}

// True if the fault at `address` was ours and the access may be retried.
bool HandleGuardFault(uintptr_t address) {
  if (g_used.load(std::memory_order_acquire) == 0) return false;
  // An active guard first: that is the race being caught.
  const bool caught = AnySlot([&](Slot& slot) {
    int state = slot.state.load(std::memory_order_acquire);
    if (state == kActive && Contains(slot, address) &&
        slot.state.compare_exchange_strong(state, kViolated,
                                           std::memory_order_acq_rel)) {
      slot.fault.store(address, std::memory_order_release);
      SetProtection(slot, PROT_READ | PROT_WRITE);
      return true;
    }
    return false;
  });
  if (caught) return true;
  // A guard being changed, or one already violated whose pages another
  // guard's re-protection covered again: make the access possible.
  return AnySlot([&](Slot& slot) {
    const int state = slot.state.load(std::memory_order_acquire);
    if (state == kBusy && Contains(slot, address)) return true;  // retried
    if (state == kViolated && Contains(slot, address)) {
      SetProtection(slot, PROT_READ | PROT_WRITE);
      return true;
    }
    return false;
  });
}

void OnFault(int signal_number, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  if (t_in_handler == 0 && HandleGuardFault(address)) {
    errno = saved_errno;
    return;
  }
  if (t_in_handler != 0) {
    // We chained back to ourselves: take the default course.
    fault_signals::EndWithTheSignal(signal_number);
    errno = saved_errno;
    return;
  }
  t_in_handler = 1;
  const struct sigaction previous = g_previous_segv;
  fault_signals::ForwardFault(signal_number, info, context, previous);
  t_in_handler = 0;
  errno = saved_errno;
}

// Under g_mutex: puts our handler on top (again, if another library
// replaced it: what it installed becomes the handler we chain to).
void InstallLocked() {
  struct sigaction current = {};
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == OnFault) {
    return;
  }
  struct sigaction action = {};
  action.sa_sigaction = OnFault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &g_previous_segv);
}

// Under g_mutex: re-protects the active guards overlapping [begin, end)
// (after those pages were unprotected for another guard).
void ReprotectOverlapping(uintptr_t begin, uintptr_t end) {
  AnySlot([&](Slot& slot) {
    int state = kActive;
    if (Overlaps(slot, begin, end) &&
        slot.state.compare_exchange_strong(state, kBusy,
                                           std::memory_order_acq_rel)) {
      SetProtection(slot, PROT_NONE);
      slot.state.store(kActive, std::memory_order_release);
    }
    return false;
  });
}

// Under g_mutex: unprotects `slot` (active or violated) and frees it.
// Returns the faulting address if it was violated.
uintptr_t FreeLocked(Slot& slot) {
  int state = slot.state.load(std::memory_order_acquire);
  while (state == kActive &&
         !slot.state.compare_exchange_weak(state, kBusy,
                                           std::memory_order_acq_rel)) {
  }
  const uintptr_t fault =
      state == kViolated ? slot.fault.load(std::memory_order_acquire) : 0;
  if (state == kViolated) slot.state.store(kBusy, std::memory_order_release);
  SetProtection(slot, PROT_READ | PROT_WRITE);
  const uintptr_t begin = slot.begin.load(std::memory_order_relaxed);
  const uintptr_t end = slot.end.load(std::memory_order_relaxed);
  slot.id = 0;
  slot.fault.store(0, std::memory_order_relaxed);
  slot.state.store(kFree, std::memory_order_release);
  g_used.fetch_sub(1, std::memory_order_acq_rel);
  ReprotectOverlapping(begin, end);
  return fault;
}

}  // namespace

bool available(c10::DeviceIndex device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // 0 unknown, 1 no, 2 yes
  if (device < 0 || device >= kMaxDevices) return false;
  const int cached = known[device].load(std::memory_order_acquire);
  if (cached != 0) return cached == 2;
  bool declared = false;
  ph_device_properties_t props{};
  props.struct_size = sizeof props;
  // Drivers before ABI 1006 have no flags; their struct ends earlier.
  if (ph_abi_version() >= 1006 &&
      ph_device_get_properties(device, &props) == PH_SUCCESS) {
    declared = (props.flags & PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION) != 0;
  }
  known[device].store(declared ? 2 : 1, std::memory_order_release);
  return declared;
}

uint64_t protect(const c10::Storage& storage, size_t offset, size_t nbytes,
                 bool owns_block) {
  const size_t page = PageSize();
  const uintptr_t s = reinterpret_cast<uintptr_t>(storage.data());
  const uintptr_t e = s + storage.nbytes();
  const uintptr_t a = s + offset;
  const uintptr_t b = a + nbytes;
  if (s == 0 || nbytes == 0 || b > e) return 0;
  const auto floor = [&](uintptr_t x) { return x / page * page; };
  const auto ceil = [&](uintptr_t x) { return (x + page - 1) / page * page; };
  // A page may be protected when every byte of it in use lies in [a, b):
  // with the block to itself, the bytes before s and after e on the
  // block's pages are unused (s is page-aligned).
  owns_block = owns_block && s % page == 0;
  const uintptr_t lo = owns_block && a == s ? a : ceil(a);
  const uintptr_t hi = owns_block && b == e ? ceil(b) : floor(b);
  if (hi <= lo) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  Slot* free_slot = FreeSlotLocked();
  if (free_slot == nullptr) return 0;  // no memory for more: unguarded
  Slot& slot = *free_slot;
  InstallLocked();
  slot.begin.store(lo, std::memory_order_relaxed);
  slot.end.store(hi, std::memory_order_relaxed);
  slot.fault.store(0, std::memory_order_relaxed);
  slot.id = g_next_id++;
  g_used.fetch_add(1, std::memory_order_acq_rel);
  slot.state.store(kActive, std::memory_order_release);
  if (mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_NONE) != 0) {
    slot.id = 0;
    slot.state.store(kFree, std::memory_order_release);
    g_used.fetch_sub(1, std::memory_order_acq_rel);
    return 0;
  }
  return slot.id;
}

uintptr_t release(uint64_t id) {
  if (id == 0) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  uintptr_t fault = 0;
  AnySlot([&](Slot& slot) {
    if (slot.id != id || slot.state.load(std::memory_order_acquire) == kFree) {
      return false;
    }
    fault = FreeLocked(slot);
    return true;
  });
  return fault;
}

void releaseRange(const void* begin, size_t size) {
  if (g_used.load(std::memory_order_acquire) == 0) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(begin);
  std::lock_guard<std::mutex> lock(g_mutex);
  AnySlot([&](Slot& slot) {
    if (slot.state.load(std::memory_order_acquire) == kActive &&
        Overlaps(slot, lo, lo + size)) {
      FreeLocked(slot);
    }
    return false;
  });
}

std::vector<std::pair<uint64_t, uintptr_t>> takeViolations() {
  std::vector<std::pair<uint64_t, uintptr_t>> found;
  if (g_used.load(std::memory_order_acquire) == 0) return found;
  std::lock_guard<std::mutex> lock(g_mutex);
  AnySlot([&](Slot& slot) {
    if (slot.state.load(std::memory_order_acquire) == kViolated) {
      const uint64_t id = slot.id;
      found.emplace_back(id, FreeLocked(slot));
    }
    return false;
  });
  return found;
}

size_t activeCount() {
  size_t count = 0;
  AnySlot([&](Slot& slot) {
    count += slot.state.load(std::memory_order_acquire) == kActive;
    return false;
  });
  return count;
}

}  // namespace phantom::host_guard
