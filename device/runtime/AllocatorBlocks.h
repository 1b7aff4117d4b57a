// The free-block pools of the caching device allocator
// (DeviceAllocator.cpp): a Block is a piece of a segment the allocator got
// from the driver; a BlockPool keeps the free ones of one pool (small or
// large) for best-fit lookups. Internal to the runtime. Defined here,
// inline, because every allocation and free calls them under the device's
// lock: the fast path stays one translation unit.
#pragma once

#include <phantom/DeviceAllocator.h>

#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

namespace phantom {
namespace allocator_detail {

struct Block;

struct BlockComparator {
  bool operator()(const Block* a, const Block* b) const;
};

// Free blocks of the small pool are kept in exact-size bins (one per
// multiple of kMinBlockSize up to a whole small segment), per stream, with a
// bitmap of the non-empty bins: finding the best fit, inserting and erasing
// are a few word operations instead of a balanced-tree walk. Small requests
// are most of a training step's allocations.
constexpr size_t kSmallBins = kSmallBuffer / kMinBlockSize;
constexpr size_t kBitsPerWord = 64;

struct StreamBins {
  explicit StreamBins(c10::StreamId s) : stream(s) {}
  const c10::StreamId stream;
  std::array<Block*, kSmallBins> heads{};  // LIFO lists through Block::bin_*
  std::array<uint64_t, kSmallBins / kBitsPerWord> occupied{};
  uint64_t occupied_words = 0;  // bit w: occupied[w] != 0
};
static_assert(kSmallBins / kBitsPerWord <= kBitsPerWord,
              "the summary bitmap has one bit per bitmap word");

// The free blocks of one pool. The large pool is ordered by (stream, size,
// address), as CUDA's allocator orders it; the small pool uses bins.
class BlockPool {
 public:
  explicit BlockPool(bool small) : is_small(small) {}
  const bool is_small;

  void insert(Block* block);
  void erase(Block* block);
  // The smallest free block of `stream` of at least `size` bytes (left in
  // the pool), or nullptr.
  Block* bestFit(c10::StreamId stream, size_t size);
  // Every free block, for the rare walks (releasing segments).
  std::vector<Block*> all() const;

 private:
  StreamBins* binsFor(c10::StreamId stream);

  std::set<Block*, BlockComparator> sorted_;           // large pool
  std::vector<std::unique_ptr<StreamBins>> bins_;      // small pool
  StreamBins* last_bins_ = nullptr;                    // most recent stream
};

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream;  // the stream it was allocated on
  size_t size;           // bytes, a multiple of kMinBlockSize
  size_t requested_size = 0;
  BlockPool* pool;
  void* ptr;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours within the segment
  Block* next = nullptr;
  Block* bin_prev = nullptr;  // free list of a small-pool bin
  Block* bin_next = nullptr;
  int pending_events = 0;  // record_stream events not yet completed
  std::vector<c10::StreamId> stream_uses;  // record_stream; usually empty

  Block(c10::DeviceIndex d, c10::StreamId s, size_t bytes, BlockPool* p,
        void* address)
      : device(d), stream(s), size(bytes), pool(p), ptr(address) {}

  bool isSplit() const { return prev != nullptr || next != nullptr; }
};

inline bool BlockComparator::operator()(const Block* a,
                                        const Block* b) const {
  if (a->stream != b->stream) {
    return a->stream < b->stream;
  }
  if (a->size != b->size) {
    return a->size < b->size;
  }
  return reinterpret_cast<uintptr_t>(a->ptr) <
         reinterpret_cast<uintptr_t>(b->ptr);
}

inline size_t binOf(const Block* block) {
  const size_t bin = block->size / kMinBlockSize - 1;
  TORCH_INTERNAL_ASSERT(bin < kSmallBins, "small-pool block of ", block->size,
                        " bytes");
  return bin;
}

inline StreamBins* BlockPool::binsFor(c10::StreamId stream) {
  if (last_bins_ != nullptr && last_bins_->stream == stream) {
    return last_bins_;
  }
  for (auto& bins : bins_) {
    if (bins->stream == stream) {
      return last_bins_ = bins.get();
    }
  }
  bins_.push_back(std::make_unique<StreamBins>(stream));
  return last_bins_ = bins_.back().get();
}

inline void BlockPool::insert(Block* block) {
  if (!is_small) {
    sorted_.insert(block);
    return;
  }
  StreamBins& bins = *binsFor(block->stream);
  const size_t bin = binOf(block);
  block->bin_prev = nullptr;
  block->bin_next = bins.heads[bin];
  if (block->bin_next != nullptr) {
    block->bin_next->bin_prev = block;
  }
  bins.heads[bin] = block;
  bins.occupied[bin / kBitsPerWord] |= uint64_t{1} << (bin % kBitsPerWord);
  bins.occupied_words |= uint64_t{1} << (bin / kBitsPerWord);
}

inline void BlockPool::erase(Block* block) {
  if (!is_small) {
    sorted_.erase(block);
    return;
  }
  StreamBins& bins = *binsFor(block->stream);
  const size_t bin = binOf(block);
  if (block->bin_prev != nullptr) {
    block->bin_prev->bin_next = block->bin_next;
  } else {
    bins.heads[bin] = block->bin_next;
  }
  if (block->bin_next != nullptr) {
    block->bin_next->bin_prev = block->bin_prev;
  }
  block->bin_prev = block->bin_next = nullptr;
  if (bins.heads[bin] == nullptr) {
    uint64_t& word = bins.occupied[bin / kBitsPerWord];
    word &= ~(uint64_t{1} << (bin % kBitsPerWord));
    if (word == 0) {
      bins.occupied_words &= ~(uint64_t{1} << (bin / kBitsPerWord));
    }
  }
}

inline Block* BlockPool::bestFit(c10::StreamId stream, size_t size) {
  if (!is_small) {
    Block key(0, stream, size, this, nullptr);
    auto it = sorted_.lower_bound(&key);
    return it == sorted_.end() || (*it)->stream != stream ? nullptr : *it;
  }
  const StreamBins& bins = *binsFor(stream);
  const size_t first = size / kMinBlockSize - 1;
  size_t word = first / kBitsPerWord;
  uint64_t bits = bins.occupied[word] & (~uint64_t{0} << (first % kBitsPerWord));
  if (bits == 0) {
    // The next non-empty word above, from the summary.
    const uint64_t above = word + 1 < kBitsPerWord
                               ? bins.occupied_words & (~uint64_t{0} << (word + 1))
                               : 0;
    if (above == 0) {
      return nullptr;
    }
    word = static_cast<size_t>(__builtin_ctzll(above));
    bits = bins.occupied[word];
  }
  return bins.heads[word * kBitsPerWord + __builtin_ctzll(bits)];
}

inline std::vector<Block*> BlockPool::all() const {
  std::vector<Block*> blocks(sorted_.begin(), sorted_.end());
  for (const auto& bins : bins_) {
    for (Block* head : bins->heads) {
      for (Block* b = head; b != nullptr; b = b->bin_next) {
        blocks.push_back(b);
      }
    }
  }
  return blocks;
}

}  // namespace allocator_detail
}  // namespace phantom
