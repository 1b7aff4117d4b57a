// A best-fit allocator of offsets within one device's address range.
//
// It manages numbers, not memory, so it is unit-testable without mapping
// anything. Every request is rounded up to kGranule (512 bytes); since the
// range starts page-aligned, every block starts on a 512-byte boundary,
// which satisfies hal.h's 256-byte alignment promise.
//
// Free ranges are indexed twice: by (size, offset) for best fit (the
// smallest range that fits, lowest address among equals) and by offset for
// coalescing with both neighbours on free. Live blocks are indexed by
// offset so a free of anything but a block start is refused and so interior
// pointers can be resolved to their block. All operations are O(log n).
//
// Not thread-safe: the owning DeviceMemory holds its per-device lock.
#ifndef PHANTOM_FAKE_RANGE_ALLOCATOR_H_
#define PHANTOM_FAKE_RANGE_ALLOCATOR_H_

#include <cstddef>
#include <map>
#include <set>
#include <utility>

namespace phantom::fake {

class RangeAllocator {
 public:
  static constexpr size_t kGranule = 512;  // bytes; size rounding unit

  struct Block {
    size_t offset = 0;
    size_t size = 0;          // as requested
    size_t rounded_size = 0;  // as reserved (multiple of kGranule)
  };

  explicit RangeAllocator(size_t capacity);

  // Reserves `size` (> 0) bytes. Returns false when no free range fits.
  bool Allocate(size_t size, size_t* out_offset);

  // Releases the block starting exactly at `offset`. Returns false (and
  // changes nothing) if no live block starts there. *out_block receives the
  // freed block.
  bool Free(size_t offset, Block* out_block);

  // The live block containing `offset`, if any.
  bool Find(size_t offset, Block* out_block) const;

  // Whether any live block (counting its rounded size) overlaps
  // [begin, end). Used to tell whether a page is still shared with a
  // neighbour when a block is freed.
  bool AnyLiveIn(size_t begin, size_t end) const;

  size_t capacity() const { return capacity_; }
  size_t allocated() const { return allocated_; }  // sum of rounded sizes
  size_t largest_free() const;
  size_t free_range_count() const { return free_by_offset_.size(); }

  static size_t RoundUp(size_t size) {
    return (size + kGranule - 1) / kGranule * kGranule;
  }

 private:
  void InsertFree(size_t offset, size_t size);
  void EraseFree(std::map<size_t, size_t>::iterator it);

  size_t capacity_;
  size_t allocated_ = 0;
  std::set<std::pair<size_t, size_t>> free_by_size_;  // (size, offset)
  std::map<size_t, size_t> free_by_offset_;           // offset -> size
  std::map<size_t, Block> live_;                      // offset -> block
};

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_RANGE_ALLOCATOR_H_
