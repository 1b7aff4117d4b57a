// Views and storage surgery: ops that change a tensor's metadata or its
// storage but never its data, so they run on the host at once. The view ops
// reuse ATen's device-generic implementations (they only touch metadata);
// resize_ and set_ need phantom's allocator and so are written here.
#include <phantom/Storage.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace phantom {
namespace {

// Makes `self` have `size` (and `stride`, or contiguous strides), growing
// its storage if it is too small. Storage never shrinks, as in CPU/CUDA.
// The storage grows before the sizes change, so a resize that fails (out
// of memory) leaves the tensor as it was, not with sizes its storage cannot
// hold (CPU's resize_ changes the sizes first).
void resizeImpl(c10::TensorImpl* self, c10::IntArrayRef size,
                at::OptionalIntArrayRef stride) {
  if (self->sizes() == size && (!stride || self->strides() == *stride)) {
    return;
  }
  for (const int64_t dim : size) {
    TORCH_CHECK(dim >= 0, "cannot resize a ", c10::get_privateuse1_backend(),
                " tensor to size ", size,
                ": dimension ", dim, " is negative; every size must be >= 0");
  }
  const int64_t itemsize = static_cast<int64_t>(self->dtype().itemsize());
  const int64_t offset = self->storage_offset();
  const size_t needed =
      stride ? at::detail::computeStorageNbytes(size, *stride, itemsize, offset)
             : at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  const c10::Storage& storage = self->unsafe_storage();
  if (needed > storage.nbytes()) {
    resizeStorageBytes(storage.unsafeGetStorageImpl(), needed);
  }
  if (stride) {
    self->set_sizes_and_strides(size, *stride);
  } else {
    self->set_sizes_contiguous(size);
  }
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  resizeImpl(impl, size, std::nullopt);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "unsupported memory format for resize_: ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& setStorage(at::Tensor& self, c10::Storage source,
                       int64_t storage_offset, c10::IntArrayRef size,
                       c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, storage_offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
  const at::OptionalIntArrayRef stride_or_contiguous =
      stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  const c10::DeviceGuard guard(self.device());
  resizeImpl(self.unsafeGetTensorImpl(), size, stride_or_contiguous);
  return self;
}

at::Tensor& setEmpty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       self.storage().allocator(), /*resizable=*/true);
  return setStorage(self, std::move(storage), 0, {0}, {});
}

at::Tensor& setTensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  return setStorage(self, source.storage(), source.storage_offset(),
                    source.sizes(), source.strides());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", TORCH_FN(resize));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(setStorage));
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Tensor", TORCH_FN(setTensor));
  m.impl("set_", TORCH_FN(setEmpty));
}

}  // namespace phantom
