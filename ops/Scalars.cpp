// Filling tensors and reading single values back: fill_, zero_ and
// _local_scalar_dense (behind .item()). fill_ is queued on the current
// stream and returns at once; reading a value is a sync point, as on any
// accelerator. A fill the CPU refuses (a value that overflows the dtype:
// 300 into uint8; a dtype its fill is not compiled for) is refused at the
// call: such calls take the generic path, which raises the CPU's error
// (CpuAdmission.h). Without a kernel view (CopyingFallback.cpp) a fill of
// a dense tensor whose value is one repeated byte (zero in every dtype, any
// value of a one-byte dtype) is the driver's memset on the current stream;
// other fills take the copying CPU fallback.
#include <phantom/Exception.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/SyncDebug.h>
#include <phantom/BoundsCheck.h>
#include <phantom/CpuAdmission.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/KernelAliases.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace phantom {
namespace {

CpuAdmission fill_admission;

// Without a kernel view: fills `self` with the driver's memset when its
// memory is one dense run and `value` is one byte repeated in its dtype.
// The value is converted on the CPU first, which raises the CPU's error
// for a value the dtype cannot hold.
bool fillByMemset(at::Tensor& self, const at::Scalar& value) {
  if (self.layout() != c10::kStrided || !self.is_non_overlapping_and_dense() ||
      self.is_conj() || self.is_neg() || !self.has_storage()) {
    return false;
  }
  at::Tensor one = at::empty({}, self.options().device(c10::kCPU));
  one.fill_(value);
  const auto* bytes = static_cast<const uint8_t*>(one.const_data_ptr());
  for (int64_t i = 1; i < one.element_size(); ++i) {
    if (bytes[i] != bytes[0]) {
      return false;
    }
  }
  const size_t nbytes = static_cast<size_t>(self.numel()) * self.element_size();
  if (nbytes == 0) {
    return true;
  }
  checkInsideStorage(self, "fill_");
  const c10::DeviceGuard guard(self.device());
  const PhantomStream stream = getCurrentPhantomStream(self.device().index());
  const ph_stream_t handle = stream.handle();  // sticky errors: Stream.h
  stream.check(ph_memset_async(self.mutable_data_ptr(), bytes[0], nbytes, handle),
               handle);
  return true;
}

at::Tensor& fillScalar(at::Tensor& self, const at::Scalar& value) {
  if (!kernelViewAvailable()) {
    if (!fillByMemset(self, value)) {
      torch::jit::Stack stack = boxArguments(self, value);
      runGenericBoxed("aten::fill_", "Scalar", &stack);
    }
    return self;
  }
  const bool admitted =
      scalarsFit(value, {self.scalar_type()}) &&
      fill_admission.admits(CallSignature().tensor(self).scalarKind(value),
                            [&] { probeTensor(self).fill_(value); });
  if (!admitted) {
    torch::jit::Stack stack = boxArguments(self, value);
    runGenericBoxed("aten::fill_", "Scalar", &stack);
    return self;
  }
  const c10::DeviceGuard guard(self.device());
  launchAsync(getCurrentPhantomStream(self.device().index()), "aten::fill_",
              [target = DeviceTensorRef(self), value] {
                KernelAliases aliases;
                aliases.alias(target).fill_(value);
              });
  return self;
}

at::Tensor& fillTensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0,
              "fill_ only supports a 0-dimension value tensor, but got one "
              "with ", value.dim(), " dimensions");
  return fillScalar(self, value.item());
}

at::Tensor& zero(at::Tensor& self) {
  return fillScalar(self, 0);
}

at::Scalar localScalarDense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  noteHostWait("aten::_local_scalar_dense",
               ".item(), or a tensor read as a Python number or bool");
  checkInsideStorage(self, "item()");
  const c10::DeviceGuard guard(self.device());
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  // A copy into pageable memory returns when the value has arrived, after
  // the stream's earlier work.
  const PhantomStream stream = getCurrentPhantomStream(self.device().index());
  const ph_stream_t handle = stream.handle();  // sticky errors: Stream.h
  stream.check(ph_memcpy_async(host.mutable_data_ptr(), self.const_data_ptr(),
                               self.element_size(), PH_MEMCPY_DEVICE_TO_HOST,
                               handle),
               handle);
  return at::_local_scalar_dense(host);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("fill_.Scalar", TORCH_FN(fillScalar));
  m.impl("fill_.Tensor", TORCH_FN(fillTensor));
  m.impl("zero_", TORCH_FN(zero));
  m.impl("_local_scalar_dense", TORCH_FN(localScalarDense));
}

}  // namespace phantom
