// Per-device arenas; see device_memory.h for the memory model.
#include "device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "config.h"
#include "errors.h"
#include "fault_handler.h"

namespace phantom::fake {
namespace {

std::string Hex(uintptr_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "0x%zx", static_cast<size_t>(value));
  return buffer;
}

// "64.00 MiB (67108864 bytes)", or "300 bytes" below 1 KiB.
std::string BytesForPeople(size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  return FormatBytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

namespace {

size_t AddressSpaceFor(size_t capacity) {
  const size_t extra = capacity * (kAddressSpaceFactor - 1);
  return capacity + (extra < kMaxExtraAddressSpace ? extra : kMaxExtraAddressSpace);
}

// An anonymous MAP_NORESERVE mapping of `size` bytes whose start is a
// multiple of kViewAlignment, or MAP_FAILED (errno set).
void* MapAligned(size_t size, int protection) {
  const size_t padded = size + kViewAlignment;
  void* raw = mmap(nullptr, padded, protection,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return MAP_FAILED;
  const uintptr_t first = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (first + kViewAlignment - 1) & ~(kViewAlignment - 1);
  if (start > first) munmap(raw, start - first);
  const uintptr_t tail = start + size;
  if (first + padded > tail) {
    munmap(reinterpret_cast<void*>(tail), first + padded - tail);
  }
  return reinterpret_cast<void*>(start);
}

}  // namespace

DeviceMemory::DeviceMemory(int device, size_t capacity)
    : device_(device),
      capacity_(capacity),
      address_space_(AddressSpaceFor(capacity)),
      allocator_(AddressSpaceFor(capacity)) {}

ph_status_t DeviceMemory::EnsureMappedLocked() {
  if (base_ != 0) return PH_SUCCESS;
  auto fail = [&](const char* step) {
    const int error = errno;
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "phantom device " + std::to_string(device_) +
                    " could not reserve its " + FormatBytes(capacity_) +
                    " of memory (" + step + ": " + std::strerror(error) +
                    "); lower PHANTOM_DEVICE_MEMORY or PHANTOM_DEVICE_COUNT");
  };
  void* base = MapAligned(address_space_, PROT_NONE);
  if (base == MAP_FAILED) return fail("mmap of the device range");
  void* view = MapAligned(address_space_, PROT_READ | PROT_WRITE);
  if (view == MAP_FAILED) {
    ph_status_t status = fail("mmap of the kernel view");
    munmap(base, address_space_);
    return status;
  }
  // Both are advice: without them the view still works, with 4 KiB pages
  // and inherited by a child.
  (void)madvise(view, address_space_, MADV_HUGEPAGE);
  (void)madvise(view, address_space_, MADV_DONTFORK);
  base_ = reinterpret_cast<uintptr_t>(base);
  view_ = reinterpret_cast<uintptr_t>(view);
  PublishDeviceRange(device_, base_, address_space_, view_);
  return PH_SUCCESS;
}

ph_status_t DeviceMemory::Allocate(size_t size, void** out_ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const ph_status_t mapped = EnsureMappedLocked();
  if (mapped != PH_SUCCESS) return mapped;
  size_t offset = 0;
  const size_t granule = RangeAllocator::kGranule;
  const size_t rounded = (size + granule - 1) / granule * granule;
  const bool within_capacity = rounded <= capacity_ - UsedLocked();
  if (!within_capacity || !allocator_.Allocate(size, &offset)) {
    const size_t free_bytes = capacity_ - UsedLocked();
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "phantom device " + std::to_string(device_) +
                    " is out of memory: tried to allocate " +
                    BytesForPeople(size) + "; capacity " +
                    BytesForPeople(capacity_) + ", " +
                    BytesForPeople(free_bytes) + " free, largest free range " +
                    BytesForPeople(std::min(allocator_.largest_free(), free_bytes)) +
                    " (PHANTOM_DEVICE_MEMORY sets the capacity)");
  }
  *out_ptr = reinterpret_cast<void*>(base_ + offset);
  return PH_SUCCESS;
}

ph_status_t DeviceMemory::Free(uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t offset = address - base_;
  if (ImportAtLocked(offset) != nullptr) {
    return Fail(PH_ERROR_INVALID_HANDLE,
                "ph_free: " + Hex(address) +
                    " is memory another process shared with this one "
                    "(ph_ipc_open_mem_handle); close it with "
                    "ph_ipc_close_mem_handle instead");
  }
  RangeAllocator::Block block;
  if (!allocator_.Free(offset, &block)) {
    if (allocator_.Find(offset, &block)) {
      return Fail(PH_ERROR_INVALID_HANDLE,
                  "ph_free: " + Hex(address) +
                      " points inside the allocation starting at " +
                      Hex(base_ + block.offset) + " on phantom device " +
                      std::to_string(device_) +
                      "; pass the pointer ph_malloc returned");
    }
    return Fail(PH_ERROR_INVALID_HANDLE,
                "ph_free: " + Hex(address) +
                    " is not a live allocation on phantom device " +
                    std::to_string(device_) + " (already freed?)");
  }
  if (!shared_pages_.empty()) UnshareFreedLocked(block.offset, block.rounded_size);
  if (block.rounded_size >= kReleasePagesThreshold) {
    const size_t page = PageSize();
    const size_t start = (block.offset + page - 1) / page * page;
    const size_t end = (block.offset + block.rounded_size) / page * page;
    if (end > start) {
      // Failure only means the pages stay resident; the free still holds.
      (void)madvise(reinterpret_cast<void*>(view_ + start), end - start,
                    MADV_DONTNEED);
    }
  }
  return PH_SUCCESS;
}

void DeviceMemory::Lookup(uintptr_t address, DeviceAddressInfo* info) {
  std::lock_guard<std::mutex> lock(mutex_);
  RangeAllocator::Block block;
  if (base_ == 0 || !allocator_.Find(address - base_, &block)) return;
  if (const Import* import = ImportAtLocked(block.offset)) {
    // Only the imported allocation itself is live, not the page padding.
    const size_t size = static_cast<size_t>(import->key.size);
    if (address < import->pointer || address - import->pointer >= size) return;
    info->live = true;
    info->base = import->pointer;
    info->size = size;
    return;
  }
  info->live = true;
  info->base = base_ + block.offset;
  info->size = block.size;
}

void DeviceMemory::GetInfo(size_t* out_free, size_t* out_total) {
  std::lock_guard<std::mutex> lock(mutex_);
  *out_free = capacity_ - UsedLocked();
  *out_total = capacity_;
}

ViewResidency DeviceMemory::Residency() {
  std::lock_guard<std::mutex> lock(mutex_);
  ViewResidency residency;
  if (view_ == 0) return residency;
  // The view's entries in /proc/self/smaps: "<start>-<end> ..." followed
  // by "Name: <n> kB" lines up to the next mapping's range. The view is one
  // mapping, or several once parts of it are shared or imported.
  std::FILE* smaps = std::fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return residency;
  char line[512];
  bool in_view = false;
  const unsigned long view_end = view_ + address_space_;
  while (std::fgets(line, sizeof line, smaps) != nullptr) {
    unsigned long start = 0;
    unsigned long end = 0;
    if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2) {
      in_view = start >= view_ && end <= view_end;
      residency.mapped = residency.mapped || start == view_;
      continue;
    }
    unsigned long kib = 0;
    if (!in_view) continue;
    if (std::sscanf(line, "Rss: %lu kB", &kib) == 1) {
      residency.resident += static_cast<size_t>(kib) * 1024;
    } else if (std::sscanf(line, "AnonHugePages: %lu kB", &kib) == 1) {
      residency.huge += static_cast<size_t>(kib) * 1024;
    }
  }
  std::fclose(smaps);
  return residency;
}

DeviceMemory& GetDeviceMemory(int device) {
  // Leaked on purpose: mappings must outlive every thread that may still
  // touch device memory while the process exits.
  static DeviceMemory** devices = [] {
    const Config& config = GetConfig();
    auto** table = new DeviceMemory*[kMaxDevices]();
    for (int i = 0; i < config.device_count; ++i) {
      table[i] = new DeviceMemory(i, config.device_memory);
    }
    return table;
  }();
  return *devices[device];
}

DeviceAddressInfo LookupDeviceAddress(const void* address) {
  DeviceAddressInfo info;
  const uintptr_t value = reinterpret_cast<uintptr_t>(address);
  info.device = DeviceOfAddress(value);
  if (info.device >= 0) GetDeviceMemory(info.device).Lookup(value, &info);
  return info;
}

void* KernelViewOf(const void* address) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(address);
  const int device = DeviceOfAddress(value);
  if (device < 0) return nullptr;
  return reinterpret_cast<void*>(DeviceViewBase(device) +
                                 (value - DeviceRangeBase(device)));
}

}  // namespace phantom::fake
