// Bare device pointers for other libraries (torch.phantom
// .caching_allocator_alloc and caching_allocator_delete): memory from the
// caching allocator, like a tensor's, whose DataPtr is kept here, by
// address, until the library gives the pointer back.
#include <phantom/DeviceAllocator.h>

#include <c10/util/Exception.h>

namespace phantom {

void* PhantomDeviceAllocator::rawAlloc(size_t nbytes, c10::DeviceIndex device,
                                       c10::StreamId stream) {
  if (nbytes == 0) {
    return nullptr;  // as CUDA: nothing to free either
  }
  c10::DataPtr memory = allocateOn(nbytes, device, stream);
  void* ptr = memory.get();
  std::lock_guard<std::mutex> lock(raw_mutex_);
  raw_allocations_.emplace(ptr, std::move(memory));
  return ptr;
}

void PhantomDeviceAllocator::rawDelete(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  c10::DataPtr memory;
  {
    std::lock_guard<std::mutex> lock(raw_mutex_);
    const auto it = raw_allocations_.find(ptr);
    TORCH_CHECK(it != raw_allocations_.end(), "caching_allocator_delete: ", ptr,
                " was not allocated by caching_allocator_alloc (or was "
                "already deleted); pass the exact pointer it returned");
    memory = std::move(it->second);
    raw_allocations_.erase(it);
  }
  // `memory` goes back to the cache here, outside the lock.
}

}  // namespace phantom
