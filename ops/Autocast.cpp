// Automatic mixed precision on phantom: the op policy behind
// torch.autocast("phantom", dtype=torch.bfloat16 | torch.float16).
//
// While autocast is enabled for a device type, ATen dispatches to that
// type's Autocast key before autograd; for PrivateUse1 that key is
// AutocastPrivateUse1, and PyTorch registers nothing for it (no policy and
// not even a fallthrough), so without this file every op called under
// torch.autocast("phantom") fails with "Could not run ... with arguments
// from the 'Autocastphantom' backend".
//
// The policy is CUDA's, taken from the same op lists ATen's CUDA
// registration uses (AT_FORALL_* in ATen/autocast_mode.h), so a model
// written for CUDA's autocast computes the same dtypes on phantom:
//   lower_precision_fp  matmul, linear, conv*, mm, bmm, addmm, baddbmm,
//                       RNN cells, scaled_dot_product_attention, ...:
//                       floating inputs are cast to the autocast dtype.
//   fp32                exp, log, pow, layer_norm, group_norm, losses,
//                       upsampling, ...: cast to float32.
//   fp32_set_opt_dtype  softmax, log_softmax, sum, prod, cumsum, cumprod,
//                       norms: run in float32 unless the caller passed a
//                       dtype.
//   fp32_append_dtype   norm.Scalar, norm.ScalarOpt_dim.
//   promote             addcmul, addcdiv, atan2, dot, cross, index_put,
//                       scatter_add, ...: inputs are cast to the widest
//                       floating type among them.
//   banned              binary_cross_entropy (unsafe in float16; use the
//                       _with_logits form), as on CUDA.
// Every other op falls through and runs in its inputs' dtypes. Casting
// happens at this level, ahead of autograd, so lower-precision ops save
// lower-precision inputs for backward, exactly as on CUDA.
//
// Only tensors on a phantom device are cast (is_autocast_eligible for
// PrivateUse1); the supported dtypes are those get_amp_supported_dtype()
// in torch.phantom reports. See docs/amp.md.
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace phantom {
namespace {

at::Tensor binaryCrossEntropyBanned(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&,
                                    int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss "
              "are unsafe to autocast on ", c10::get_privateuse1_backend(),
              " (as on CUDA): a float16 "
              "input can round probabilities to 0 or 1. Many models use a "
              "sigmoid layer right before the binary cross entropy layer; "
              "combine the two with "
              "torch.nn.functional.binary_cross_entropy_with_logits or "
              "torch.nn.BCEWithLogitsLoss, which are safe to autocast. To "
              "keep BCELoss, disable autocast around it (torch.autocast(\"",
              c10::get_privateuse1_backend(),
              "\", enabled=False)) and pass float32 inputs.");
}

}  // namespace

// AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE spells signatures unqualified,
// as inside namespace at.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// Ops with no policy run unchanged.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define PHANTOM_AUTOCAST_LOWER_PRECISION_FP(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(PHANTOM_AUTOCAST_LOWER_PRECISION_FP)
#undef PHANTOM_AUTOCAST_LOWER_PRECISION_FP

#define PHANTOM_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(PHANTOM_AUTOCAST_FP32)
#undef PHANTOM_AUTOCAST_FP32

#define PHANTOM_AUTOCAST_FP32_SET_OPT_DTYPE(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(PHANTOM_AUTOCAST_FP32_SET_OPT_DTYPE)
#undef PHANTOM_AUTOCAST_FP32_SET_OPT_DTYPE

  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(
      KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define PHANTOM_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(PHANTOM_AUTOCAST_PROMOTE)
#undef PHANTOM_AUTOCAST_PROMOTE

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binaryCrossEntropyBanned));
}

}  // namespace phantom
