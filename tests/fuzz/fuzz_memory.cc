// The fuzzer's memory operations (fuzz_model.h): ph_malloc of any size,
// ph_free of live, freed, interior and made-up pointers, pinned and
// pageable host buffers, synchronous and stream-ordered copies and fills
// between them, and read-backs compared with each buffer's host shadow;
// after each, the driver's accounting is checked against the model.
#include "fuzz_model.h"

namespace hal_fuzz {

/* ---- Memory ------------------------------------------------------------- */

void Program::CheckMemory(int device) {
  size_t free_bytes = 0, total = 0;
  Expect("ph_mem_get_info", ph_mem_get_info(device, &free_bytes, &total),
         {PH_SUCCESS});
  if (total != kCapacity) {
    Violation("ph_mem_get_info(%d): total %zu, expected the capacity %zu",
              device, total, kCapacity);
  }
  if (free_bytes > total) {
    Violation("ph_mem_get_info(%d): free %zu exceeds total %zu", device,
              free_bytes, total);
  }
  if (concurrent_) return;
  const size_t expected = kCapacity - g_used[device].load();
  if (free_bytes != expected) {
    Violation("ph_mem_get_info(%d): free %zu, but the live allocations "
              "leave %zu",
              device, free_bytes, expected);
  }
}

void Program::Malloc(Input& in) {
  bool valid = true;
  const int device = PickDevice(in, &valid);
  const uint8_t mode = in.U8();
  size_t size = 0;
  const size_t used = valid ? g_used[device].load() : 0;
  switch (mode % 10) {
    case 0: size = 0; break;
    case 1: size = 1 + mode / 16; break;
    case 2: case 3: size = 1 + in.U16() % (2 * kWindow); break;
    case 4: size = 1 + in.U32() % (size_t{1} << 20); break;
    case 5: size = 1 + in.U32() % kCapacity; break;
    case 6: size = kCapacity - (mode & 0x10 ? 0 : mode >> 5); break;
    case 7: size = kCapacity - used + (mode >> 5); break;  // all that is free
    case 8: size = SIZE_MAX - in.U8(); break;
    default: size = kCapacity + 1 + in.U32(); break;
  }
  if (buffers_.size() >= kMaxDeviceBuffers && size != 0) size = SIZE_MAX;
  void* ptr = reinterpret_cast<void*>(0x1);
  const ph_status_t status = ph_malloc(device, size, &ptr);
  if (!valid) {
    Expect("ph_malloc on a bad device", status, {PH_ERROR_INVALID_DEVICE});
  } else if (size == 0) {
    Expect("ph_malloc(0)", status, {PH_SUCCESS});
  } else if (size > kCapacity ||
             (!concurrent_ && Rounded(size) > kCapacity - used)) {
    Expect("ph_malloc of more than is free", status, {PH_ERROR_OUT_OF_MEMORY});
  } else {
    // A fragmented address range may refuse a request that fits in the
    // free byte count; hal.h allows that.
    Expect("ph_malloc", status, {PH_SUCCESS, PH_ERROR_OUT_OF_MEMORY});
  }
  if (status != PH_SUCCESS || size == 0) {
    if (ptr != nullptr) Violation("ph_malloc left *out_ptr non-NULL (%s)",
                                  ph_status_name(status));
    return;
  }
  if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 256 != 0) {
    Violation("ph_malloc(%zu) gave %p: NULL or not 256-byte aligned", size,
              ptr);
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& other : buffers_) {
    if (other->kind != BufferKind::kDevice) continue;
    const uintptr_t other_start = reinterpret_cast<uintptr_t>(other->ptr);
    if (start < other_start + other->size && other_start < start + size) {
      Violation("ph_malloc(%zu) gave %p, overlapping the live allocation "
                "%p of %zu bytes",
                size, ptr, other->ptr, other->size);
    }
  }
  g_used[device] += Rounded(size);
  auto buffer = std::make_shared<Buffer>();
  buffer->kind = BufferKind::kDevice;
  buffer->ptr = static_cast<uint8_t*>(ptr);
  buffer->size = size;
  buffer->device = device;
  buffer->window = size < kWindow ? size : kWindow;
  buffer->shadow.assign(buffer->window, 0);
  buffer->known.assign(buffer->window, 0);  // contents unspecified
  buffers_.push_back(buffer);
  // Remove the new pointer from the stale list if the address was reused.
  for (auto it = freed_device_.begin(); it != freed_device_.end();) {
    const uintptr_t stale = reinterpret_cast<uintptr_t>(*it);
    it = stale >= start && stale < start + size ? freed_device_.erase(it)
                                                : it + 1;
  }
  CheckMemory(device);
}

void Program::ForgetBuffer(const BufferRef& buffer) {
  for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
    if (*it == buffer) {
      buffers_.erase(it);
      return;
    }
  }
}

// Frees a live buffer of any kind, after the work using it has finished.
void Program::FreeBuffer(const BufferRef& buffer) {
  if (buffer->pending) SyncStream(buffer->pending);
  switch (buffer->kind) {
    case BufferKind::kDevice:
      Expect("ph_free", ph_free(buffer->ptr), {PH_SUCCESS});
      g_used[buffer->device] -= Rounded(buffer->size);
      freed_device_.push_back(buffer->ptr);
      if (freed_device_.size() > 16) freed_device_.erase(freed_device_.begin());
      CheckMemory(buffer->device);
      break;
    case BufferKind::kPinned:
      Expect("ph_host_free", ph_host_free(buffer->ptr), {PH_SUCCESS});
      freed_pinned_.push_back(buffer->ptr);
      if (freed_pinned_.size() > 16) freed_pinned_.erase(freed_pinned_.begin());
      break;
    case BufferKind::kPageable:
      buffer->heap.reset();
      break;
  }
  ForgetBuffer(buffer);
}


void Program::Free(Input& in) {
  const uint8_t mode = in.U8() % 6;
  // Frees that do not name a live allocation of ours run only while no
  // other thread could own the address.
  if (mode >= 2 && concurrent_) return;
  switch (mode) {
    case 0: case 1: {
      BufferRef buffer = PickBuffer(in, BufferKind::kDevice);
      if (buffer) FreeBuffer(buffer);
      return;
    }
    case 2:
      Expect("ph_free(NULL)", ph_free(nullptr), {PH_SUCCESS});
      return;
    case 3: {  // freed before
      if (freed_device_.empty()) return;
      uint8_t* stale = freed_device_[in.Below(freed_device_.size())];
      if (InLive(buffers_, stale)) return;
      Expect("ph_free of a freed pointer", ph_free(stale),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    case 4: {  // inside a live allocation
      BufferRef buffer = PickBuffer(in, BufferKind::kDevice);
      if (!buffer || buffer->size < 2) return;
      uint8_t* inside = buffer->ptr + 1 + in.Below(buffer->size - 1);
      Expect("ph_free of an interior pointer", ph_free(inside),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    default: {  // made up, or host memory
      void* address = reinterpret_cast<void*>(in.U64());
      if (in.U8() & 1) {
        BufferRef host = PickAnyBuffer(in);
        if (!host || host->kind == BufferKind::kDevice) return;
        address = host->ptr;
      } else if (address == nullptr || InLive(buffers_, address)) {
        return;
      }
      Expect("ph_free of a made-up or host pointer", ph_free(address),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
  }
}

void Program::HostMalloc(Input& in) {
  const uint8_t mode = in.U8();
  size_t size = 0;
  switch (mode % 6) {
    case 0: size = 0; break;
    case 1: size = SIZE_MAX - mode; break;
    default: size = 1 + in.U16() % (2 * kWindow); break;
  }
  size_t host_count = 0;
  for (const auto& buffer : buffers_) {
    host_count += buffer->kind != BufferKind::kDevice;
  }
  if (host_count >= kMaxHostBuffers && size != 0) size = SIZE_MAX;
  void* ptr = reinterpret_cast<void*>(0x1);
  const ph_status_t status = ph_host_malloc(size, &ptr);
  if (size == 0) {
    Expect("ph_host_malloc(0)", status, {PH_SUCCESS});
  } else if (size > SIZE_MAX / 2) {
    Expect("ph_host_malloc of an impossible size", status,
           {PH_ERROR_OUT_OF_MEMORY});
  } else {
    Expect("ph_host_malloc", status, {PH_SUCCESS, PH_ERROR_OUT_OF_MEMORY});
  }
  if (status != PH_SUCCESS || size == 0) {
    if (ptr != nullptr) Violation("ph_host_malloc left *out_ptr non-NULL");
    return;
  }
  if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 4096 != 0) {
    Violation("ph_host_malloc(%zu) gave %p: NULL or not page-aligned", size,
              ptr);
  }
  auto buffer = std::make_shared<Buffer>();
  buffer->kind = BufferKind::kPinned;
  buffer->ptr = static_cast<uint8_t*>(ptr);
  buffer->size = size;
  buffer->window = size < kWindow ? size : kWindow;
  // Pinned memory is ours to write: give it known contents.
  std::memset(ptr, mode, size);
  buffer->shadow.assign(buffer->window, mode);
  buffer->known.assign(buffer->window, 1);
  buffers_.push_back(buffer);
  for (auto it = freed_pinned_.begin(); it != freed_pinned_.end();) {
    it = *it == ptr ? freed_pinned_.erase(it) : it + 1;
  }
}

void Program::HostFree(Input& in) {
  const uint8_t mode = in.U8() % 5;
  if (mode >= 2 && concurrent_) return;
  switch (mode) {
    case 0: case 1: {
      BufferRef buffer = PickBuffer(in, BufferKind::kPinned);
      if (buffer) FreeBuffer(buffer);
      return;
    }
    case 2:
      Expect("ph_host_free(NULL)", ph_host_free(nullptr), {PH_SUCCESS});
      return;
    case 3: {
      if (freed_pinned_.empty()) return;
      uint8_t* stale = freed_pinned_[in.Below(freed_pinned_.size())];
      if (InLive(buffers_, stale)) return;
      Expect("ph_host_free of a freed block", ph_host_free(stale),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    default: {  // device, pageable or interior pointer
      BufferRef buffer = PickAnyBuffer(in);
      if (!buffer) return;
      uint8_t* address = buffer->ptr;
      if (buffer->kind == BufferKind::kPinned) {
        if (buffer->size < 2) return;
        address += 1 + in.Below(buffer->size - 1);
      }
      Expect("ph_host_free of memory that is no pinned block",
             ph_host_free(address), {PH_ERROR_INVALID_HANDLE});
      return;
    }
  }
}

void Program::PageableAlloc(Input& in) {
  const uint8_t mode = in.U8();
  if (mode & 1) {
    BufferRef buffer = PickBuffer(in, BufferKind::kPageable);
    if (buffer) FreeBuffer(buffer);
    return;
  }
  size_t host_count = 0;
  for (const auto& buffer : buffers_) {
    host_count += buffer->kind != BufferKind::kDevice;
  }
  if (host_count >= kMaxHostBuffers) return;
  const size_t size = 1 + in.U16() % (2 * kWindow);
  auto buffer = std::make_shared<Buffer>();
  buffer->kind = BufferKind::kPageable;
  buffer->heap.reset(new uint8_t[size]);
  buffer->ptr = buffer->heap.get();
  buffer->size = size;
  buffer->window = size < kWindow ? size : kWindow;
  std::memset(buffer->ptr, mode, size);
  buffer->shadow.assign(buffer->window, mode);
  buffer->known.assign(buffer->window, 1);
  buffers_.push_back(buffer);
}

void Program::HostWrite(Input& in) {
  BufferRef buffer = PickAnyBuffer(in);
  if (!buffer || buffer->kind == BufferKind::kDevice) return;
  Settle(*buffer, nullptr);
  const size_t offset = in.Below(buffer->window);
  const size_t length = in.Below(buffer->window - offset + 1);
  const uint8_t seed = in.U8();
  for (size_t i = 0; i < length; ++i) {
    const uint8_t value = static_cast<uint8_t>(seed + i * 7);
    buffer->ptr[offset + i] = value;
    buffer->shadow[offset + i] = value;
    buffer->known[offset + i] = 1;
  }
}

void Program::CheckBufferData(Buffer& buffer) {
  Settle(buffer, nullptr);
  std::vector<uint8_t> actual(buffer.window);
  if (buffer.kind == BufferKind::kDevice) {
    if (buffer.window == 0) return;
    Expect("ph_memcpy device to host (read-back)",
           ph_memcpy(actual.data(), buffer.ptr, buffer.window,
                     PH_MEMCPY_DEVICE_TO_HOST),
           {PH_SUCCESS});
  } else {
    std::memcpy(actual.data(), buffer.ptr, buffer.window);
  }
  for (size_t i = 0; i < buffer.window; ++i) {
    if (buffer.known[i] && actual[i] != buffer.shadow[i]) {
      Violation("byte %zu of %s buffer %p (%zu bytes) reads 0x%02x, but "
                "0x%02x was written",
                i,
                buffer.kind == BufferKind::kDevice   ? "device"
                : buffer.kind == BufferKind::kPinned ? "pinned"
                                                     : "pageable",
                static_cast<void*>(buffer.ptr), buffer.size, actual[i],
                buffer.shadow[i]);
    }
  }
}

void Program::CheckBuffer(Input& in) {
  BufferRef buffer = PickAnyBuffer(in);
  if (buffer) CheckBufferData(*buffer);
}

static bool IsDeviceKind(BufferKind kind) { return kind == BufferKind::kDevice; }

// Copies (and fills) only ever touch the window of a buffer, except for the
// deliberately out-of-range requests against device and pinned buffers,
// which the driver must refuse before touching anything.
void Program::Copy(Input& in, bool async) {
  BufferRef dst = PickAnyBuffer(in);
  BufferRef src = PickAnyBuffer(in);
  StreamRef stream;
  ph_stream_t handle = nullptr;
  if (async) {
    handle = PickStreamHandle(in, &stream);
  }
  const uint8_t mode = in.U8();
  if (!dst || !src) return;
  const bool dst_device = IsDeviceKind(dst->kind);
  const bool src_device = IsDeviceKind(src->kind);
  ph_memcpy_kind_t kind = src_device ? (dst_device ? PH_MEMCPY_DEVICE_TO_DEVICE
                                  : PH_MEMCPY_DEVICE_TO_HOST)
                    : (dst_device ? PH_MEMCPY_HOST_TO_DEVICE
                                  : PH_MEMCPY_HOST_TO_HOST);
  size_t dst_offset = in.Below(dst->window + 1);
  size_t src_offset = in.Below(src->window + 1);
  const size_t room = std::min(dst->window - dst_offset, src->window - src_offset);
  size_t length = in.Below(room + 1);
  bool refused = false;  // the driver must answer INVALID_ARGUMENT
  uint8_t* dst_ptr = dst->ptr + dst_offset;
  const uint8_t* src_ptr = src->ptr + src_offset;
  switch (mode % 12) {
    case 0:  // wrong kind
      if (length == 0) break;
      kind = static_cast<ph_memcpy_kind_t>((kind + 1 + mode / 16 % 3) % 4);
      refused = true;
      break;
    case 1:  // no such kind
      // (Values outside 0..PH_MEMCPY_KIND_MAX_ENUM are not values of the
      // enum at all; a C caller passing one would be undefined behaviour.)
      kind = mode & 0x20 ? PH_MEMCPY_KIND_MAX_ENUM
                         : static_cast<ph_memcpy_kind_t>(4 + mode / 64);
      refused = length > 0;
      break;
    case 2: {  // past the end of a device or pinned destination
      if (dst->kind == BufferKind::kPageable) break;
      dst_offset = dst->size - 1 - in.Below(dst->size < 64 ? dst->size : 64);
      dst_ptr = dst->ptr + dst_offset;
      length = dst->size - dst_offset + 1 + in.Below(64);
      if (length > src->window - src_offset) {
        // The source would be read past its window: use a device or pinned
        // source only (the driver checks those first or refuses anyway).
        if (src->kind == BufferKind::kPageable) return;
      }
      refused = true;
      break;
    }
    case 3:  // null pointer
      if (length == 0) break;
      if (mode & 0x10) dst_ptr = nullptr; else src_ptr = nullptr;
      refused = true;
      break;
    case 4: {  // a freed device pointer
      if (concurrent_ || freed_device_.empty() || length == 0) break;
      uint8_t* stale = freed_device_[in.Below(freed_device_.size())];
      if (InLive(buffers_, stale)) break;
      if (dst_device) dst_ptr = stale; else if (src_device) src_ptr = stale;
      else break;
      refused = true;
      break;
    }
    default:
      break;
  }
  // Overlapping copies within one buffer are not promised by hal.h.
  if (!refused && dst == src && length > 0 &&
      dst_offset < src_offset + length && src_offset < dst_offset + length) {
    return;
  }
  if (async && stream && !refused) {
    // Ordering for the valid copy; refused ones touch nothing.
    Settle(*src, stream);
    Settle(*dst, stream);
  } else if (!async && !refused) {
    Settle(*src, nullptr);
    Settle(*dst, nullptr);
  }
  const bool pageable = src->kind == BufferKind::kPageable ||
                        dst->kind == BufferKind::kPageable;
  ph_status_t status;
  if (!async) {
    status = ph_memcpy(dst_ptr, src_ptr, length, kind);
    Expect("ph_memcpy", status,
           {refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS});
  } else {
    status = ph_memcpy_async(dst_ptr, src_ptr, length, kind, handle);
    if (!stream) {
      Expect("ph_memcpy_async on a bad stream handle", status,
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    if (stream->doom != PH_SUCCESS) {
      // Refused because the stream already failed, or for the argument.
      Expect("ph_memcpy_async on a failing stream", status,
             {stream->doom, refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS});
    } else {
      Expect("ph_memcpy_async", status,
             {refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS});
    }
  }
  if (status != PH_SUCCESS || refused || length == 0) return;
  // A queued copy behind a failing task may be skipped, unless it was a
  // pageable copy, which returns only after it ran.
  const bool maybe_skipped =
      async && stream->doom != PH_SUCCESS && !pageable;
  for (size_t i = 0; i < length; ++i) {
    dst->shadow[dst_offset + i] = src->shadow[src_offset + i];
    dst->known[dst_offset + i] =
        maybe_skipped ? 0 : src->known[src_offset + i];
  }
}

void Program::Memset(Input& in) {
  BufferRef dst = PickAnyBuffer(in);
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const uint8_t mode = in.U8();
  const int value = static_cast<int>(in.U32());
  if (!dst) return;
  size_t offset = in.Below(dst->window + 1);
  size_t length = in.Below(dst->window - offset + 1);
  uint8_t* ptr = dst->ptr + offset;
  bool refused = dst->kind != BufferKind::kDevice && length > 0;
  if (mode % 4 == 0 && dst->kind == BufferKind::kDevice) {  // past the end
    offset = dst->size - 1 - in.Below(dst->size < 64 ? dst->size : 64);
    ptr = dst->ptr + offset;
    length = dst->size - offset + 1 + in.Below(64);
    refused = true;
  } else if (mode % 4 == 1 && length > 0) {
    ptr = nullptr;
    refused = true;
  }
  if (stream && !refused) Settle(*dst, stream);
  const ph_status_t status = ph_memset_async(ptr, value, length, handle);
  const ph_status_t expected =
      refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS;
  if (!stream) {
    Expect("ph_memset_async on a bad stream handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_memset_async", status, {expected, stream->doom});
  if (status != PH_SUCCESS || refused) return;
  for (size_t i = 0; i < length; ++i) {
    dst->shadow[offset + i] = static_cast<uint8_t>(value & 0xff);
    dst->known[offset + i] = stream->doom == PH_SUCCESS;
  }
}

}  // namespace hal_fuzz
