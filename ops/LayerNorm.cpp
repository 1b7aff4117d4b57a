// Native kernels for native_layer_norm and native_layer_norm_backward.
//
// Both have Python Meta kernels in torch 2.13 and no C++ meta function,
// so the generic path waits for them (8 waits per Transformer step). Their
// outputs are simple, and written here as ATen's CPU implementation
// (layer_norm_cpu, layer_norm_backward_cpu) makes them:
//   forward   Y contiguous like the input; mean and rstd of the input's
//             dtype, shaped like the input with the normalized dims as 1s;
//   backward  dX contiguous like the input, dgamma and dbeta like the
//             weight, each only if asked for.
// The host checks the arguments with ATen's own check
// (_check_layer_norm_inputs, which also gives M rows of N elements),
// allocates the outputs and queues ATen's CPU implementation over aliases
// of the inputs, copying its results into the outputs (its kernel stubs
// cannot be called from outside libtorch, so there is one extra copy of
// each result on the device). Only the common case is taken:
// contiguous phantom tensors of one floating dtype on one device (the
// CPU's mixed-dtype variant keeps its statistics in float) and at least
// one row and column; and a dtype the CPU implementation is compiled for,
// asked of it once per call signature over tiny host tensors
// (CpuAdmission.h: float8 passes ATen's check but not the kernel).
// Anything else, and arguments the check refuses, go to the generic path,
// which runs the CPU implementation itself and raises its errors.
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/CpuAdmission.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/KernelAliases.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/ops/OutputGeometry.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/layer_norm.h>
#include <ATen/ops/native_layer_norm_backward_native.h>
#include <ATen/ops/native_layer_norm_native.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

namespace phantom {
namespace {

using Tensors3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// `t` is undefined, or a contiguous phantom tensor on `device` of `dtype`.
bool acceptable(const at::Tensor& t, c10::Device device, c10::ScalarType dtype) {
  return !t.defined() ||
         (t.device() == device && t.layout() == c10::kStrided &&
          t.scalar_type() == dtype && t.is_contiguous() && !t.is_conj() &&
          !t.is_neg());
}

// Rows and columns of the normalization, by ATen's check; nullopt when it
// refuses the arguments or there is nothing to normalize.
std::optional<std::pair<int64_t, int64_t>> rowsAndColumns(
    const at::Tensor& input, c10::IntArrayRef normalized_shape,
    const at::Tensor& weight, const at::Tensor& bias) {
  try {
    const auto [M, N] = at::native::_check_layer_norm_inputs(
        input, normalized_shape, weight, bias);
    if (M > 0 && N > 0) {
      return std::make_pair(M, N);
    }
  } catch (const c10::Error&) {
  }
  return std::nullopt;
}

std::optional<DeviceTensorRef> refOf(const at::Tensor& t) {
  return t.defined() ? std::optional<DeviceTensorRef>(DeviceTensorRef(t))
                     : std::nullopt;
}

std::optional<at::Tensor> aliasOf(KernelAliases& aliases,
                                  const std::optional<DeviceTensorRef>& ref) {
  return ref ? std::optional<at::Tensor>(aliases.alias(*ref)) : std::nullopt;
}

NativeOpCounter forward_counter("aten::native_layer_norm");
NativeOpCounter backward_counter("aten::native_layer_norm_backward");
CpuAdmission forward_admission;
CpuAdmission backward_admission;

// The normalized shape of a probe: the last `n` sizes of its input.
std::vector<int64_t> probeShape(const at::Tensor& probe_input, size_t n) {
  const at::IntArrayRef sizes = probe_input.sizes();
  return std::vector<int64_t>(sizes.end() - n, sizes.end());
}

bool forwardAdmittedByCpu(const at::Tensor& input, size_t normalized_dims,
                          const at::Tensor& weight, const at::Tensor& bias) {
  CallSignature signature;
  signature.tensor(input).tensor(weight).tensor(bias).value(
      static_cast<int64_t>(normalized_dims));
  return forward_admission.admits(signature, [&] {
    const at::Tensor x = probeTensor(input);
    at::native::layer_norm_cpu(x, probeShape(x, normalized_dims),
                               probeTensor(std::optional<at::Tensor>(weight)),
                               probeTensor(std::optional<at::Tensor>(bias)),
                               1e-5);
  });
}

bool backwardAdmittedByCpu(const at::Tensor& grad_out, const at::Tensor& input,
                           size_t normalized_dims, const at::Tensor& mean,
                           const at::Tensor& rstd, const at::Tensor& weight,
                           const at::Tensor& bias,
                           std::array<bool, 3> output_mask) {
  CallSignature signature;
  signature.tensor(grad_out).tensor(input).tensor(mean).tensor(rstd)
      .tensor(weight).tensor(bias)
      .value(static_cast<int64_t>(normalized_dims))
      .value(int64_t{output_mask[0] + 2 * output_mask[1] + 4 * output_mask[2]});
  return backward_admission.admits(signature, [&] {
    const at::Tensor x = probeTensor(input);
    at::native::layer_norm_backward_cpu(
        probeTensor(grad_out), x, probeShape(x, normalized_dims),
        probeTensor(mean), probeTensor(rstd),
        probeTensor(std::optional<at::Tensor>(weight)),
        probeTensor(std::optional<at::Tensor>(bias)), output_mask);
  });
}

Tensors3 layerNorm(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                   const std::optional<at::Tensor>& weight_opt,
                   const std::optional<at::Tensor>& bias_opt, double eps) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  if (isPhantom(input) && c10::isFloatingType(input.scalar_type()) &&
      acceptable(input, input.device(), input.scalar_type()) &&
      acceptable(weight, input.device(), input.scalar_type()) &&
      acceptable(bias, input.device(), input.scalar_type())) {
    if (rowsAndColumns(input, normalized_shape, weight, bias) &&
        forwardAdmittedByCpu(input, normalized_shape.size(), weight, bias)) {
      const c10::DeviceGuard guard(input.device());
      at::DimVector stat_shape(input.sizes().begin(),
                               input.sizes().end() - normalized_shape.size());
      stat_shape.resize(input.dim(), 1);
      at::Tensor y = emptyOnCurrentDevice(input.sizes(), input.scalar_type());
      at::Tensor mean = emptyOnCurrentDevice(stat_shape, input.scalar_type());
      at::Tensor rstd = emptyOnCurrentDevice(stat_shape, input.scalar_type());
      forward_counter.count();
      const PhantomStream stream = getCurrentPhantomStream(input.device().index());
      launchAsync(
          stream, forward_counter.op(),
          [x = DeviceTensorRef(input), gamma = refOf(weight), beta = refOf(bias),
           y = DeviceTensorRef(y), mean = DeviceTensorRef(mean),
           rstd = DeviceTensorRef(rstd),
           shape = c10::SmallVector<int64_t, 4>(normalized_shape.begin(),
                                                normalized_shape.end()),
           eps, aliases = NodeAliases::forStream(stream)] {
            // [x, y, mean, rstd, gamma?, beta?]
            c10::SmallVector<const DeviceTensorRef*, 6> refs{&x, &y, &mean, &rstd};
            if (gamma) refs.push_back(&*gamma);
            if (beta) refs.push_back(&*beta);
            aliases.run(refs, [&](c10::ArrayRef<at::Tensor> cpu) {
              // As the CPU's autograd kernel calls the CPU kernel.
              const at::AutoDispatchBelowADInplaceOrView below_autograd;
              size_t next = 4;
              std::optional<at::Tensor> gamma_cpu, beta_cpu;
              if (gamma) gamma_cpu = cpu[next++];
              if (beta) beta_cpu = cpu[next++];
              const auto [y_cpu, mean_cpu, rstd_cpu] = at::native::layer_norm_cpu(
                  cpu[0], shape, gamma_cpu, beta_cpu, eps);
              at::Tensor(cpu[1]).copy_(y_cpu);
              at::Tensor(cpu[2]).copy_(mean_cpu);
              at::Tensor(cpu[3]).copy_(rstd_cpu);
            });
          });
      return {y, mean, rstd};
    }
  }
  torch::jit::Stack stack =
      boxArguments(input, normalized_shape, weight_opt, bias_opt, eps);
  runGenericBoxed("aten::native_layer_norm", "", &stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

Tensors3 layerNormBackward(const at::Tensor& grad_out, const at::Tensor& input,
                           c10::IntArrayRef normalized_shape,
                           const at::Tensor& mean, const at::Tensor& rstd,
                           const std::optional<at::Tensor>& weight_opt,
                           const std::optional<at::Tensor>& bias_opt,
                           std::array<bool, 3> output_mask) {
  const at::Tensor weight = weight_opt.value_or(at::Tensor());
  const at::Tensor bias = bias_opt.value_or(at::Tensor());
  const bool simple =
      isPhantom(input) && c10::isFloatingType(input.scalar_type()) &&
      mean.defined() && rstd.defined() &&
      (!output_mask[1] || weight.defined()) &&
      (!output_mask[2] || bias.defined());
  if (simple) {
    const c10::Device device = input.device();
    const c10::ScalarType dtype = input.scalar_type();
    bool ok = true;
    for (const at::Tensor* t : {&grad_out, &input, &mean, &rstd, &weight, &bias}) {
      ok = ok && acceptable(*t, device, dtype);
    }
    ok = ok && grad_out.defined() && grad_out.sizes() == input.sizes();
    const auto rows = ok ? rowsAndColumns(input, normalized_shape, weight, bias)
                         : std::nullopt;
    if (rows && mean.numel() == rows->first && rstd.numel() == rows->first &&
        backwardAdmittedByCpu(grad_out, input, normalized_shape.size(), mean,
                              rstd, weight, bias, output_mask)) {
      const c10::DeviceGuard guard(device);
      at::Tensor dx, dgamma, dbeta;
      if (output_mask[0]) {
        dx = emptyOnCurrentDevice(input.sizes(), input.scalar_type());
      }
      if (output_mask[1]) {
        dgamma = emptyOnCurrentDevice(weight.sizes(), weight.scalar_type());
      }
      if (output_mask[2]) {
        dbeta = emptyOnCurrentDevice(bias.sizes(), bias.scalar_type());
      }
      backward_counter.count();
      launchAsync(
          getCurrentPhantomStream(device.index()), backward_counter.op(),
          [dy = DeviceTensorRef(grad_out), x = DeviceTensorRef(input),
           mean = DeviceTensorRef(mean), rstd = DeviceTensorRef(rstd),
           gamma = refOf(weight), beta = refOf(bias), dx_ref = refOf(dx),
           dgamma_ref = refOf(dgamma), dbeta_ref = refOf(dbeta),
           shape = c10::SmallVector<int64_t, 4>(normalized_shape.begin(),
                                                normalized_shape.end()),
           output_mask] {
            KernelAliases aliases;
            const auto results = at::native::layer_norm_backward_cpu(
                aliases.alias(dy), aliases.alias(x), shape, aliases.alias(mean),
                aliases.alias(rstd), aliasOf(aliases, gamma),
                aliasOf(aliases, beta), output_mask);
            if (dx_ref) aliases.alias(*dx_ref).copy_(std::get<0>(results));
            if (dgamma_ref) aliases.alias(*dgamma_ref).copy_(std::get<1>(results));
            if (dbeta_ref) aliases.alias(*dbeta_ref).copy_(std::get<2>(results));
          });
      return {dx, dgamma, dbeta};
    }
  }
  torch::jit::Stack stack =
      boxArguments(grad_out, input, normalized_shape, mean, rstd, weight_opt,
                   bias_opt, output_mask);
  runGenericBoxed("aten::native_layer_norm_backward", "", &stack);
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_layer_norm", TORCH_FN(layerNorm));
  m.impl("native_layer_norm_backward", TORCH_FN(layerNormBackward));
}

}  // namespace phantom
