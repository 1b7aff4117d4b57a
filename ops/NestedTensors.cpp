// Strided nested tensors on phantom (the NestedTensorPrivateUse1 key).
//
// A strided nested tensor is a NestedTensorImpl: one dense buffer holding
// every component back to back, and three small CPU tensors giving each
// component's sizes, strides and offset into the buffer. A nested tensor
// whose buffer is a phantom tensor has the NestedTensorPrivateUse1 key, for
// which ATen registers no kernel: its nested kernels are registered for
// NestedTensorCPU and NestedTensorCUDA only.
//
// Most of those kernels are device-generic: ATen registers the same
// function for both keys, and that function works on the buffer through
// ATen ops (an add of two buffers, a narrow, a copy_) and reads only the
// CPU metadata on the host, which is why it runs on CUDA, whose memory the
// host cannot touch. For exactly those ops (kGenericNestedOps: every op of
// torch 2.13's native_functions.yaml whose NestedTensorCPU and
// NestedTensorCUDA kernels are one function, plus to_padded_tensor's
// `_generic` CPU kernel) phantom's kernel redispatches to the CPU key's
// kernel with the phantom arguments unchanged. The buffer ops inside then
// dispatch to phantom like any other op: asynchronous, on the current
// stream, checked by the race detector.
//
// Layer norm is the exception among the shared kernels: ATen's nested
// layer norm calls its kernel stub for the buffer's device type, CPU or
// CUDA, and has no entry for phantom. Phantom's runs the dense
// native_layer_norm (and its backward) on the buffer viewed as M rows of
// N normalized elements, which is the computation the CPU's nested kernel
// does, so results are the CPU's bit for bit.
//
// The ops whose CPU kernel is CPU-specific (it reads the buffer's data on
// the host) or differs from CUDA's (kCpuSpecificNestedOps) are refused at
// the call with what to use instead; running them would read device
// memory from the host.
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/nested/NestedTensorMath.h>
#include <ATen/native/nested/NestedTensorUtils.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace phantom {
namespace {

// Ops whose NestedTensorCPU kernel is the one NestedTensorCUDA uses, or
// is named generic (to_padded_tensor).
constexpr const char* kGenericNestedOps[] = {
    "native_dropout", "native_dropout_backward", "abs", "abs_", "sgn",
    "sgn_", "add.Tensor", "add_.Tensor", "all.dim", "logical_not",
    "logical_not_", "cat", "chunk", "copy_", "cos", "div.Tensor",
    "div.Scalar", "embedding", "empty_like", "fill_.Scalar", "fill_.Tensor",
    "isnan", "is_same_size", "linear", "linear_backward", "matmul",
    "matmul_backward", "matmul.out", "value_selecting_reduction_backward",
    "mul.Tensor", "mul_.Tensor", "mul.Scalar", "mul_.Scalar", "narrow",
    "ones_like", "neg", "neg_", "relu", "relu_", "gelu_", "gelu",
    "gelu_backward", "select.int", "_nested_select_backward", "silu",
    "silu_", "silu_backward", "sin", "detach", "_softmax",
    "_softmax_backward_data", "split_with_sizes", "squeeze", "squeeze.dim",
    "squeeze.dims", "sqrt", "tanh", "tanh_", "threshold_backward",
    "transpose.int", "_nested_tensor_size", "_nested_tensor_strides",
    "_nested_tensor_storage_offsets", "_nested_from_padded_and_nested_example",
    "unsqueeze", "where.self", "where.self_out", "clone", "zero_",
    "sub.Tensor", "values", "unbind.int", "_to_copy", "masked_fill.Scalar",
    "view", "eq.Scalar", "eq.Tensor", "ge.Scalar", "gt.Scalar", "normal_",
    "alias", "isinf", "isposinf", "isneginf", "_safe_softmax",
    "_transformer_encoder_layer_fwd", "to_padded_tensor",
};

// Ops whose NestedTensorCPU kernel reads the buffer on the host or is not
// CUDA's, with what a user does instead.
struct CpuSpecificOp {
  const char* name;
  const char* instead;
};
constexpr CpuSpecificOp kCpuSpecificNestedOps[] = {
    {"bmm", "torch.matmul, or layout=torch.jagged"},
    {"sum.dim_IntList", "layout=torch.jagged, or to_padded_tensor(0).sum(dim)"},
    {"_nested_sum_backward", "layout=torch.jagged"},
    {"_nested_tensor_softmax_with_shape", "torch.softmax on the nested tensor"},
    {"_transform_bias_rescale_qkv", "layout=torch.jagged"},
    {"_native_multi_head_attention", "layout=torch.jagged"},
    {"_fused_sdp_choice", "layout=torch.jagged"},
    {"_pin_memory", "pinning the CPU nested tensor before moving it"},
};

void runGenericNestedKernel(const c10::OperatorHandle& op,
                            c10::DispatchKeySet /*keys*/,
                            torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU),
                     stack);
}

// Dense ops that build or read a nested tensor's structure from a dense
// phantom buffer and CPU metadata (sizes, strides, offsets). Their CPU
// kernel is the one CUDA uses too (nested_from_padded's is named generic),
// so it runs on the phantom buffer through ATen ops; the dense generic
// path would refuse the CPU metadata as a tensor of another device.
constexpr const char* kGenericDenseNestedOps[] = {
    "_nested_from_padded",
    "_nested_view_from_buffer",
    "_nested_tensor_from_mask",
    "_nested_tensor_from_mask_left_aligned",
};

void runGenericDenseNestedKernel(const c10::OperatorHandle& op,
                                 c10::DispatchKeySet /*keys*/,
                                 torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// The rows (M) and normalized elements per row (N) of a contiguous nested
// input, after ATen's own checks of the arguments.
std::pair<int64_t, int64_t> layerNormRows(const at::Tensor& input,
                                          c10::IntArrayRef normalized_shape,
                                          const std::optional<at::Tensor>& weight,
                                          const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(weight.has_value() && weight->defined() &&
                        bias.has_value() && bias->defined(),
                    "NestedTensor layer_norm requires weight and bias");
  TORCH_CHECK(!weight->is_nested(),
              "NestedTensor weight not supported for layer_norm");
  TORCH_CHECK(!bias->is_nested(),
              "NestedTensor bias not supported for layer_norm");
  const at::native::NestedTensorImpl* nt =
      at::native::get_nested_tensor_impl(input);
  TORCH_CHECK(at::native::nested_tensor_impl_is_contiguous(nt),
              "NestedTensor layer_norm needs a contiguous input; call "
              ".contiguous() first");
  return at::native::_check_nested_layer_norm_inputs(*nt, normalized_shape,
                                                     *weight, *bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> nestedLayerNorm(
    const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps) {
  const auto [rows, columns] =
      layerNormRows(input, normalized_shape, weight, bias);
  const at::native::NestedTensorImpl* nt =
      at::native::get_nested_tensor_impl(input);
  auto [output, mean, rstd] = at::native_layer_norm(
      nt->get_buffer().view({rows, columns}), {columns}, weight, bias, eps);
  return {at::native::wrap_buffer(output.view({-1}),
                                  nt->get_nested_sizes().clone()),
          mean.view({rows}), rstd.view({rows})};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> nestedLayerNormBackward(
    const at::Tensor& grad, const at::Tensor& input,
    c10::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  const auto [rows, columns] =
      layerNormRows(input, normalized_shape, weight, bias);
  const at::native::NestedTensorImpl* nt_input =
      at::native::get_nested_tensor_impl(input);
  const at::native::NestedTensorImpl* nt_grad =
      at::native::get_nested_tensor_impl(grad);
  TORCH_CHECK(at::native::nested_tensor_impl_is_contiguous(nt_grad),
              "NestedTensor layer_norm backward needs a contiguous gradient");
  auto [grad_input, grad_weight, grad_bias] = at::native_layer_norm_backward(
      nt_grad->get_buffer().view({rows, columns}),
      nt_input->get_buffer().view({rows, columns}), {columns},
      mean.view({rows, 1}), rstd.view({rows, 1}), weight, bias, output_mask);
  if (grad_input.defined()) {
    grad_input = at::native::wrap_buffer(grad_input.view({-1}),
                                         nt_input->get_nested_sizes().clone());
  }
  return {grad_input, grad_weight, grad_bias};
}

void refuseCpuSpecificNestedOp(const c10::OperatorHandle& op,
                               c10::DispatchKeySet /*keys*/,
                               torch::jit::Stack* /*stack*/) {
  const c10::OperatorName& name = op.schema().operator_name();
  std::string full = name.name;
  if (!name.overload_name.empty()) full += "." + name.overload_name;
  const char* instead = "layout=torch.jagged";
  for (const CpuSpecificOp& entry : kCpuSpecificNestedOps) {
    if (full == std::string("aten::") + entry.name) instead = entry.instead;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, full,
      " is not supported on strided nested tensors on phantom: ATen's only "
      "kernel for it reads the nested tensor's data on the host, which "
      "device memory does not allow. Use ",
      instead, ", or move the nested tensor to the CPU.");
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : kGenericDenseNestedOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<
                     &runGenericDenseNestedKernel>());
  }
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  for (const char* name : kGenericNestedOps) {
    m.impl(name,
           torch::CppFunction::makeFromBoxedFunction<&runGenericNestedKernel>());
  }
  for (const CpuSpecificOp& entry : kCpuSpecificNestedOps) {
    m.impl(entry.name, torch::CppFunction::makeFromBoxedFunction<
                           &refuseCpuSpecificNestedOp>());
  }
  m.impl("native_layer_norm", TORCH_FN(nestedLayerNorm));
  m.impl("native_layer_norm_backward", TORCH_FN(nestedLayerNormBackward));
}

}  // namespace phantom
