// See phantom/Storage.h.
#include <phantom/Exception.h>
#include <phantom/Storage.h>
#include <phantom/Stream.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace phantom {

void resizeStorageBytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(),
              "cannot resize this ", c10::get_privateuse1_backend(),
              " storage: it is not resizable (it was created from memory "
              "PyTorch does not own)");
  c10::Allocator* allocator = storage->allocator();
  TORCH_CHECK(allocator != nullptr,
              "cannot resize a ", c10::get_privateuse1_backend(),
              " storage that has no allocator");
  // Python's storage.resize_(-1) arrives here as a huge size_t.
  TORCH_CHECK(nbytes <= static_cast<size_t>(PTRDIFF_MAX),
              "cannot resize a ", c10::get_privateuse1_backend(),
              " storage to ",
              static_cast<int64_t>(nbytes) < 0
                  ? std::to_string(static_cast<int64_t>(nbytes))
                  : std::to_string(nbytes),
              " bytes: the size must be between 0 and ", PTRDIFF_MAX);
  const c10::Device device = storage->device();
  c10::DeviceGuard guard(device);
  c10::DataPtr fresh = allocator->allocate(nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0 && storage->data() != nullptr) {
    const PhantomStream stream = getCurrentPhantomStream(device.index());
    const ph_stream_t handle = stream.handle();  // sticky errors: Stream.h
    stream.check(ph_memcpy_async(fresh.get(), storage->data(), keep,
                                 PH_MEMCPY_DEVICE_TO_DEVICE, handle),
                 handle);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

}  // namespace phantom
