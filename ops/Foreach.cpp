// Native kernels for the foreach ops that PyTorch's optimizers use on
// phantom (the foreach form, as on CUDA): SGD's update, momentum and
// weight decay (_foreach_add_, _foreach_mul_, _foreach_add), Adam's
// moments, denominator and update (_foreach_lerp_, _foreach_addcmul_,
// _foreach_sqrt, _foreach_div_, _foreach_add_ of a scalar,
// _foreach_addcdiv_); and those of torch.nn.utils.clip_grad_norm_
// (_foreach_norm, then _foreach_mul_ by a 0-d tensor on the device).
//
// ATen's kernel for devices without a fused one loops over the tensors and
// calls the per-tensor op on each (self[i].add_(other[i], alpha), ...): on
// phantom, one queued op per parameter, each paying the host's per-op cost
// (~2 µs here), seven times per parameter for Adam. A GPU runs the whole
// list as one kernel launch, and so does this: the host checks every
// tensor, then queues one closure that runs the CPU's own foreach kernel
// (the same loop) over CPU aliases of the whole lists, so the bits are the
// CPU's. (They are not always those of the per-tensor op: for bfloat16 the
// CPU's foreach multiplies by the scalar rounded to the tensors' dtype.)
//
// Only what the CPU kernel can neither fail on nor resize is queued
// (queueable below): plain phantom tensors on one device, lists of one
// length, the tensors at one position of one floating dtype and sizes, the
// written tensor dense and overlapping another only as the very same view,
// and real, non-boolean scalars (one per tensor for a scalar list). What
// the CPU's loop refuses beyond that (the dtypes its per-tensor kernels are
// compiled for: no float8 add; a scalar that overflows the dtype) is asked
// of it once per call signature, the lists' dtypes and the scalars' kinds
// (CpuAdmission.h). Any other call (a broadcast, a CPU tensor, integers,
// lists of different lengths, a complex scalar, dtypes the CPU refuses)
// goes to ATen's loop, which gives the CPU's behaviour and errors at the
// call.
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/CpuAdmission.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/KernelAliases.h>
#include <phantom/ops/OpsReport.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add_native.h>
#include <ATen/ops/_foreach_addcdiv_native.h>
#include <ATen/ops/_foreach_addcmul_native.h>
#include <ATen/ops/_foreach_div_native.h>
#include <ATen/ops/_foreach_lerp_native.h>
#include <ATen/ops/_foreach_mul_native.h>
#include <ATen/ops/_foreach_norm_native.h>
#include <ATen/ops/_foreach_sqrt_native.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sqrt.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

namespace phantom {
namespace {

// self[i] may be written by a kernel that reads other[i]: dense, and
// sharing memory with other[i] only as the very same view.
bool updatable(const at::Tensor& self, const at::Tensor& other) {
  if (!self.is_contiguous()) {
    return false;
  }
  if (!self.storage().is_alias_of(other.storage())) {
    return true;
  }
  return self.storage_offset() == other.storage_offset() &&
         self.strides() == other.strides();
}

// Whether the CPU's foreach kernel can run over aliases of these lists
// without failing or resizing: `self` is written, `inputs` are read.
bool queueable(at::TensorList self,
               std::initializer_list<at::TensorList> inputs) {
  if (self.empty()) {
    return false;
  }
  const c10::Device device = self[0].device();
  for (const at::TensorList input : inputs) {
    if (input.size() != self.size()) {
      return false;
    }
  }
  for (size_t i = 0; i < self.size(); ++i) {
    const at::Tensor& s = self[i];
    if (!isPlainPhantom(s) || s.device() != device ||
        !c10::isFloatingType(s.scalar_type()) || !s.is_contiguous()) {
      return false;
    }
    for (const at::TensorList input : inputs) {
      const at::Tensor& o = input[i];
      if (!isPlainPhantom(o) || o.device() != device ||
          o.scalar_type() != s.scalar_type() || o.sizes() != s.sizes() ||
          !updatable(s, o)) {
        return false;
      }
    }
  }
  return true;
}

// The per-tensor ops refuse a complex or a boolean scalar for floating
// tensors (or treat it differently): such a call takes ATen's loop.
bool realScalar(const at::Scalar& scalar) {
  return !scalar.isComplex() && !scalar.isBoolean();
}

bool realScalars(at::ArrayRef<at::Scalar> scalars, size_t count) {
  if (scalars.size() != count) {
    return false;
  }
  for (const at::Scalar& scalar : scalars) {
    if (!realScalar(scalar)) {
      return false;
    }
  }
  return true;
}

using Lists = std::vector<std::vector<at::Tensor>>;

// Queues kernel(lists) on the current stream of lists[0][0]'s device, where
// `lists` are CPU aliases of `lists` as given (the written list first),
// if the CPU's kernel accepts the lists' dtypes and `scalars` (the probe
// runs `kernel` over lists of probe tensors); returns false, queueing
// nothing, if it does not.
template <typename Kernel>
bool queueForeach(NativeOpCounter& counter, CpuAdmission& admission,
                  std::initializer_list<at::TensorList> lists,
                  at::ArrayRef<at::Scalar> scalars, Kernel kernel) {
  CallSignature signature;
  for (const at::TensorList list : lists) {
    signature.dtypesOf(list);
    if (!scalarsFit(scalars, list)) {
      return false;
    }
  }
  for (const at::Scalar& scalar : scalars) {
    signature.scalarKind(scalar);
  }
  const bool admitted = admission.admits(signature, [&] {
    Lists host;
    for (const at::TensorList list : lists) {
      std::vector<at::Tensor>& probes = host.emplace_back();
      for (const at::Tensor& t : list) {
        probes.push_back(probeTensor(t));
      }
    }
    kernel(host);
  });
  if (!admitted) {
    return false;
  }
  counter.count();
  const c10::Device device = lists.begin()->front().device();
  const c10::DeviceGuard guard(device);
  std::vector<std::vector<DeviceTensorRef>> refs;
  refs.reserve(lists.size());
  for (const at::TensorList list : lists) {
    std::vector<DeviceTensorRef>& list_refs = refs.emplace_back();
    list_refs.reserve(list.size());
    for (const at::Tensor& t : list) {
      list_refs.emplace_back(t);
    }
  }
  launchAsync(getCurrentPhantomStream(device.index()), counter.op(),
              [refs = std::move(refs), kernel = std::move(kernel)] {
                PooledAliases aliases;
                Lists cpu(refs.size());  // dropped before `aliases`
                for (size_t k = 0; k < refs.size(); ++k) {
                  cpu[k].reserve(refs[k].size());
                  for (const DeviceTensorRef& ref : refs[k]) {
                    cpu[k].push_back(aliases.alias(ref));
                  }
                }
                kernel(cpu);
              });
  return true;
}

NativeOpCounter foreach_add_counter("aten::_foreach_add_");
NativeOpCounter foreach_add_out_of_place_counter("aten::_foreach_add");

void foreachAddList(at::TensorList self, at::TensorList other,
                    const at::Scalar& alpha) {
  static CpuAdmission admission;
  if (!realScalar(alpha) || !queueable(self, {other}) ||
      !queueForeach(foreach_add_counter, admission, {self, other}, alpha,
                    [alpha](Lists& t) {
                      at::native::foreach_tensor_add_list_kernel_slow_(
                          t[0], t[1], alpha);
                    })) {
    at::native::foreach_tensor_add_list_kernel_slow_(self, other, alpha);
  }
}

// The results of an out-of-place op, allocated on the host like `self`.
std::vector<at::Tensor> resultsLike(at::TensorList self) {
  std::vector<at::Tensor> results;
  results.reserve(self.size());
  for (const at::Tensor& t : self) {
    results.push_back(at::empty_like(t));
  }
  return results;
}

// Out of place (SGD's and Adam's weight decay: grads + wd * params): the
// results are allocated here, and the worker writes each with the CPU's
// add kernel (the CPU's foreach add is self[i].add(other[i], alpha) per
// tensor: the same kernel, into a tensor of its own).
std::vector<at::Tensor> foreachAddListOutOfPlace(at::TensorList self,
                                                 at::TensorList other,
                                                 const at::Scalar& alpha) {
  static CpuAdmission admission;
  if (realScalar(alpha) && queueable(self, {other})) {
    std::vector<at::Tensor> results = resultsLike(self);
    if (queueForeach(foreach_add_out_of_place_counter, admission,
                     {results, self, other}, alpha, [alpha](Lists& t) {
                       for (size_t i = 0; i < t[0].size(); ++i) {
                         at::add_out(t[0][i], t[1][i], t[2][i], alpha);
                       }
                     })) {
      return results;
    }
  }
  return at::native::foreach_tensor_add_list_kernel_slow(self, other, alpha);
}

void foreachAddScalar(at::TensorList self, const at::Scalar& scalar) {
  static CpuAdmission admission;
  if (!realScalar(scalar) || !queueable(self, {}) ||
      !queueForeach(foreach_add_counter, admission, {self}, scalar,
                    [scalar](Lists& t) {
                      at::native::foreach_tensor_add_scalar_kernel_slow_(
                          t[0], scalar);
                    })) {
    at::native::foreach_tensor_add_scalar_kernel_slow_(self, scalar);
  }
}

NativeOpCounter foreach_mul_counter("aten::_foreach_mul_");

void foreachMulScalar(at::TensorList self, const at::Scalar& scalar) {
  static CpuAdmission admission;
  if (!realScalar(scalar) || !queueable(self, {}) ||
      !queueForeach(foreach_mul_counter, admission, {self}, scalar,
                    [scalar](Lists& t) {
                      at::native::foreach_tensor_mul_scalar_kernel_slow_(
                          t[0], scalar);
                    })) {
    at::native::foreach_tensor_mul_scalar_kernel_slow_(self, scalar);
  }
}

// `other` is a 0-d tensor on the device (clip_grad_norm_'s coefficient).
void foreachMulTensor(at::TensorList self, const at::Tensor& other) {
  static CpuAdmission admission;
  const bool native_other =
      isPlainPhantom(other) && other.dim() == 0 && !self.empty() &&
      other.device() == self[0].device() &&
      c10::isFloatingType(other.scalar_type());
  if (!native_other || !queueable(self, {}) ||
      !queueForeach(foreach_mul_counter, admission,
                    {self, at::TensorList(other)}, {}, [](Lists& t) {
                      at::native::foreach_tensor_mul_tensor_kernel_slow_(
                          t[0], t[1][0]);
                    })) {
    at::native::foreach_tensor_mul_tensor_kernel_slow_(self, other);
  }
}

NativeOpCounter foreach_div_counter("aten::_foreach_div_");

void foreachDivScalarList(at::TensorList self,
                          at::ArrayRef<at::Scalar> scalars) {
  static CpuAdmission admission;
  if (!realScalars(scalars, self.size()) || !queueable(self, {}) ||
      !queueForeach(foreach_div_counter, admission, {self}, scalars,
                    [scalars = scalars.vec()](Lists& t) {
                      at::native::foreach_tensor_div_scalarlist_kernel_slow_(
                          t[0], scalars);
                    })) {
    at::native::foreach_tensor_div_scalarlist_kernel_slow_(self, scalars);
  }
}

NativeOpCounter foreach_lerp_counter("aten::_foreach_lerp_");

void foreachLerpScalar(at::TensorList self, at::TensorList end,
                       const at::Scalar& weight) {
  static CpuAdmission admission;
  if (!realScalar(weight) || !queueable(self, {end}) ||
      !queueForeach(foreach_lerp_counter, admission, {self, end}, weight,
                    [weight](Lists& t) {
                      at::native::foreach_tensor_lerp_list_kernel_slow_(
                          t[0], t[1], weight);
                    })) {
    at::native::foreach_tensor_lerp_list_kernel_slow_(self, end, weight);
  }
}

NativeOpCounter foreach_addcmul_counter("aten::_foreach_addcmul_");

void foreachAddcmulScalar(at::TensorList self, at::TensorList tensor1,
                          at::TensorList tensor2, const at::Scalar& value) {
  static CpuAdmission admission;
  if (!realScalar(value) || !queueable(self, {tensor1, tensor2}) ||
      !queueForeach(foreach_addcmul_counter, admission,
                    {self, tensor1, tensor2}, value, [value](Lists& t) {
                      at::native::foreach_tensor_addcmul_scalar_slow_(
                          t[0], t[1], t[2], value);
                    })) {
    at::native::foreach_tensor_addcmul_scalar_slow_(self, tensor1, tensor2,
                                                    value);
  }
}

NativeOpCounter foreach_addcdiv_counter("aten::_foreach_addcdiv_");

void foreachAddcdivScalar(at::TensorList self, at::TensorList tensor1,
                          at::TensorList tensor2, const at::Scalar& value) {
  static CpuAdmission admission;
  if (!realScalar(value) || !queueable(self, {tensor1, tensor2}) ||
      !queueForeach(foreach_addcdiv_counter, admission,
                    {self, tensor1, tensor2}, value, [value](Lists& t) {
                      at::native::foreach_tensor_addcdiv_scalar_slow_(
                          t[0], t[1], t[2], value);
                    })) {
    at::native::foreach_tensor_addcdiv_scalar_slow_(self, tensor1, tensor2,
                                                    value);
  }
}

void foreachAddcdivScalarList(at::TensorList self, at::TensorList tensor1,
                              at::TensorList tensor2,
                              at::ArrayRef<at::Scalar> scalars) {
  static CpuAdmission admission;
  if (!realScalars(scalars, self.size()) ||
      !queueable(self, {tensor1, tensor2}) ||
      !queueForeach(foreach_addcdiv_counter, admission,
                    {self, tensor1, tensor2}, scalars,
                    [scalars = scalars.vec()](Lists& t) {
                      at::native::foreach_tensor_addcdiv_scalarlist_slow_(
                          t[0], t[1], t[2], scalars);
                    })) {
    at::native::foreach_tensor_addcdiv_scalarlist_slow_(self, tensor1,
                                                        tensor2, scalars);
  }
}

NativeOpCounter foreach_sqrt_counter("aten::_foreach_sqrt");

// Out of place: the results are allocated here, on the host, and the
// worker writes each with the CPU's sqrt kernel (the CPU's foreach_sqrt
// is t.sqrt() per tensor: the same kernel, into a tensor of its own).
std::vector<at::Tensor> foreachSqrt(at::TensorList self) {
  static CpuAdmission admission;
  if (queueable(self, {})) {
    std::vector<at::Tensor> results = resultsLike(self);
    if (queueForeach(foreach_sqrt_counter, admission, {results, self}, {},
                     [](Lists& t) {
                       for (size_t i = 0; i < t[0].size(); ++i) {
                         at::sqrt_out(t[0][i], t[1][i]);
                       }
                     })) {
      return results;
    }
  }
  return at::native::foreach_tensor_sqrt_slow(self);
}

NativeOpCounter foreach_norm_counter("aten::_foreach_norm");

// Out of place, one 0-d result per tensor, allocated here; the worker runs
// the CPU's foreach norm over aliases and copies each result in. Only
// without a dtype, and with no empty tensor (whose norm of some orders the
// CPU refuses at the call).
std::vector<at::Tensor> foreachNorm(at::TensorList self, const at::Scalar& ord,
                                    std::optional<at::ScalarType> dtype) {
  static CpuAdmission admission;
  bool native = !dtype.has_value() && realScalar(ord) && queueable(self, {});
  for (size_t i = 0; native && i < self.size(); ++i) {
    native = self[i].numel() > 0;
  }
  if (native) {
    std::vector<at::Tensor> results;
    results.reserve(self.size());
    for (const at::Tensor& t : self) {
      results.push_back(at::empty({}, t.options()));
    }
    if (queueForeach(foreach_norm_counter, admission, {results, self}, ord,
                     [ord](Lists& t) {
                       const std::vector<at::Tensor> norms =
                           at::native::foreach_tensor_norm_slow(t[1], ord,
                                                                std::nullopt);
                       for (size_t i = 0; i < norms.size(); ++i) {
                         t[0][i].copy_(norms[i]);
                       }
                     })) {
      return results;
    }
  }
  return at::native::foreach_tensor_norm_slow(self, ord, dtype);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_foreach_add_.List", TORCH_FN(foreachAddList));
  m.impl("_foreach_add_.Scalar", TORCH_FN(foreachAddScalar));
  m.impl("_foreach_add.List", TORCH_FN(foreachAddListOutOfPlace));
  m.impl("_foreach_mul_.Scalar", TORCH_FN(foreachMulScalar));
  m.impl("_foreach_mul_.Tensor", TORCH_FN(foreachMulTensor));
  m.impl("_foreach_norm.Scalar", TORCH_FN(foreachNorm));
  m.impl("_foreach_div_.ScalarList", TORCH_FN(foreachDivScalarList));
  m.impl("_foreach_lerp_.Scalar", TORCH_FN(foreachLerpScalar));
  m.impl("_foreach_addcmul_.Scalar", TORCH_FN(foreachAddcmulScalar));
  m.impl("_foreach_addcdiv_.Scalar", TORCH_FN(foreachAddcdivScalar));
  m.impl("_foreach_addcdiv_.ScalarList", TORCH_FN(foreachAddcdivScalarList));
  m.impl("_foreach_sqrt", TORCH_FN(foreachSqrt));
}

}  // namespace
}  // namespace phantom
