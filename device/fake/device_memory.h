// Device memory: one arena per device, a reserved range and a kernel view.
//
// Each device has two anonymous mappings of the same length, reserved with
// MAP_NORESERVE (untouched memory costs nothing):
//   - PROT_NONE: these addresses are the device pointers ph_malloc returns.
//     Host code that dereferences one faults (see fault_handler.h). Nothing
//     is ever mapped there; it is address space only.
//   - PROT_READ|PROT_WRITE: the "kernel view", where the device's bytes
//     live. Work running on a stream and the copy engine reach device byte
//     d at view + (d - base).
// No protection is ever toggled, so concurrent threads see one consistent
// memory. The arena is mapped lazily at the first allocation on the device,
// so an unused device costs no address space; once mapped it stays mapped
// for the life of the process (device pointers must never be reused for
// host memory).
//
// The view is private anonymous memory, 2 MiB-aligned and advised for
// transparent huge pages (MADV_HUGEPAGE), as a GPU maps its memory with
// large pages: a kernel that gathers rows from a large table (EmbeddingBag
// over 256 MiB) misses the TLB far less, and a fresh 2 MiB block costs one
// page fault instead of 512. Where THP is off ("never") the advice is
// ignored and the view uses 4 KiB pages. The view is not inherited by a
// forked child (MADV_DONTFORK, as a GPU driver's mappings are not): the
// runtime refuses device use in such a child, and the parent does not pay
// copy-on-write faults on its device memory after every fork. (Shared
// memory, a memfd, would alias the two mappings but gets no huge pages
// where shmem THP is off, the usual default.)
//
// The device's address range is larger than its capacity (kAddressSpace-
// Factor times, at most kMaxExtraAddressSpace more): capacity is enforced
// by counting bytes, and the spare addresses play the part of a GPU
// driver's virtual memory, so that freeing memory makes the whole capacity
// allocatable again instead of leaving it fragmented around a small block
// that is still live.
//
// Sub-allocation is a RangeAllocator (best fit, coalescing). Freeing a block
// of at least kReleasePagesThreshold returns the view's pages over the
// block's page-aligned interior to the OS (MADV_DONTNEED), the way freeing
// device memory on hardware makes it available again; reallocated, those
// bytes read as zero.
//
// Interprocess sharing (ipc.h; device_memory_sharing.cc). Another process
// can only map memory that lives in a file, so an exported allocation's
// pages move, at its first export, from the private view into the device's
// memory file (a memfd as large as the device range; file offset = arena
// offset), mapped shared at the same view addresses: the bytes are copied
// with the range read-only, and a write that comes meanwhile waits in the
// fault handler (fault_handler.h) and lands on the shared pages. Only
// shared memory loses huge pages (shmem THP is usually off); every other
// allocation keeps the private, huge-page view. When a freed block leaves
// whole pages that no live block uses, those pages go back to private
// memory and their file pages are released (hole punched). An importing
// process maps the exporter's file into a reserved range of its own device
// range's view, so the pointer it gets is device memory of that device
// whose kernel view is the exporter's bytes; the reservation does not count
// against its capacity.
//
// Locking: one mutex per device guards its allocator and lazy mapping. It is
// held only for bookkeeping (and the page release, so the range cannot be
// re-allocated and written before the release lands; and moves of pages
// between private and shared memory); copies never hold it.
#ifndef PHANTOM_FAKE_DEVICE_MEMORY_H_
#define PHANTOM_FAKE_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "phantom/hal.h"
#include "range_allocator.h"

namespace phantom::fake {

constexpr size_t kReleasePagesThreshold = size_t{2} << 20;  // 2 MiB
constexpr size_t kViewAlignment = size_t{2} << 20;  // a huge page
constexpr size_t kAddressSpaceFactor = 4;  // device range = capacity * this ...
constexpr size_t kMaxExtraAddressSpace = size_t{64} << 30;  // ... or + 64 GiB

// Where a device address lies.
struct DeviceAddressInfo {
  int device = -1;       // -1: not in any device's range
  bool live = false;     // inside a live allocation
  uintptr_t base = 0;    // start of that allocation
  size_t size = 0;       // its requested size
};

// How much of a device's kernel view is backed by pages, from
// /proc/self/smaps (for tests of page release, huge pages and fork).
struct ViewResidency {
  bool mapped = false;  // this process has the view mapped
  size_t resident = 0;  // bytes backed by pages
  size_t huge = 0;      // of those, bytes in transparent huge pages
};

// What another process needs to reach an exported allocation.
struct ExportedAllocation {
  int fd = -1;         // this process's descriptor of the device memory file
  uint64_t inode = 0;  // the file's identity (st_ino, st_dev)
  uint64_t dev = 0;
  uint64_t offset = 0;  // the allocation's start in the file
  uint64_t size = 0;    // its size as requested
};

// An exporter's allocation as an importer names it: one open import each.
struct ImportKey {
  int64_t pid = 0;
  uint64_t inode = 0;
  uint64_t dev = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  bool operator<(const ImportKey& other) const {
    return std::tie(pid, inode, dev, offset, size) <
           std::tie(other.pid, other.inode, other.dev, other.offset,
                    other.size);
  }
};

class DeviceMemory {
 public:
  DeviceMemory(int device, size_t capacity);
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // ph_malloc semantics (size > 0). Sets the last error on failure.
  ph_status_t Allocate(size_t size, void** out_ptr);
  // ph_free semantics for an address in this device's range.
  ph_status_t Free(uintptr_t address);
  // Fills the allocation fields of *info for an address in this device.
  void Lookup(uintptr_t address, DeviceAddressInfo* info);
  // Bytes not reserved by live allocations, and the capacity.
  void GetInfo(size_t* out_free, size_t* out_total);
  ViewResidency Residency();

  // --- Interprocess sharing (device_memory_sharing.cc) ---
  // Makes the live allocation containing `address` reachable from other
  // processes and describes it. PH_ERROR_INVALID_ARGUMENT if `address` is
  // not in a live allocation of this device or is an imported one.
  ph_status_t Export(uintptr_t address, ExportedAllocation* out);
  // Maps the exporter's allocation `key` from its memory file `fd` (open
  // here) into this device; opening a key already open counts one more
  // open and returns the same pointer.
  ph_status_t OpenImport(const ImportKey& key, int fd, void** out_ptr);
  // Undoes one OpenImport of the pointer it returned;
  // PH_ERROR_INVALID_HANDLE if `address` is not one.
  ph_status_t CloseImport(uintptr_t address);
  // Bytes of the view now backed by the device memory file (for tests).
  size_t SharedViewBytes();

 private:
  struct Import {
    ImportKey key;
    size_t reservation = 0;  // its block in allocator_ (arena offset)
    size_t map_offset = 0;   // page-aligned arena offset of the mapping
    size_t map_length = 0;
    uintptr_t pointer = 0;   // what OpenImport returned
    int opens = 0;
  };

  ph_status_t EnsureMappedLocked();
  // Capacity used by this process's own allocations (imports excluded).
  size_t UsedLocked() const;
  // The import whose reservation contains arena offset `offset`, or null.
  const Import* ImportAtLocked(size_t offset) const;
  ph_status_t EnsureMemoryFileLocked();
  // Moves view pages [begin, end) (page-aligned arena offsets) that are not
  // shared yet into the memory file.
  ph_status_t ShareViewLocked(size_t begin, size_t end);
  ph_status_t MoveToMemoryFileLocked(size_t begin, size_t end);
  // After block [offset, offset + size) was freed: shared pages that no
  // live block uses go back to private memory.
  void UnshareFreedLocked(size_t offset, size_t size);
  // Replaces view pages [begin, end) with fresh private memory.
  void MapPrivateLocked(size_t begin, size_t end);

  const int device_;
  const size_t capacity_;
  const size_t address_space_;  // size of the device range (>= capacity_)
  std::mutex mutex_;  // guards everything below
  RangeAllocator allocator_;
  uintptr_t base_ = 0;  // PROT_NONE mapping, 0 until mapped
  uintptr_t view_ = 0;  // read-write mapping
  // Sharing: the device memory file (-1 until the first export), the view
  // pages backed by it ([start, end) arena offsets, disjoint, merged), and
  // what this process imported, by reservation offset and by key.
  int memory_file_ = -1;
  uint64_t memory_file_inode_ = 0;
  uint64_t memory_file_dev_ = 0;
  std::map<size_t, size_t> shared_pages_;
  std::map<size_t, Import> imports_;
  std::map<ImportKey, size_t> import_by_key_;
  size_t imported_reserved_ = 0;  // rounded bytes of import reservations
};

// Device `device` (0 <= device < configured count). The objects live for the
// whole process.
DeviceMemory& GetDeviceMemory(int device);

// Classifies a device address without taking any lock if it is not device
// memory; takes the owning device's lock to resolve the allocation.
DeviceAddressInfo LookupDeviceAddress(const void* address);

// The kernel-view address of device address `address` (which must lie in a
// mapped device range). Pure arithmetic, lock-free.
void* KernelViewOf(const void* address);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_DEVICE_MEMORY_H_
