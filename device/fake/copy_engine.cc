// Copy validation and planning; see copy_engine.h.
#include "copy_engine.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "device_memory.h"
#include "errors.h"
#include "fault_handler.h"
#include "host_memory.h"

namespace phantom::fake {
namespace {

std::string Describe(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}

// Which side of which call a check is about ("ph_memcpy_async: source"),
// spelled out only when a check fails: a copy that passes builds no
// string (it is launched on every copy_).
struct CopySide {
  const char* function;
  const char* role;
  std::string Name() const { return std::string(function) + ": " + role; }
};

// Checks one device side; *out_view receives its kernel-view address.
ph_status_t CheckDeviceSide(const CopySide& side, const void* pointer,
                            size_t size, void** out_view) {
  const DeviceAddressInfo info = LookupDeviceAddress(pointer);
  if (info.device < 0) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                side.Name() + " " + Describe(pointer) +
                    " is not device memory, but the copy kind says it is");
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(pointer);
  if (!info.live) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                side.Name() + " " + Describe(pointer) + " on phantom device " +
                    std::to_string(info.device) +
                    " is not inside a live allocation");
  }
  if (size > info.size || start - info.base > info.size - size) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                side.Name() + " range of " + std::to_string(size) +
                    " bytes at " +
                    Describe(pointer) +
                    " runs past the end of its allocation of " +
                    std::to_string(info.size) + " bytes on phantom device " +
                    std::to_string(info.device));
  }
  *out_view = KernelViewOf(pointer);
  return PH_SUCCESS;
}

// Checks one host side; *out_pageable tells whether it is pageable, and
// *out_address is where the copy engine reads or writes it: the pointer
// itself for pageable memory, its alias for pinned memory (host_memory.h),
// so protection of the user's mapping does not stop a queued copy.
ph_status_t CheckHostSide(const CopySide& side, const void* pointer,
                          size_t size, bool* out_pageable,
                          void** out_address) {
  *out_address = const_cast<void*>(pointer);
  const uintptr_t start = reinterpret_cast<uintptr_t>(pointer);
  const int device = DeviceOfAddress(start);
  if (device >= 0) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                side.Name() + " " + Describe(pointer) + " is memory of phantom "
                    "device " + std::to_string(device) +
                    ", but the copy kind says it is host memory");
  }
  if (start > UINTPTR_MAX - size) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                side.Name() + " range at " + Describe(pointer) +
                    " wraps around the address space");
  }
  uintptr_t base = 0;
  size_t block_size = 0;
  void* alias = nullptr;
  if (!LookupPinnedAlias(pointer, &base, &block_size, &alias)) {
    *out_pageable = true;
    return PH_SUCCESS;
  }
  if (size > block_size || start - base > block_size - size) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                side.Name() + " range of " + std::to_string(size) +
                    " bytes at " +
                    Describe(pointer) +
                    " runs past the end of its pinned block of " +
                    std::to_string(block_size) + " bytes");
  }
  *out_pageable = false;
  *out_address = alias;
  return PH_SUCCESS;
}

}  // namespace

ph_status_t PlanCopy(const char* function, void* dst, const void* src,
                     size_t size, ph_memcpy_kind_t kind, CopyPlan* out_plan) {
  if (kind < PH_MEMCPY_HOST_TO_HOST || kind > PH_MEMCPY_DEVICE_TO_DEVICE) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": unknown copy kind " +
                    std::to_string(static_cast<int>(kind)));
  }
  if (dst == nullptr || src == nullptr) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": null " +
                    (dst == nullptr ? "destination" : "source") +
                    " for a copy of " + std::to_string(size) + " bytes");
  }
  const bool dst_device =
      kind == PH_MEMCPY_HOST_TO_DEVICE || kind == PH_MEMCPY_DEVICE_TO_DEVICE;
  const bool src_device =
      kind == PH_MEMCPY_DEVICE_TO_HOST || kind == PH_MEMCPY_DEVICE_TO_DEVICE;
  CopyPlan plan;
  plan.size = size;
  bool pageable = false;
  ph_status_t status;
  void* view = nullptr;
  if (src_device) {
    status = CheckDeviceSide({function, "source"}, src, size, &view);
    plan.src = view;
  } else {
    void* address = nullptr;
    status =
        CheckHostSide({function, "source"}, src, size, &pageable, &address);
    plan.src = address;
    plan.pageable_host = pageable;
  }
  if (status != PH_SUCCESS) return status;
  if (dst_device) {
    status = CheckDeviceSide({function, "destination"}, dst, size, &view);
    plan.dst = view;
  } else {
    void* address = nullptr;
    status = CheckHostSide({function, "destination"}, dst, size, &pageable,
                           &address);
    plan.dst = address;
    plan.pageable_host = plan.pageable_host || pageable;
  }
  if (status != PH_SUCCESS) return status;
  *out_plan = plan;
  return PH_SUCCESS;
}

ph_status_t PlanFill(const char* function, void* dst, size_t size,
                     void** out_view) {
  if (dst == nullptr) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": null destination");
  }
  return CheckDeviceSide({function, "destination"}, dst, size, out_view);
}

}  // namespace phantom::fake
