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
// Locking: one mutex per device guards its allocator and lazy mapping. It is
// held only for bookkeeping (and the page release, so the range cannot be
// re-allocated and written before the release lands); copies never hold it.
#ifndef PHANTOM_FAKE_DEVICE_MEMORY_H_
#define PHANTOM_FAKE_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <mutex>

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

 private:
  ph_status_t EnsureMappedLocked();

  const int device_;
  const size_t capacity_;
  const size_t address_space_;  // size of the device range (>= capacity_)
  std::mutex mutex_;  // guards everything below
  RangeAllocator allocator_;
  uintptr_t base_ = 0;  // PROT_NONE mapping, 0 until mapped
  uintptr_t view_ = 0;  // read-write mapping
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
