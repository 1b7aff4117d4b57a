// Client-side view of memory: device address ranges, the allocation
// mirror, pinned blocks, and copy planning.
//
// Design. Device memory lives in the server; the client only ever holds
// addresses. Each device gets a range of the client's address space
// reserved PROT_NONE (never readable or writable here, so host code that
// dereferences a device pointer faults at once, and no host allocation
// can ever share an address with device memory). A device pointer is
// `range base + offset`, the offset being what the server's allocator
// gave. The client mirrors the live allocations, so pointer attributes and
// the validation of copies are answered here without a round trip.
//
// Pinned host memory (ph_host_malloc) is a shared-memory block (memfd)
// mapped in both processes: the server copies into and out of it itself,
// so copies from pinned memory are truly asynchronous. Pageable memory is
// staged through the calling thread's staging block (client_link.h).
#ifndef PHANTOM_REMOTE_CLIENT_MEMORY_H_
#define PHANTOM_REMOTE_CLIENT_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "phantom/hal.h"

namespace phantom::remote {

// Reserves one address range per device; false with *error if it cannot.
bool ReserveDeviceRanges(int count, uint64_t bytes_each, std::string* error);

// The device whose range holds `ptr`, or -1.
int DeviceOfAddress(const void* ptr);
// The device pointer of `offset` on `device`.
void* DeviceAddress(int device, uint64_t offset);
// The server's name for a device pointer: (device << 56) | offset.
uint64_t ServerAddress(const void* ptr);

struct AllocationInfo {
  int device = -1;     // -1: not device memory
  bool live = false;   // inside a live allocation
  uintptr_t base = 0;
  size_t size = 0;
};

void AddAllocation(void* ptr, size_t size, int device);
bool RemoveAllocation(void* ptr);  // false: not a live allocation's start
AllocationInfo LookupAllocation(const void* ptr);

// Pinned blocks.
ph_status_t AllocatePinned(size_t size, void** out_ptr);
ph_status_t FreePinned(void* ptr);
bool LookupPinned(const void* ptr, uintptr_t* out_base, size_t* out_size);

// One side of a planned copy.
struct Side {
  bool device = false;   // device memory
  bool pinned = false;   // inside a pinned block
  uint64_t server = 0;   // device: ServerAddress; pinned: the client address
  void* host = nullptr;  // host sides: the pointer
};

struct CopyPlan {
  Side dst;
  Side src;
  size_t size = 0;
  bool pageable = false;  // a host side is pageable
};

// Checks a copy as hal.h describes (kinds, live ranges); sets the last
// error and returns PH_ERROR_INVALID_ARGUMENT when it is wrong.
ph_status_t PlanCopy(const char* function, void* dst, const void* src,
                     size_t size, ph_memcpy_kind_t kind, CopyPlan* out);
ph_status_t PlanFill(const char* function, void* dst, size_t size,
                     uint64_t* out_server_address);

}  // namespace phantom::remote

#endif  // PHANTOM_REMOTE_CLIENT_MEMORY_H_
