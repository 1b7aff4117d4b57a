// See phantom/KernelHostMemory.h.
#include <phantom/KernelHostMemory.h>
#include <phantom/Launch.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <pthread.h>

#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace phantom {
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
    void* data = takeBlock(roundedSize(n));
    return {data, data, &freeCached, c10::Device(c10::DeviceType::CPU)};
  }

  // Blocks of both kinds have data == context, so raw_allocate works (the
  // oneDNN integration allocates its buffers that way), and this deleter
  // frees either kind.
  c10::DeleterFnPtr raw_deleter() const override { return &freeAny; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
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

  // Returns false if `block` is not one of the cache's live blocks.
  bool giveBack(void* block) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      const auto it = live_.find(block);
      if (it == live_.end()) return false;
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
  static void freeAny(void* block);

  c10::Allocator* previous_;
  c10::DeleterFnPtr previous_raw_deleter_;
  std::mutex* mutex_ = new std::mutex();  // never destroyed (see exit)
  std::unordered_map<size_t, std::vector<void*>> free_;  // by rounded size
  std::unordered_map<void*, size_t> live_;
  KernelHostMemoryStats stats_;  // byte counts and tallies; blocks: counted
};

// Never destroyed: CPU tensors may be freed during static destruction at
// exit, and the CPU allocator table keeps pointing here.
KernelHostAllocator* instance = nullptr;

void KernelHostAllocator::freeCached(void* block) {
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

void releaseKernelHostMemory() {
  if (instance != nullptr) {
    instance->release();
  }
}

}  // namespace phantom
