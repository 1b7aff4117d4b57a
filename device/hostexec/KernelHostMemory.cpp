// See phantom/KernelHostMemory.h.
#include <phantom/KernelHostMemory.h>
#include <phantom/Launch.h>
#include <phantom/Settings.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <pthread.h>


#include <mutex>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace phantom {

// The open LendingScope's block of exactly `nbytes`, claimed for the
// caller's allocation, or nullptr. Only the thread that opened the scope sees it.
void* takeLentBlock(size_t nbytes);

namespace {

constexpr size_t kPage = 4096;

size_t roundedSize(size_t n) {
  return (n + kPage - 1) / kPage * kPage;
}

class KernelHostAllocator final : public c10::Allocator {
 public:
  explicit KernelHostAllocator(c10::Allocator* previous)
      : previous_(previous), previous_raw_deleter_(previous->raw_deleter()) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < kMinCachedBytes || !inDeviceWork()) {
      return previous_->allocate(n);
    }
    if (void* lent = takeLentBlock(n)) {
      return {lent, lent, &freeLent, c10::Device(c10::DeviceType::CPU)};
    }
    void* data = takeBlock(roundedSize(n));
    return {data, data, &freeCached, c10::Device(c10::DeviceType::CPU)};
  }

  // Blocks of all three kinds (cached, lent, the previous allocator's) have
  // data == context, so raw_allocate works (the oneDNN integration
  // allocates its buffers that way), and this deleter frees any of them.
  c10::DeleterFnPtr raw_deleter() const override { return &freeAny; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Hands `block` (a device output's memory) to a kernel's allocation,
  // unless an earlier allocation still holds it.
  bool claimLent(void* block) {
    std::lock_guard<std::mutex> lock(mutex());
    if (!lent_.insert(block).second) return false;
    stats_.lent += 1;
    return true;
  }

  void noteInPlace() {
    std::lock_guard<std::mutex> lock(mutex());
    stats_.in_place += 1;
  }

  // Whether `block`, lent from a device output, is still allocated.
  bool stillLent(void* block) {
    std::lock_guard<std::mutex> lock(mutex());
    return lent_.count(block) != 0;
  }

  KernelHostMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex());
    KernelHostMemoryStats stats = stats_;
    stats.live_blocks = live_.size();
    for (const auto& [size, list] : free_) stats.cached_blocks += list.size();
    return stats;
  }

  void release() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex());
      for (auto& [size, list] : free_) {
        blocks.insert(blocks.end(), list.begin(), list.end());
      }
      free_.clear();
      stats_.cached_bytes = 0;
    }
    for (void* block : blocks) {
      c10::free_cpu(block);
    }
  }

  // A forked child inherits the mutex in whatever state another thread
  // left it; the child gets a new one (the old one is leaked).
  void resetMutexInChild() { mutex_ = new std::mutex(); }

 private:
  std::mutex& mutex() { return *mutex_; }

  void* takeBlock(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* block = it->second.back();
        it->second.pop_back();
        stats_.cached_bytes -= size;
        stats_.reused += 1;
        noteLiveLocked(block, size);
        return block;
      }
    }
    void* block = c10::alloc_cpu(size);  // throws when out of memory
    std::lock_guard<std::mutex> lock(mutex());
    stats_.fresh += 1;
    noteLiveLocked(block, size);
    return block;
  }

  void noteLiveLocked(void* block, size_t size) {
    live_.emplace(block, size);
    stats_.live_bytes += size;
  }

  // Returns false if `block` is neither one of the cache's live blocks nor
  // a lent one (whose memory is the device's: it is only forgotten).
  bool giveBack(void* block) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      const auto it = live_.find(block);
      if (it == live_.end()) return lent_.erase(block) != 0;
      const size_t size = it->second;
      live_.erase(it);
      stats_.live_bytes -= size;
      if (stats_.cached_bytes + size <= kMaxCachedBytes) {
        free_[size].push_back(block);
        stats_.cached_bytes += size;
        return true;
      }
    }
    c10::free_cpu(block);
    return true;
  }

  static void freeCached(void* block);
  static void freeLent(void* block);
  static void freeAny(void* block);

  c10::Allocator* previous_;
  c10::DeleterFnPtr previous_raw_deleter_;
  std::mutex* mutex_ = new std::mutex();  // never destroyed (see exit)
  std::unordered_map<size_t, std::vector<void*>> free_;  // by rounded size
  std::unordered_map<void*, size_t> live_;
  std::unordered_set<void*> lent_;  // device memory handed to kernels
  KernelHostMemoryStats stats_;  // byte counts and tallies; blocks: counted
};

// Never destroyed: CPU tensors may be freed during static destruction at
// exit, and the CPU allocator table keeps pointing here.
KernelHostAllocator* instance = nullptr;

void KernelHostAllocator::freeCached(void* block) {
  instance->giveBack(block);
}

void KernelHostAllocator::freeLent(void* block) {
  instance->giveBack(block);
}

void KernelHostAllocator::freeAny(void* block) {
  if (block != nullptr && !instance->giveBack(block)) {
    instance->previous_raw_deleter_(block);
  }
}

}  // namespace

void installKernelHostAllocator() {
  // Called on every launch: after the first, a guard-byte load (no
  // std::call_once, which sets thread-locals on every call).
  static const bool installed = [] {
    c10::Allocator* previous = c10::GetCPUAllocator();
    if (previous->raw_deleter() == nullptr) {
      return false;  // an allocator without raw frees: leave it alone
    }
    instance = new KernelHostAllocator(previous);
    pthread_atfork(nullptr, nullptr, [] { instance->resetMutexInChild(); });
    // Priority 0: any allocator registered with a higher one still wins.
    c10::SetCPUAllocator(instance, /*priority=*/0);
    return true;
  }();
  (void)installed;
}

KernelHostMemoryStats kernelHostMemoryStats() {
  return instance != nullptr ? instance->stats() : KernelHostMemoryStats{};
}

void noteResultInPlace() {
  if (instance != nullptr) {
    instance->noteInPlace();
  }
}

void releaseKernelHostMemory() {
  if (instance != nullptr) {
    instance->release();
  }
}

namespace {
thread_local LendingScope* open_scope = nullptr;
}  // namespace

void* takeLentBlock(size_t nbytes) {
  LendingScope* scope = open_scope;
  if (scope == nullptr) return nullptr;
  // A block serves one allocation at a time, and again once that one is
  // freed: oneDNN's convolution first reorders its input into a buffer of
  // the output's size (in the benchmark's 64-to-64-channel case), frees it,
  // and only then allocates the output it returns.
  for (LendingScope::Offer& offer : scope->offers_) {
    if (offer.data != nullptr && offer.nbytes == nbytes &&
        instance->claimLent(offer.data)) {
      return offer.data;
    }
  }
  return nullptr;
}

LendingScope::LendingScope() {
  // PHANTOM_NO_LENDING=1: the way out if a kernel turns out to keep a
  // buffer (the scope's owner then fails the op and says so). A malformed
  // value never gets here: the device refuses to start (phantom/Settings.h).
  static const bool disabled = switchSetting("PHANTOM_NO_LENDING");
  // Lending needs the wrapped allocator, which device work installs.
  if (!disabled && open_scope == nullptr && instance != nullptr && inDeviceWork()) {
    open_scope = this;
    active_ = true;
  }
}

LendingScope::~LendingScope() { close(); }

bool LendingScope::accepts(size_t nbytes) const {
  return active_ && nbytes >= kMinCachedBytes;
}

bool LendingScope::offer(void* data, size_t nbytes) {
  if (data == nullptr || !accepts(nbytes)) return false;
  for (Offer& offer : offers_) {
    if (offer.nbytes == nbytes) {
      // Two blocks of one size: the kernel could put either result in
      // either block. Withdraw the first (never hand it out); refuse this.
      offer.data = nullptr;
      return false;
    }
  }
  offers_.push_back(Offer{data, nbytes});
  return true;
}

void LendingScope::close() {
  if (active_) {
    open_scope = nullptr;
    active_ = false;
  }
}

void LendingScope::requireNothingKept(const char* op) const {
  TORCH_CHECK(!lentBlockStillAlive(), op,
              "'s CPU kernel kept a buffer past its return in device memory "
              "phantom had lent it for a result (KernelHostMemory.h): the "
              "op's outputs are not safe to use. Set PHANTOM_NO_LENDING=1 to "
              "work around it, and report it");
}

bool LendingScope::lentBlockStillAlive() const {
  for (const Offer& offer : offers_) {
    if (offer.data != nullptr && instance->stillLent(offer.data)) {
      return true;
    }
  }
  return false;
}

}  // namespace phantom
