// Device ranges, the allocation mirror, pinned blocks and copy planning;
// client_memory.h has the design.
#include "client_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "client_link.h"
#include "wire.h"

namespace phantom::remote {
namespace {

struct Range {
  uintptr_t base = 0;
  uint64_t size = 0;
};

struct Allocation {
  size_t size;
  int device;
};

struct Tables {
  std::vector<Range> devices;  // written once, before any reader
  std::shared_mutex mutex;     // guards the maps
  std::map<uintptr_t, Allocation> allocations;
  std::map<uintptr_t, size_t> pinned;
};

Tables& GetTables() {
  static Tables* const tables = new Tables;  // leaked: used until exit
  return *tables;
}

std::string Pointer(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

ph_status_t CheckDeviceSide(const std::string& where, const void* ptr,
                            size_t size, Side* out) {
  const AllocationInfo info = LookupAllocation(ptr);
  if (info.device < 0) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                where + " " + Pointer(ptr) +
                    " is not device memory, but the copy kind says it is");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  if (!info.live) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                where + " " + Pointer(ptr) + " on phantom device " +
                    std::to_string(info.device) +
                    " is not inside a live allocation");
  }
  if (size > info.size || start - info.base > info.size - size) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                where + " range of " + std::to_string(size) + " bytes at " +
                    Pointer(ptr) + " runs past the end of its allocation of " +
                    std::to_string(info.size) + " bytes on phantom device " +
                    std::to_string(info.device));
  }
  out->device = true;
  out->server = ServerAddress(ptr);
  return PH_SUCCESS;
}

ph_status_t CheckHostSide(const std::string& where, const void* ptr,
                          size_t size, Side* out) {
  const int device = DeviceOfAddress(ptr);
  if (device >= 0) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                where + " " + Pointer(ptr) + " is memory of phantom device " +
                    std::to_string(device) +
                    ", but the copy kind says it is host memory");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  if (start > UINTPTR_MAX - size) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                where + " range at " + Pointer(ptr) +
                    " wraps around the address space");
  }
  out->host = const_cast<void*>(ptr);
  uintptr_t base = 0;
  size_t block = 0;
  if (!LookupPinned(ptr, &base, &block)) return PH_SUCCESS;  // pageable
  if (size > block || start - base > block - size) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                where + " range of " + std::to_string(size) + " bytes at " +
                    Pointer(ptr) + " runs past the end of its pinned block of " +
                    std::to_string(block) + " bytes");
  }
  out->pinned = true;
  out->server = start;
  return PH_SUCCESS;
}

}  // namespace

bool ReserveDeviceRanges(int count, uint64_t bytes_each, std::string* error) {
  Tables& tables = GetTables();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t size = (bytes_each + page - 1) / page * page;
  for (int d = 0; d < count; ++d) {
    void* base = ::mmap(nullptr, size, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      *error = "the phantom remote driver cannot reserve " +
               std::to_string(size) + " bytes of address space for device " +
               std::to_string(d) + ": " + std::strerror(errno) +
               " (PHANTOM_DEVICE_MEMORY and PHANTOM_DEVICE_COUNT set how "
               "much is needed)";
      return false;
    }
    tables.devices.push_back(Range{reinterpret_cast<uintptr_t>(base), size});
  }
  return true;
}

int DeviceOfAddress(const void* ptr) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  const std::vector<Range>& devices = GetTables().devices;
  for (size_t d = 0; d < devices.size(); ++d) {
    if (address >= devices[d].base && address - devices[d].base < devices[d].size) {
      return static_cast<int>(d);
    }
  }
  return -1;
}

void* DeviceAddress(int device, uint64_t offset) {
  return reinterpret_cast<void*>(GetTables().devices[device].base + offset);
}

uint64_t ServerAddress(const void* ptr) {
  const int device = DeviceOfAddress(ptr);
  const uint64_t offset =
      reinterpret_cast<uintptr_t>(ptr) - GetTables().devices[device].base;
  return (static_cast<uint64_t>(device) << kDeviceShift) | offset;
}

void AddAllocation(void* ptr, size_t size, int device) {
  Tables& tables = GetTables();
  std::unique_lock<std::shared_mutex> lock(tables.mutex);
  tables.allocations[reinterpret_cast<uintptr_t>(ptr)] = Allocation{size, device};
}

bool RemoveAllocation(void* ptr) {
  Tables& tables = GetTables();
  std::unique_lock<std::shared_mutex> lock(tables.mutex);
  return tables.allocations.erase(reinterpret_cast<uintptr_t>(ptr)) == 1;
}

AllocationInfo LookupAllocation(const void* ptr) {
  AllocationInfo info;
  info.device = DeviceOfAddress(ptr);
  if (info.device < 0) return info;
  Tables& tables = GetTables();
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock<std::shared_mutex> lock(tables.mutex);
  auto after = tables.allocations.upper_bound(address);
  if (after == tables.allocations.begin()) return info;
  const auto& [base, allocation] = *std::prev(after);
  if (address - base < allocation.size) {
    info.live = true;
    info.base = base;
    info.size = allocation.size;
  }
  return info;
}

ph_status_t AllocatePinned(size_t size, void** out_ptr) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (size + page - 1) / page * page;
  const int fd = ::memfd_create("phantom-remote-pinned", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    const int saved = errno;
    if (fd >= 0) ::close(fd);
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_host_malloc: cannot create " + std::to_string(size) +
                    " bytes of shared pinned memory: " + std::strerror(saved));
  }
  void* address = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, 0);
  if (address == MAP_FAILED) {
    ::close(fd);
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_host_malloc: cannot map " + std::to_string(size) +
                    " bytes of pinned memory");
  }
  Message request;
  request.a[0] = reinterpret_cast<uintptr_t>(address);
  request.a[1] = mapped;
  const ph_status_t registered =
      Call(Op::kPinnedRegister, request, nullptr, nullptr, fd);
  ::close(fd);
  if (registered != PH_SUCCESS) {
    ::munmap(address, mapped);
    return registered;
  }
  Tables& tables = GetTables();
  {
    std::unique_lock<std::shared_mutex> lock(tables.mutex);
    tables.pinned[reinterpret_cast<uintptr_t>(address)] = size;
  }
  *out_ptr = address;
  return PH_SUCCESS;
}

ph_status_t FreePinned(void* ptr) {
  Tables& tables = GetTables();
  size_t size = 0;
  {
    std::unique_lock<std::shared_mutex> lock(tables.mutex);
    auto found = tables.pinned.find(reinterpret_cast<uintptr_t>(ptr));
    if (found == tables.pinned.end()) {
      return Fail(PH_ERROR_INVALID_HANDLE,
                  "ph_host_free: " + Pointer(ptr) +
                      " is not the start of a pinned block from "
                      "ph_host_malloc");
    }
    size = found->second;
    tables.pinned.erase(found);
  }
  Message request;
  request.a[0] = reinterpret_cast<uintptr_t>(ptr);
  const ph_status_t status = Call(Op::kPinnedUnregister, request);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  ::munmap(ptr, (size + page - 1) / page * page);
  return status;
}

bool LookupPinned(const void* ptr, uintptr_t* out_base, size_t* out_size) {
  Tables& tables = GetTables();
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock<std::shared_mutex> lock(tables.mutex);
  auto after = tables.pinned.upper_bound(address);
  if (after == tables.pinned.begin()) return false;
  const auto& [base, size] = *std::prev(after);
  if (address - base >= size) return false;
  *out_base = base;
  *out_size = size;
  return true;
}

ph_status_t PlanCopy(const char* function, void* dst, const void* src,
                     size_t size, ph_memcpy_kind_t kind, CopyPlan* out) {
  const std::string name(function);
  if (kind < PH_MEMCPY_HOST_TO_HOST || kind > PH_MEMCPY_DEVICE_TO_DEVICE) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                name + ": unknown copy kind " +
                    std::to_string(static_cast<int>(kind)));
  }
  if (dst == nullptr || src == nullptr) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                name + ": null " + (dst == nullptr ? "destination" : "source") +
                    " for a copy of " + std::to_string(size) + " bytes");
  }
  const bool dst_device =
      kind == PH_MEMCPY_HOST_TO_DEVICE || kind == PH_MEMCPY_DEVICE_TO_DEVICE;
  const bool src_device =
      kind == PH_MEMCPY_DEVICE_TO_HOST || kind == PH_MEMCPY_DEVICE_TO_DEVICE;
  CopyPlan plan;
  plan.size = size;
  ph_status_t status =
      src_device ? CheckDeviceSide(name + ": source", src, size, &plan.src)
                 : CheckHostSide(name + ": source", src, size, &plan.src);
  if (status != PH_SUCCESS) return status;
  status = dst_device
               ? CheckDeviceSide(name + ": destination", dst, size, &plan.dst)
               : CheckHostSide(name + ": destination", dst, size, &plan.dst);
  if (status != PH_SUCCESS) return status;
  plan.pageable = (!plan.src.device && !plan.src.pinned) ||
                  (!plan.dst.device && !plan.dst.pinned);
  *out = plan;
  return PH_SUCCESS;
}

ph_status_t PlanFill(const char* function, void* dst, size_t size,
                     uint64_t* out_server_address) {
  if (dst == nullptr) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": null destination");
  }
  Side side;
  const ph_status_t status =
      CheckDeviceSide(std::string(function) + ": destination", dst, size, &side);
  if (status == PH_SUCCESS) *out_server_address = side.server;
  return status;
}

}  // namespace phantom::remote
