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

#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstring>

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

// The direct fill. A dense tensor (contiguous, or any non-overlapping
// dense layout) covers exactly numel consecutive elements of its storage
// from its offset, and a fill writes one value everywhere, so the queued
// kernel needs no CPU alias, no dispatcher call and no TensorIterator (on
// the worker they cost several times a small fill): it writes the
// element's bytes over that range. The bytes are the value converted on
// the host with Scalar::to<T>(), the conversion the CPU's fill kernel
// makes, so the result is bit-identical. Only for the dtypes below, and
// up to the size the CPU's kernel fills on one thread; the rest keeps the
// CPU kernel over aliases.
struct DenseFill {
  void* storage_data;        // device address of the storage
  size_t offset_bytes;       // of the first element
  int64_t numel;
  uint64_t element_bits = 0;  // the element's bytes, little-endian
  int element_size;
  bool all_zero;

  void run() const {
    void* base = nullptr;
    PHANTOM_CHECK(ph_kernel_address(storage_data, &base));
    char* first = static_cast<char*>(base) + offset_bytes;
    if (all_zero || element_size == 1) {
      std::memset(first, static_cast<int>(element_bits & 0xff),
                  static_cast<size_t>(numel) * element_size);
      return;
    }
    switch (element_size) {
      case 2: return fillWith<uint16_t>(first);
      case 4: return fillWith<uint32_t>(first);
      case 8: return fillWith<uint64_t>(first);
    }
  }

  template <typename Bits>
  void fillWith(char* first) const {
    const auto bits = static_cast<Bits>(element_bits);
    Bits* out = reinterpret_cast<Bits*>(first);
    for (int64_t i = 0; i < numel; ++i) {
      out[i] = bits;
    }
  }
};

bool queueDenseFill(const at::Tensor& self, const at::Scalar& value) {
  const int64_t numel = self.numel();
  if (self.layout() != c10::kStrided || self.is_conj() || self.is_neg() ||
      numel == 0 || numel > at::internal::GRAIN_SIZE ||
      !self.is_non_overlapping_and_dense()) {
    return false;
  }
  const c10::ScalarType dtype = self.scalar_type();
  switch (dtype) {
    case c10::kByte: case c10::kChar: case c10::kShort: case c10::kInt:
    case c10::kLong: case c10::kHalf: case c10::kFloat: case c10::kDouble:
    case c10::kBool: case c10::kBFloat16:
      break;
    default:
      return false;  // complex, float8, the unsigned and bit types, ...
  }
  DenseFill fill{};
  AT_DISPATCH_ALL_TYPES_AND3(
      c10::kHalf, c10::kBFloat16, c10::kBool, dtype, "fill_", [&] {
        const scalar_t element = value.to<scalar_t>();
        static_assert(sizeof(scalar_t) <= sizeof(fill.element_bits));
        std::memcpy(&fill.element_bits, &element, sizeof(scalar_t));
      });
  checkInsideStorage(self, "fill_");
  fill.storage_data = self.storage().mutable_data();
  fill.offset_bytes = static_cast<size_t>(self.storage_offset()) *
                      self.element_size();
  fill.numel = numel;
  fill.element_size = static_cast<int>(self.element_size());
  fill.all_zero = fill.element_bits == 0;
  launchAsync(getCurrentPhantomStream(self.device().index()), "aten::fill_",
              [fill] { fill.run(); });
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
  if (queueDenseFill(self, value)) {
    return self;
  }
  launchAsync(getCurrentPhantomStream(self.device().index()), "aten::fill_",
              [target = DeviceTensorRef(self), value] {
                PooledAliases aliases;
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
