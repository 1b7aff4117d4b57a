// See phantom/HostAllocator.h.
#include <phantom/Exception.h>
#include <phantom/HostAllocator.h>

#include <cstdio>
#include <cstring>

namespace phantom {
namespace {

void deletePinned(void* ptr) {
  if (ph_host_free(ptr) != PH_SUCCESS) {
    std::fprintf(stderr, "phantom: ph_host_free(%p) failed: %s\n", ptr,
                 ph_last_error_message());
  }
}

class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    PHANTOM_CHECK(ph_host_malloc(nbytes, &ptr));
    return {ptr, ptr, &deletePinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &deletePinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

c10::Allocator* pinnedHostAllocator() {
  static auto* allocator = new PinnedHostAllocator();
  return allocator;
}

bool isPinnedPointer(const void* ptr) {
  ph_pointer_attributes_t attributes{};
  return ptr != nullptr &&
         ph_pointer_get_attributes(ptr, &attributes) == PH_SUCCESS &&
         attributes.type == PH_MEMORY_HOST_PINNED;
}

}  // namespace phantom
