// native_dropout draws its mask with the device's generator;
// native_dropout_backward is queued.
//
// aten::native_dropout has no Generator argument, so on the generic path
// its CPU kernel would draw from the CPU's default generator: phantom
// dropout would ignore torch.phantom.manual_seed, get_rng_state and
// fork_rng, and advance the CPU's random stream instead. This is the CPU
// kernel (ATen's native_dropout_cpu) written in ops, so bernoulli_ draws
// from the phantom device's generator, number for number what the CPU
// draws with the same seed.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace phantom {
namespace {

std::tuple<at::Tensor, at::Tensor> nativeDropout(const at::Tensor& input,
                                                 double p,
                                                 std::optional<bool> train) {
  if (input.numel() == 0) {
    return std::make_tuple(input, at::empty_like(input, input.options()));
  }
  if (train.has_value() && !*train) {
    return std::make_tuple(input.clone(),
                           at::ones_like(input, input.options().dtype(at::kBool)));
  }
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;  // p == 1 drops everything
  // A boolean mask with the input's layout, as the CPU's dropout draws its
  // noise: the mask of a non-contiguous input is filled in memory order.
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(scale);
  return std::make_tuple(output, mask);
}

// The CPU's native_dropout_backward is these two products; written in ops
// they are queued (Elementwise.cpp), where the generic path would wait
// (its Meta kernel is Python).
at::Tensor nativeDropoutBackward(const at::Tensor& grad, const at::Tensor& mask,
                                 double scale) {
  return at::mul(at::mul(grad, mask), scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(nativeDropout));
  m.impl("native_dropout_backward", TORCH_FN(nativeDropoutBackward));
}

}  // namespace phantom
