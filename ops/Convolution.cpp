// Convolutions. ATen sends convolutions on devices it does not know to
// convolution_overrideable and its backward, which have no CPU kernel, so
// the generic path cannot run them; here they run ATen's CPU convolution
// (forward: at::convolution, backward: at::convolution_backward) over the
// device memory, as work on the current stream, and return device tensors.
// Where the result's shape is known ahead (the output of a convolution of
// dense tensors; the input and weight gradients), its device tensor is
// allocated first and its memory lent to the kernel's allocation of that
// size (phantom/KernelHostMemory.h), so the result is computed in place
// instead of copied (25 MiB per 32x64x56x56 convolution).
#include <phantom/KernelHostMemory.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/SyncDebug.h>
#include <phantom/KernelAliases.h>

#include <ATen/core/Tensor.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace phantom {
namespace {

// For torch.phantom.set_sync_debug_mode (phantom/SyncDebug.h).
constexpr const char* kWaitReason =
    "phantom computes convolutions on the host and waits for them; a device "
    "kernel would be queued";

void checkSameDevice(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(),
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ", a.device(), " and ", b.device(), " (in ",
              op, "). Move them to one device first, e.g. with tensor.to(\"",
              a.device(), "\")");
}

// A new contiguous device tensor whose memory is offered to the kernel's
// allocation of its size; undefined (nothing allocated) when the scope
// could not lend that size.
at::Tensor lentOutput(LendingScope& lending, KernelAliases& aliases,
                      c10::IntArrayRef sizes, const at::TensorOptions& options) {
  if (!lending.accepts(c10::multiply_integers(sizes) * options.dtype().itemsize())) {
    return at::Tensor();
  }
  at::Tensor ahead = at::empty(sizes, options);
  const at::Tensor view = aliases.alias(ahead);
  lending.offer(view.data_ptr(), view.nbytes());
  return ahead;
}

// After the kernel: `ahead` if the kernel computed `cpu` in its memory,
// else a new device tensor holding a copy of `cpu`. Either way no lent
// memory is written here, so results can be taken in any order.
at::Tensor deviceResult(const at::Tensor& cpu, const at::Tensor& ahead,
                        KernelAliases& aliases, c10::Device device) {
  if (cpu.defined() && ahead.defined() && computedIn(cpu, aliases.alias(ahead))) {
    noteResultInPlace();
    return ahead;
  }
  return newDeviceTensorFrom(cpu, device);
}

// Results in the memory format PyTorch gives a convolution on this device:
// contiguous. That is ATen's rule for the backend it picks for PrivateUse1
// (ConvBackend::Overrideable, _conv_determine_backend_memory_format), which
// fake tensors (torch.compile, torch.export) follow, and compiled code
// asserts the strides it was traced with; the CPU kernel run here keeps a
// channels-last input's format instead.
at::Tensor asOverrideableFormat(const at::Tensor& cpu) {
  return cpu.defined() && !cpu.is_contiguous() ? cpu.contiguous() : cpu;
}

// The output sizes of a convolution, if they follow from the arguments as
// given (not transposed, one stride/padding/dilation per spatial dim) and
// are all positive (otherwise the CPU kernel reports the bad arguments).
std::optional<std::vector<int64_t>> convolutionOutputSizes(
    const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed) {
  const int64_t dims = input.dim() - 2;
  if (transposed || dims < 1 || weight.dim() != input.dim() ||
      static_cast<int64_t>(stride.size()) != dims ||
      static_cast<int64_t>(padding.size()) != dims ||
      static_cast<int64_t>(dilation.size()) != dims ||
      std::any_of(stride.begin(), stride.end(), [](int64_t s) { return s < 1; })) {
    return std::nullopt;
  }
  std::vector<int64_t> sizes = at::native::conv_output_size(
      input.sizes(), weight.sizes(), padding, stride, dilation);
  if (std::any_of(sizes.begin(), sizes.end(), [](int64_t n) { return n < 1; })) {
    return std::nullopt;
  }
  return sizes;
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding,
                       c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  checkSameDevice("aten::convolution", input, weight);
  if (bias.has_value() && bias->defined()) {
    checkSameDevice("aten::convolution", input, *bias);
  }
  const c10::DeviceGuard guard(input.device());
  at::Tensor output;
  noteHostWait("aten::convolution", kWaitReason);
  launchAndWait(getCurrentPhantomStream(input.device().index()),
                "aten::convolution", [&] {
                  KernelAliases aliases;
                  std::optional<at::Tensor> cpu_bias;
                  if (bias.has_value() && bias->defined()) {
                    cpu_bias = aliases.alias(*bias);
                  }
                  LendingScope lending;
                  at::Tensor ahead;
                  const auto sizes = convolutionOutputSizes(
                      input, weight, stride, padding, dilation, transposed);
                  if (sizes && input.is_contiguous() && weight.is_contiguous()) {
                    ahead = lentOutput(lending, aliases, *sizes, input.options());
                  }
                  at::Tensor result = asOverrideableFormat(at::convolution(
                      aliases.alias(input), aliases.alias(weight), cpu_bias,
                      stride, padding, dilation, transposed, output_padding,
                      groups));
                  lending.close();
                  output = deviceResult(result, ahead, aliases, input.device());
                  result.reset();
                  lending.requireNothingKept("aten::convolution");
                });
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackward(
    const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  checkSameDevice("aten::convolution_backward", grad_output, input);
  checkSameDevice("aten::convolution_backward", input, weight);
  const c10::DeviceGuard guard(input.device());
  at::Tensor grad_input, grad_weight, grad_bias;
  noteHostWait("aten::convolution_backward", kWaitReason);
  launchAndWait(
      getCurrentPhantomStream(input.device().index()),
      "aten::convolution_backward", [&] {
        KernelAliases aliases;
        const int64_t out_channels =
            transposed ? weight.size(1) * groups : weight.size(0);
        LendingScope lending;
        at::Tensor input_ahead, weight_ahead;
        if (grad_output.is_contiguous() && input.is_contiguous() &&
            weight.is_contiguous()) {
          if (output_mask[0]) {
            input_ahead = lentOutput(lending, aliases, input.sizes(), input.options());
          }
          if (output_mask[1]) {
            weight_ahead = lentOutput(lending, aliases, weight.sizes(), weight.options());
          }
        }
        auto [gi, gw, gb] = at::convolution_backward(
            aliases.alias(grad_output), aliases.alias(input),
            aliases.alias(weight), std::vector<int64_t>{out_channels}, stride,
            padding, dilation, transposed, output_padding, groups, output_mask);
        lending.close();
        grad_input = deviceResult(asOverrideableFormat(gi), input_ahead, aliases,
                                  input.device());
        grad_weight = deviceResult(asOverrideableFormat(gw), weight_ahead, aliases,
                                   input.device());
        grad_bias = newDeviceTensorFrom(gb, input.device());
        gi.reset();
        gw.reset();
        gb.reset();
        lending.requireNothingKept("aten::convolution_backward");
      });
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolutionBackward));
}

}  // namespace phantom
