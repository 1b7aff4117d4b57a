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
//
// Its products, output = input * mask * scale forward and grad * mask *
// scale backward, are each one queued direct loop (DirectLoops.h) for a
// contiguous float or double tensor of up to one thread's grain: the
// CPU's two multiplications, element by element, the bool mask read as
// 1 or 0 in the product's dtype and the scale rounded to that dtype, as
// the CPU's type promotion does. As two ops they would cost two launches,
// a temporary, and a bool-to-float copy of the mask inside the first
// CPU kernel. Anything else (half, strided, larger) keeps the two ops.
#include <phantom/BoundsCheck.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/ops/DirectLoops.h>
#include <phantom/ops/GenericPath.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace phantom {
namespace {

// out[i] = (x[i] * T(mask[i])) * T(scale), for T float or double.
struct DirectMaskedScale {
  bool is_float;
  int64_t numel;
  void* x_data;
  int64_t x_offset;
  void* mask_data;
  int64_t mask_offset;
  void* out_data;
  int64_t out_offset;
  double scale;

  template <typename T>
  void loop() const {
    const int64_t n = numel;
    const T* x = kernelPointer<T>(x_data, x_offset);
    // A bool is the byte 0 or 1; read as a byte, the loop vectorizes.
    const uint8_t* mask = kernelPointer<uint8_t>(mask_data, mask_offset);
    T* o = kernelPointer<T>(out_data, out_offset);
    const T s = static_cast<T>(scale);
    // `out` is fresh: it overlaps neither input.
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      const T kept = x[i] * static_cast<T>(mask[i]);
      o[i] = kept * s;
    }
  }

  void operator()() const {
    if (is_float) {
      loop<float>();
    } else {
      loop<double>();
    }
  }
};

// Whether out = x * mask * scale can be one direct loop: the driver has a
// kernel view, x is a contiguous float or double tensor the loop can
// write a fresh copy of, and mask a contiguous bool of x's sizes on x's
// device. Without a kernel view these kernels keep their registration
// (CopyingFallback.cpp) and their products take the copying fallback.
bool fitsMaskedScale(const at::Tensor& x, const at::Tensor& mask) {
  return kernelViewAvailable() && isPlainPhantom(x) && isPlainPhantom(mask) &&
         fitsDirectOutput(x) && mask.scalar_type() == at::kBool &&
         mask.device() == x.device() && mask.is_contiguous() &&
         mask.sizes() == x.sizes();
}

// Queues out = x * mask * scale, for arguments fitsMaskedScale takes and a
// fresh `out` like x.
void queueMaskedScale(const at::Tensor& x, const at::Tensor& mask,
                      double scale, const at::Tensor& out) {
  checkInsideStorage(x);  // as DeviceTensorRef would
  checkInsideStorage(mask);
  checkInsideStorage(out);
  const DirectMaskedScale work{x.scalar_type() == at::kFloat,
                               x.numel(),
                               x.storage().mutable_data(),
                               x.storage_offset(),
                               mask.storage().mutable_data(),
                               mask.storage_offset(),
                               out.storage().mutable_data(),
                               out.storage_offset(),
                               scale};
  launchAsync(getCurrentPhantomStream(x.device().index()),
              "aten::native_dropout", work);
}

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
  if (fitsMaskedScale(input, mask)) {
    const c10::DeviceGuard guard(input.device());
    at::Tensor output = at::empty_like(input);
    queueMaskedScale(input, mask, scale, output);
    return std::make_tuple(output, mask);
  }
  at::Tensor output = input.mul(mask).mul_(scale);
  return std::make_tuple(output, mask);
}

// The CPU's native_dropout_backward is these two products; written in ops
// they are queued (one direct loop, or Elementwise.cpp's two), where the
// generic path would wait (its Meta kernel is Python).
at::Tensor nativeDropoutBackward(const at::Tensor& grad, const at::Tensor& mask,
                                 double scale) {
  if (fitsMaskedScale(grad, mask)) {
    const c10::DeviceGuard guard(grad.device());
    at::Tensor result = at::empty_like(grad);
    queueMaskedScale(grad, mask, scale, result);
    return result;
  }
  return at::mul(at::mul(grad, mask), scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(nativeDropout));
  m.impl("native_dropout_backward", TORCH_FN(nativeDropoutBackward));
}

}  // namespace phantom
