// DeviceMemory's interprocess sharing: exporting an allocation (moving its
// view pages into the device memory file), importing another process's
// allocation into this device's view, and giving shared pages back to
// private memory. The model is described in device_memory.h; the handles
// that carry an ExportedAllocation between processes are in ipc.cc.
//
// Moving pages (MoveToMemoryFileLocked) is the delicate step: other
// threads (stream workers, the copy engine) may be writing to other blocks
// on the same pages while it runs, and a write made between the copy and
// the remapping would be lost. So the range is made read-only first; a
// writer then faults, and the fault handler holds it until the shared
// pages are mapped in, after which its write is retried on them. Readers
// are never disturbed: both mappings hold the same bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "device_memory.h"
#include "errors.h"
#include "fault_handler.h"

namespace phantom::fake {
namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundDown(size_t value, size_t unit) { return value / unit * unit; }
size_t RoundUp(size_t value, size_t unit) {
  return (value + unit - 1) / unit * unit;
}

// Reading a page of the view that was never written maps the zero page
// (no memory); such pages are not copied, so the file keeps a hole there.
bool IsZeroPage(const char* page, size_t size) {
  const auto* words = reinterpret_cast<const uint64_t*>(page);
  for (size_t i = 0; i < size / sizeof(uint64_t); ++i) {
    if (words[i] != 0) return false;
  }
  return true;
}

bool WriteAll(int fd, const char* data, size_t size, size_t offset) {
  while (size > 0) {
    const ssize_t written = pwrite(fd, data, size, static_cast<off_t>(offset));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    data += written;
    size -= static_cast<size_t>(written);
    offset += static_cast<size_t>(written);
  }
  return true;
}

// The parts of [begin, end) not covered by `ranges` (disjoint, by start).
std::vector<std::pair<size_t, size_t>> Gaps(
    const std::map<size_t, size_t>& ranges, size_t begin, size_t end) {
  std::vector<std::pair<size_t, size_t>> gaps;
  size_t at = begin;
  auto it = ranges.upper_bound(begin);
  if (it != ranges.begin()) --it;
  for (; it != ranges.end() && it->first < end; ++it) {
    if (it->second <= at) continue;
    if (it->first > at) gaps.emplace_back(at, it->first);
    at = it->second;
    if (at >= end) break;
  }
  if (at < end) gaps.emplace_back(at, end);
  return gaps;
}

// The parts of [begin, end) covered by `ranges`.
std::vector<std::pair<size_t, size_t>> Overlaps(
    const std::map<size_t, size_t>& ranges, size_t begin, size_t end) {
  std::vector<std::pair<size_t, size_t>> overlaps;
  auto it = ranges.upper_bound(begin);
  if (it != ranges.begin()) --it;
  for (; it != ranges.end() && it->first < end; ++it) {
    const size_t from = it->first > begin ? it->first : begin;
    const size_t to = it->second < end ? it->second : end;
    if (from < to) overlaps.emplace_back(from, to);
  }
  return overlaps;
}

// Adds [begin, end) to `ranges`, merging with touching neighbours.
void AddRange(std::map<size_t, size_t>& ranges, size_t begin, size_t end) {
  auto next = ranges.lower_bound(begin);
  if (next != ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->second >= begin) {
      begin = prev->first;
      if (prev->second > end) end = prev->second;
      ranges.erase(prev);
    }
  }
  next = ranges.lower_bound(begin);
  while (next != ranges.end() && next->first <= end) {
    if (next->second > end) end = next->second;
    next = ranges.erase(next);
  }
  ranges.emplace(begin, end);
}

// Removes [begin, end) from `ranges`, splitting a range that straddles it.
void RemoveRange(std::map<size_t, size_t>& ranges, size_t begin, size_t end) {
  for (const auto& [from, to] : Overlaps(ranges, begin, end)) {
    auto it = ranges.upper_bound(from);
    --it;  // the range containing `from`
    const size_t start = it->first;
    const size_t stop = it->second;
    ranges.erase(it);
    if (start < from) ranges.emplace(start, from);
    if (to < stop) ranges.emplace(to, stop);
  }
}

std::string ErrnoText(const char* step) {
  return std::string(step) + ": " + std::strerror(errno);
}

}  // namespace

size_t DeviceMemory::UsedLocked() const {
  return allocator_.allocated() - imported_reserved_;
}

const DeviceMemory::Import* DeviceMemory::ImportAtLocked(size_t offset) const {
  if (imports_.empty()) return nullptr;
  auto it = imports_.find(offset);
  if (it != imports_.end()) return &it->second;
  RangeAllocator::Block block;
  if (!allocator_.Find(offset, &block)) return nullptr;
  it = imports_.find(block.offset);
  return it == imports_.end() ? nullptr : &it->second;
}

ph_status_t DeviceMemory::EnsureMemoryFileLocked() {
  if (memory_file_ >= 0) return PH_SUCCESS;
  const std::string name = "phantom-device-" + std::to_string(device_);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  auto fail = [&](const std::string& step) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "phantom device " + std::to_string(device_) +
                    " could not create the file that shares its memory with "
                    "other processes (" + step + ")");
  };
  if (fd < 0) return fail(ErrnoText("memfd_create"));
  struct stat status = {};
  if (ftruncate(fd, static_cast<off_t>(address_space_)) != 0 ||
      fstat(fd, &status) != 0) {
    const std::string step = ErrnoText("ftruncate");
    close(fd);
    return fail(step);
  }
  memory_file_ = fd;
  memory_file_inode_ = static_cast<uint64_t>(status.st_ino);
  memory_file_dev_ = static_cast<uint64_t>(status.st_dev);
  return PH_SUCCESS;
}

ph_status_t DeviceMemory::Export(uintptr_t address, ExportedAllocation* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  RangeAllocator::Block block;
  if (base_ == 0 || address < base_ ||
      !allocator_.Find(address - base_, &block)) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_ipc_get_mem_handle: the pointer is not inside a live "
                "allocation on phantom device " + std::to_string(device_));
  }
  if (ImportAtLocked(block.offset) != nullptr) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_ipc_get_mem_handle: the pointer is memory another process "
                "shared with this one; send the handle it was opened from");
  }
  ph_status_t status = EnsureMemoryFileLocked();
  if (status != PH_SUCCESS) return status;
  const size_t page = PageSize();
  status = ShareViewLocked(RoundDown(block.offset, page),
                           RoundUp(block.offset + block.rounded_size, page));
  if (status != PH_SUCCESS) return status;
  out->fd = memory_file_;
  out->inode = memory_file_inode_;
  out->dev = memory_file_dev_;
  out->offset = block.offset;
  out->size = block.size;
  return PH_SUCCESS;
}

ph_status_t DeviceMemory::ShareViewLocked(size_t begin, size_t end) {
  for (const auto& [from, to] : Gaps(shared_pages_, begin, end)) {
    const ph_status_t status = MoveToMemoryFileLocked(from, to);
    if (status != PH_SUCCESS) return status;
    AddRange(shared_pages_, from, to);
  }
  return PH_SUCCESS;
}

ph_status_t DeviceMemory::MoveToMemoryFileLocked(size_t begin, size_t end) {
  char* const view = reinterpret_cast<char*>(view_);
  const size_t length = end - begin;
  const size_t page = PageSize();
  auto fail = [&](const std::string& step) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "phantom device " + std::to_string(device_) +
                    " could not move " + FormatBytes(length) +
                    " of memory into shared memory to export it (" + step +
                    ")");
  };
  BeginViewMigration(device_, view_ + begin, view_ + end);
  struct CloseWindow {
    int device;
    ~CloseWindow() { EndViewMigration(device); }
  } close_window{device_};
  if (mprotect(view + begin, length, PROT_READ) != 0) {
    return fail(ErrnoText("mprotect"));
  }
  auto undo = [&](const std::string& step) {
    (void)mprotect(view + begin, length, PROT_READ | PROT_WRITE);
    (void)fallocate(memory_file_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(begin), static_cast<off_t>(length));
    return fail(step);
  };
  size_t run = end;  // start of the current run of non-zero pages
  for (size_t at = begin; at <= end; at += page) {
    const bool copy = at < end && !IsZeroPage(view + at, page);
    if (copy && run == end) run = at;
    if (!copy && run != end) {
      if (!WriteAll(memory_file_, view + run, at - run, run)) {
        return undo(ErrnoText("writing the memory file"));
      }
      run = end;
    }
  }
  void* mapped = mmap(view + begin, length, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED, memory_file_,
                      static_cast<off_t>(begin));
  if (mapped == MAP_FAILED) return undo(ErrnoText("mmap"));
  // A forked child does not inherit device memory (device_memory.h).
  (void)madvise(view + begin, length, MADV_DONTFORK);
  return PH_SUCCESS;
}

void DeviceMemory::MapPrivateLocked(size_t begin, size_t end) {
  char* const at = reinterpret_cast<char*>(view_ + begin);
  const size_t length = end - begin;
  void* mapped = mmap(at, length, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                      -1, 0);
  if (mapped == MAP_FAILED) {
    // The shared pages stay where they were: still correct memory, only
    // without huge pages. Nothing to report to the caller of ph_free.
    return;
  }
  (void)madvise(at, length, MADV_HUGEPAGE);
  (void)madvise(at, length, MADV_DONTFORK);
}

void DeviceMemory::UnshareFreedLocked(size_t offset, size_t size) {
  const size_t page = PageSize();
  size_t begin = RoundDown(offset, page);
  size_t end = RoundUp(offset + size, page);
  // A first or last page that a live neighbour still uses stays shared.
  if (begin < offset && allocator_.AnyLiveIn(begin, offset)) begin += page;
  if (end > offset + size && allocator_.AnyLiveIn(offset + size, end)) {
    end -= page;
  }
  if (begin >= end) return;
  for (const auto& [from, to] : Overlaps(shared_pages_, begin, end)) {
    MapPrivateLocked(from, to);
    // The file's pages go back to the host (an importer that still maps
    // them, against the rules, reads zeros).
    (void)fallocate(memory_file_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(from), static_cast<off_t>(to - from));
    RemoveRange(shared_pages_, from, to);
  }
}

size_t DeviceMemory::SharedViewBytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bytes = 0;
  for (const auto& range : shared_pages_) bytes += range.second - range.first;
  return bytes;
}

ph_status_t DeviceMemory::OpenImport(const ImportKey& key, int fd,
                                     void** out_ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto known = import_by_key_.find(key);
  if (known != import_by_key_.end()) {
    Import& import = imports_.at(known->second);
    import.opens += 1;
    *out_ptr = reinterpret_cast<void*>(import.pointer);
    return PH_SUCCESS;
  }
  ph_status_t status = EnsureMappedLocked();
  if (status != PH_SUCCESS) return status;
  const size_t page = PageSize();
  Import import;
  import.key = key;
  const size_t file_start = RoundDown(static_cast<size_t>(key.offset), page);
  import.map_length =
      RoundUp(static_cast<size_t>(key.offset + key.size), page) - file_start;
  // Room for a page-aligned mapping inside a block of the device range.
  const size_t reserve = import.map_length + page - RangeAllocator::kGranule;
  if (!allocator_.Allocate(reserve, &import.reservation)) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_ipc_open_mem_handle: phantom device " +
                    std::to_string(device_) + " has no free address range of " +
                    FormatBytes(reserve) + " to map the shared memory into");
  }
  import.map_offset = RoundUp(import.reservation, page);
  char* const at = reinterpret_cast<char*>(view_ + import.map_offset);
  void* mapped = mmap(at, import.map_length, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED, fd, static_cast<off_t>(file_start));
  if (mapped == MAP_FAILED) {
    const std::string step = ErrnoText("mmap");
    MapPrivateLocked(import.map_offset, import.map_offset + import.map_length);
    RangeAllocator::Block ignored;
    allocator_.Free(import.reservation, &ignored);
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_ipc_open_mem_handle: could not map the shared memory into "
                "phantom device " + std::to_string(device_) + " (" + step + ")");
  }
  (void)madvise(at, import.map_length, MADV_DONTFORK);
  import.pointer = base_ + import.map_offset + (key.offset - file_start);
  import.opens = 1;
  RangeAllocator::Block block;
  allocator_.Find(import.reservation, &block);
  imported_reserved_ += block.rounded_size;
  import_by_key_.emplace(key, import.reservation);
  *out_ptr = reinterpret_cast<void*>(import.pointer);
  imports_.emplace(import.reservation, std::move(import));
  return PH_SUCCESS;
}

ph_status_t DeviceMemory::CloseImport(uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Import* found =
      base_ != 0 && address >= base_ ? ImportAtLocked(address - base_) : nullptr;
  if (found == nullptr || found->pointer != address) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "ph_ipc_close_mem_handle: %p is not a pointer that "
                  "ph_ipc_open_mem_handle returned on phantom device %d (or "
                  "it was closed already)",
                  reinterpret_cast<void*>(address), device_);
    return Fail(PH_ERROR_INVALID_HANDLE, text);
  }
  Import& import = imports_.at(found->reservation);
  if (--import.opens > 0) return PH_SUCCESS;
  MapPrivateLocked(import.map_offset, import.map_offset + import.map_length);
  RangeAllocator::Block block;
  allocator_.Free(import.reservation, &block);
  imported_reserved_ -= block.rounded_size;
  import_by_key_.erase(import.key);
  imports_.erase(import.reservation);
  return PH_SUCCESS;
}

}  // namespace phantom::fake
