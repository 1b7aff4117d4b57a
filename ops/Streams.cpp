// Stream-related ops: Tensor.record_stream tells the caching allocator that
// the tensor's memory is in use on another stream (see
// device/runtime/phantom/DeviceAllocator.h).
#include <phantom/DeviceAllocator.h>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace phantom {
namespace {

void recordStream(at::Tensor& self, c10::Stream stream) {
  deviceAllocator().recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("record_stream", TORCH_FN(recordStream));
}

}  // namespace phantom
