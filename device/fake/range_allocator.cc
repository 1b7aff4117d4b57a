// Best-fit offset allocator with coalescing; see range_allocator.h.
#include "range_allocator.h"

#include <iterator>

namespace phantom::fake {

RangeAllocator::RangeAllocator(size_t capacity)
    : capacity_(capacity / kGranule * kGranule) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}

void RangeAllocator::InsertFree(size_t offset, size_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void RangeAllocator::EraseFree(std::map<size_t, size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

bool RangeAllocator::Allocate(size_t size, size_t* out_offset) {
  if (size == 0 || size > capacity_) return false;
  const size_t rounded = RoundUp(size);
  auto fit = free_by_size_.lower_bound({rounded, 0});
  if (fit == free_by_size_.end()) return false;
  const size_t range_size = fit->first;
  const size_t offset = fit->second;
  EraseFree(free_by_offset_.find(offset));
  if (range_size > rounded) InsertFree(offset + rounded, range_size - rounded);
  live_.emplace(offset, Block{offset, size, rounded});
  allocated_ += rounded;
  *out_offset = offset;
  return true;
}

bool RangeAllocator::Free(size_t offset, Block* out_block) {
  auto live = live_.find(offset);
  if (live == live_.end()) return false;
  *out_block = live->second;
  size_t start = offset;
  size_t size = live->second.rounded_size;
  allocated_ -= size;
  live_.erase(live);

  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    auto after = std::next(next);
    EraseFree(next);
    next = after;
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(start, size);
  return true;
}

bool RangeAllocator::Find(size_t offset, Block* out_block) const {
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return false;
  --it;
  if (offset >= it->first + it->second.rounded_size) return false;
  *out_block = it->second;
  return true;
}

bool RangeAllocator::AnyLiveIn(size_t begin, size_t end) const {
  if (begin >= end) return false;
  Block containing;
  if (Find(begin, &containing)) return true;
  auto next = live_.lower_bound(begin);
  return next != live_.end() && next->first < end;
}

size_t RangeAllocator::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

}  // namespace phantom::fake
