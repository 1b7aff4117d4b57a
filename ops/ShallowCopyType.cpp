// Moving a module to or from phantom keeps its Parameter objects.
//
// nn.Module._apply (behind .to(), .phantom(), .cpu(), .half(), ...) and
// LibTorch's torch::nn::Module::to ask aten::_has_compatible_shallow_copy_type
// whether the moved tensor can be swapped into the existing Parameter with
// `param.data = moved` (a shallow copy of the TensorImpl's metadata: storage,
// sizes, dtype, device and dispatch keys). When the answer is no, Python
// builds a new Parameter and C++ refuses the move. ATen's answer is
// TensorImpl::has_compatible_shallow_copy_type: yes when both tensors have
// the same dispatch keys, or both are dense tensors of CPU, CUDA, MPS, HIP,
// XPU, HPU or MTIA. PrivateUse1 is not in that list, so without this file
// every move between the CPU and phantom made new Parameters: weights tied
// by identity (a language model's lm_head and its embedding) came apart, an
// optimizer built before the move kept updating the CPU tensors, and lazy
// modules lost their UninitializedParameter. The header leaves the answer
// for PrivateUse1 to the backend, through its own kernel for this op.
//
// The kernel gives ATen's answer with PrivateUse1 counted as one more dense
// backend, as CUDA is. It runs only when one of the two tensors is on
// phantom (PrivateUse1 outranks the other dense backends in dispatch), so
// moves that never touch phantom keep ATen's own kernel; pairs this rule
// does not cover (a phantom tensor and a meta, sparse or nested one) keep
// ATen's answer.
//
// The other route, torch.__future__.set_swap_module_params_on_conversion,
// is a process-wide switch the user owns: it changes every module move,
// CPU-only ones included, and fails on tensors that have weak references.
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

namespace phantom {
namespace {

bool isDenseOnADenseBackend(c10::DispatchKeySet keys) {
  constexpr auto dense_backends = c10::DispatchKeySet(
      {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit,
       c10::BackendComponent::MPSBit, c10::BackendComponent::HIPBit,
       c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
       c10::BackendComponent::MTIABit,
       c10::BackendComponent::PrivateUse1Bit});
  constexpr auto dense = c10::DispatchKeySet(c10::DispatchKey::Dense);
  return keys.has_any(dense) && keys.has_any(dense_backends);
}

bool hasCompatibleShallowCopyType(const at::Tensor& self,
                                  const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(
          from.key_set())) {
    return true;
  }
  return isDenseOnADenseBackend(self.key_set()) &&
         isDenseOnADenseBackend(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type",
         TORCH_FN(hasCompatibleShallowCopyType));
}

}  // namespace phantom
