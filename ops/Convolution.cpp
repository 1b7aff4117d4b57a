// Convolutions. ATen sends convolutions on devices it does not know to
// convolution_overrideable and its backward, which have no CPU kernel, so
// the generic path cannot run them; here they run ATen's CPU convolution
// (forward: at::convolution, backward: at::convolution_backward) over the
// device memory, as work on the current stream, and return device tensors.
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/ops/KernelAliases.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace phantom {
namespace {

void checkSameDevice(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(),
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ", a.device(), " and ", b.device(), " (in ",
              op, "). Move them to one device first, e.g. with tensor.to(\"",
              a.device(), "\")");
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
  launchAndWait(getCurrentPhantomStream(input.device().index()),
                "aten::convolution", [&] {
                  KernelAliases aliases;
                  std::optional<at::Tensor> cpu_bias;
                  if (bias.has_value() && bias->defined()) {
                    cpu_bias = aliases.alias(*bias);
                  }
                  output = newDeviceTensorFrom(
                      at::convolution(aliases.alias(input), aliases.alias(weight),
                                      cpu_bias, stride, padding, dilation,
                                      transposed, output_padding, groups),
                      input.device());
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
  launchAndWait(
      getCurrentPhantomStream(input.device().index()),
      "aten::convolution_backward", [&] {
        KernelAliases aliases;
        const int64_t out_channels =
            transposed ? weight.size(1) * groups : weight.size(0);
        auto [gi, gw, gb] = at::convolution_backward(
            aliases.alias(grad_output), aliases.alias(input),
            aliases.alias(weight), std::vector<int64_t>{out_channels}, stride,
            padding, dilation, transposed, output_padding, groups, output_mask);
        grad_input = newDeviceTensorFrom(gi, input.device());
        grad_weight = newDeviceTensorFrom(gw, input.device());
        grad_bias = newDeviceTensorFrom(gb, input.device());
      });
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolutionBackward));
}

}  // namespace phantom
