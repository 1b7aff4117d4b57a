// Native kernels for torch._foreach_add_(self, other, alpha=...), the
// parameter update of SGD, and torch._foreach_mul_(self, scalar), its
// momentum decay (optimizers use the foreach form on phantom, as on CUDA).
//
// ATen's kernel for devices without a fused one loops over the tensors and
// calls self[i].add_(other[i], alpha=alpha) (or self[i].mul_(scalar)) on
// each: on phantom, one queued op per parameter, each paying the host's
// per-op cost (~2 µs here). A GPU runs the whole list as one kernel
// launch, and so does this: the host checks every tensor, then queues one
// closure that runs the CPU's own foreach kernel (the same loop) over CPU
// aliases of the whole list, so the bits are the CPU's. (They are not
// always those of mul_ per tensor: for bfloat16 the CPU's foreach
// multiplies by the scalar rounded to the tensors' dtype.)
//
// Only what the CPU kernel can neither fail on nor resize is queued: plain
// phantom tensors on one device, dense, of one floating dtype per pair,
// pairs of the same sizes, self overlapping `other` only as the same view,
// and a real, non-boolean alpha or scalar. Any other list (a broadcast, a
// CPU tensor, integers, lists of different lengths) goes to ATen's loop,
// which gives the CPU's behaviour and errors.
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/KernelAliases.h>
#include <phantom/ops/OpsReport.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add_native.h>
#include <ATen/ops/_foreach_mul_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

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

NativeOpCounter foreach_add_counter("aten::_foreach_add_");

void foreachAddList(at::TensorList self, at::TensorList other,
                    const at::Scalar& alpha) {
  // add_ refuses a complex or a boolean alpha for floating tensors: such a
  // call takes the per-pair loop, which raises the CPU's error at the call.
  bool native = !self.empty() && self.size() == other.size() &&
                !alpha.isComplex() && !alpha.isBoolean();
  for (size_t i = 0; native && i < self.size(); ++i) {
    const at::Tensor& s = self[i];
    const at::Tensor& o = other[i];
    native = isPlainPhantom(s) && isPlainPhantom(o) &&
             s.device() == self[0].device() && o.device() == s.device() &&
             s.scalar_type() == o.scalar_type() &&
             c10::isFloatingType(s.scalar_type()) && s.sizes() == o.sizes() &&
             updatable(s, o);
  }
  if (!native) {
    at::native::foreach_tensor_add_list_kernel_slow_(self, other, alpha);
    return;
  }
  foreach_add_counter.count();
  const c10::Device device = self[0].device();
  const c10::DeviceGuard guard(device);
  std::vector<std::pair<DeviceTensorRef, DeviceTensorRef>> pairs;
  pairs.reserve(self.size());
  for (size_t i = 0; i < self.size(); ++i) {
    pairs.emplace_back(DeviceTensorRef(self[i]), DeviceTensorRef(other[i]));
  }
  launchAsync(getCurrentPhantomStream(device.index()), foreach_add_counter.op(),
              [pairs = std::move(pairs), alpha] {
                KernelAliases aliases;
                std::vector<at::Tensor> self_aliases, other_aliases;
                self_aliases.reserve(pairs.size());
                other_aliases.reserve(pairs.size());
                for (const auto& [s, o] : pairs) {
                  self_aliases.push_back(aliases.alias(s));
                  other_aliases.push_back(aliases.alias(o));
                }
                at::native::foreach_tensor_add_list_kernel_slow_(self_aliases, other_aliases,
                                                                 alpha);
              });
}

NativeOpCounter foreach_mul_counter("aten::_foreach_mul_");

void foreachMulScalar(at::TensorList self, const at::Scalar& scalar) {
  bool native = !self.empty() && !scalar.isComplex() && !scalar.isBoolean();
  for (size_t i = 0; native && i < self.size(); ++i) {
    const at::Tensor& s = self[i];
    native = isPlainPhantom(s) && s.device() == self[0].device() &&
             c10::isFloatingType(s.scalar_type()) && s.is_contiguous();
  }
  if (!native) {
    at::native::foreach_tensor_mul_scalar_kernel_slow_(self, scalar);
    return;
  }
  foreach_mul_counter.count();
  const c10::Device device = self[0].device();
  const c10::DeviceGuard guard(device);
  std::vector<DeviceTensorRef> tensors;
  tensors.reserve(self.size());
  for (const at::Tensor& s : self) {
    tensors.emplace_back(s);
  }
  launchAsync(getCurrentPhantomStream(device.index()), foreach_mul_counter.op(),
              [tensors = std::move(tensors), scalar] {
                KernelAliases aliases;
                std::vector<at::Tensor> cpu;
                cpu.reserve(tensors.size());
                for (const DeviceTensorRef& t : tensors) {
                  cpu.push_back(aliases.alias(t));
                }
                at::native::foreach_tensor_mul_scalar_kernel_slow_(cpu, scalar);
              });
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_foreach_add_.List", TORCH_FN(foreachAddList));
  m.impl("_foreach_mul_.Scalar", TORCH_FN(foreachMulScalar));
}

}  // namespace
}  // namespace phantom
