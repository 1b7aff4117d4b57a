// Native kernels for structured ops whose Meta kernel is Python in torch
// 2.13, or whose generic-path call costs the host more than the op: matrix
// products, reductions, cumsum and index_add, softmax, a few activations
// and their backwards, negation, reciprocal, pow by a scalar, comparisons,
// dot, max, and cat.
//
// ATen's structured ops split into a meta function (checks the arguments,
// computes the output's shape, strides and dtype) shared by every backend,
// and an implementation per backend. torch 2.13 registers Python Meta
// kernels over the C++ ones for most of them (torch/_meta_registrations.py),
// so the generic path would have to wait for the kernel instead (running
// the Python one costs more). The C++ meta functions are still there, as
// at::meta::<op>, and are what the CPU runs before its kernel. So here:
//   1. the inputs are mirrored as meta tensors and at::meta::<op> gives
//      the output: the same checks as on the CPU, raised at the call;
//   2. the output is allocated on the device with those strides;
//   3. at::cpu::<op>_out is queued, writing straight into the output.
// The meta functions do not check what the CPU implementations check for
// themselves, dtypes above all (`mm` of float and int64, of bool; `sigmoid`
// of float8): a CpuAdmission (phantom/CpuAdmission.h) asks the CPU
// implementation once per call signature, over tiny host tensors, and a
// scalar that does not convert to the call's dtypes is not taken. When an
// argument is not a phantom tensor on the op's device (another device, a
// CPU tensor, conj/neg bits, a sparse layout), or the meta function or the
// CPU implementation refuses the arguments, the op goes to the generic
// path, which raises the CPU's error or runs the CPU kernel.
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/CpuAdmission.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/KernelAliases.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/ops/OutputGeometry.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_meta_dispatch.h>
#include <ATen/ops/_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_softmax_backward_data_meta_dispatch.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_meta_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/addmm_meta_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/bmm_meta_dispatch.h>
#include <ATen/ops/cat_cpu_dispatch.h>
#include <ATen/ops/cat_meta_dispatch.h>
#include <ATen/ops/cumsum_cpu_dispatch.h>
#include <ATen/ops/cumsum_meta_dispatch.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/dot_cpu_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq_cpu_dispatch.h>
#include <ATen/ops/eq_meta_dispatch.h>
#include <ATen/ops/ge_cpu_dispatch.h>
#include <ATen/ops/ge_meta_dispatch.h>
#include <ATen/ops/gt_cpu_dispatch.h>
#include <ATen/ops/gt_meta_dispatch.h>
#include <ATen/ops/le_cpu_dispatch.h>
#include <ATen/ops/le_meta_dispatch.h>
#include <ATen/ops/lt_cpu_dispatch.h>
#include <ATen/ops/lt_meta_dispatch.h>
#include <ATen/ops/max_cpu_dispatch.h>
#include <ATen/ops/ne_cpu_dispatch.h>
#include <ATen/ops/ne_meta_dispatch.h>
#include <ATen/ops/neg_cpu_dispatch.h>
#include <ATen/ops/neg_meta_dispatch.h>
#include <ATen/ops/pow_cpu_dispatch.h>
#include <ATen/ops/pow_meta_dispatch.h>
#include <ATen/ops/reciprocal_cpu_dispatch.h>
#include <ATen/ops/reciprocal_meta_dispatch.h>
#include <ATen/native/Gelu.h>
#include <ATen/ops/gelu_backward_cpu_dispatch.h>
#include <ATen/ops/gelu_backward_meta_dispatch.h>
#include <ATen/ops/gelu_cpu_dispatch.h>
#include <ATen/ops/gelu_meta_dispatch.h>
#include <ATen/ops/index_add_cpu_dispatch.h>
#include <ATen/ops/index_add_meta_dispatch.h>
#include <ATen/ops/mean_cpu_dispatch.h>
#include <ATen/ops/mean_meta_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mm_meta_dispatch.h>
#include <ATen/ops/sigmoid_backward_cpu_dispatch.h>
#include <ATen/ops/sigmoid_backward_meta_dispatch.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/sigmoid_meta_dispatch.h>
#include <ATen/ops/sum_cpu_dispatch.h>
#include <ATen/ops/sum_meta_dispatch.h>
#include <ATen/ops/tanh_backward_cpu_dispatch.h>
#include <ATen/ops/tanh_backward_meta_dispatch.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <ATen/ops/tanh_meta_dispatch.h>
#include <ATen/ops/threshold_backward_cpu_dispatch.h>
#include <ATen/ops/threshold_backward_meta_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace phantom {
namespace {

// The device of the op's inputs when they are all plain phantom tensors on
// one device; nullopt when the native path must decline.
template <size_t N>
std::optional<c10::Device> commonDevice(const std::array<const at::Tensor*, N>& tensors) {
  std::optional<c10::Device> device;
  for (const at::Tensor* t : tensors) {
    if (!isPlainPhantom(*t)) {
      return std::nullopt;
    }
    if (!device) {
      device = t->device();
    } else if (t->device() != *device) {
      return std::nullopt;  // the generic path reports mixed devices
    }
  }
  return device;
}

// Queues `kernel(out, input aliases...)` for a phantom output of
// `geometry`. Returns the output.
template <size_t N, typename Kernel>
at::Tensor queueKernel(const char* name, c10::Device device,
                       const std::array<const at::Tensor*, N>& tensors,
                       const OutputGeometry& geometry, Kernel kernel) {
  const c10::DeviceGuard guard(device);
  at::Tensor out = emptyOnCurrentDevice(geometry.sizes, geometry.strides, geometry.dtype);
  // refs[0] is the output, then the inputs in order.
  c10::SmallVector<DeviceTensorRef, N + 1> refs;
  refs.emplace_back(out);
  for (const at::Tensor* t : tensors) {
    refs.emplace_back(*t);
  }
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  launchAsync(stream, name,
              [refs = std::move(refs), kernel = std::move(kernel),
               aliases = NodeAliases::forStream(stream)] {
                std::array<const DeviceTensorRef*, N + 1> pointers;
                for (size_t i = 0; i <= N; ++i) {
                  pointers[i] = &refs[i];
                }
                aliases.run(pointers, [&](c10::ArrayRef<at::Tensor> cpu) {
                  // As the CPU's autograd kernel calls the CPU kernel: the
                  // ops it calls skip autograd's and view tracking's
                  // kernels (the same kernels, less dispatch).
                  const at::AutoDispatchBelowADInplaceOrView below_autograd;
                  at::Tensor result = cpu[0];
                  std::array<at::Tensor, N> in;
                  for (size_t i = 0; i < N; ++i) {
                    in[i] = cpu[i + 1];
                  }
                  kernel(result, in);
                });
              });
  return out;
}

// One native kernel's counter for the ops report, its CPU admission and
// its remembered output geometries.
struct NativeOp {
  explicit NativeOp(const char* name) : counter(name) {}
  NativeOpCounter counter;
  CpuAdmission admission;
  OutputGeometryMemo geometries;
};

// Whether the CPU implementation accepts the call (see CpuAdmission): the
// probe runs `meta` and `kernel` over probe tensors on the host.
template <size_t N, typename Meta, typename Kernel>
bool admittedByCpu(NativeOp& native, CallSignature& signature,
                   const std::array<const at::Tensor*, N>& tensors,
                   at::ArrayRef<at::Scalar> scalars, const Meta& meta,
                   const Kernel& kernel) {
  // No copies of the caller's tensors: a second reference to a tensor
  // Python owns makes torch take the GIL (TensorImpl::incref_pyobject),
  // and again to drop it.
  for (const at::Tensor* t : tensors) {
    signature.tensor(*t);
  }
  for (const at::Scalar& scalar : scalars) {
    signature.scalarKind(scalar);
  }
  for (const at::Tensor* t : tensors) {
    if (t->defined() && !scalarsFit(scalars, {t->scalar_type()})) {
      return false;
    }
  }
  return native.admission.admits(signature, [&] {
    std::array<at::Tensor, N> host;
    std::array<at::Tensor, N> metas;
    for (size_t i = 0; i < N; ++i) {
      host[i] = probeTensor(*tensors[i]);
      metas[i] = metaLike(host[i]);
    }
    const at::Tensor out_meta = meta(metas);
    at::Tensor out = at::empty_strided(out_meta.sizes(), out_meta.strides(),
                                       at::TensorOptions(out_meta.scalar_type()));
    kernel(out, host);
  });
}

// The native path for one op: the output geometry an earlier call with
// the same geometry key got (OutputGeometry.h), or else meta first, then
// the CPU's admission (declining if either refuses), then the queued
// kernel. `signature` holds the op's arguments other than tensors and
// scalars; `box` builds the boxed arguments for the generic path.
template <size_t N, typename Meta, typename Kernel, typename Box>
at::Tensor runStructured(NativeOp& native, const char* overload,
                         const std::array<const at::Tensor*, N>& tensors,
                         CallSignature signature,
                         at::ArrayRef<at::Scalar> scalars, Meta meta,
                         Kernel kernel, Box box) {
  if (const std::optional<c10::Device> device = commonDevice<N>(tensors)) {
    GeometryKey key(signature.key());
    for (const at::Tensor* t : tensors) {
      key.tensor(*t);
    }
    for (const at::Scalar& scalar : scalars) {
      key.scalar(scalar);
    }
    const std::optional<OutputGeometry> geometry =
        native.geometries.outputOf(key, [&]() -> std::optional<at::Tensor> {
          std::array<at::Tensor, N> metas;
          for (size_t i = 0; i < N; ++i) {
            metas[i] = metaLike(*tensors[i]);
          }
          std::optional<at::Tensor> meta_out;
          try {
            meta_out = meta(metas);
          } catch (const c10::Error&) {
            return std::nullopt;  // the generic path raises the CPU kernel's own error
          }
          if (!admittedByCpu(native, signature, tensors, scalars, meta, kernel)) {
            return std::nullopt;
          }
          return meta_out;
        });
    if (geometry) {
      native.counter.count();
      return queueKernel<N>(native.counter.op(), *device, tensors, *geometry,
                            std::move(kernel));
    }
  }
  torch::jit::Stack stack = box();
  runGenericBoxed(native.counter.op(), overload, &stack);
  return stack.back().toTensor();
}

using T = at::Tensor;
template <size_t N>
using Metas = std::array<at::Tensor, N>;

// --- matrix products -----------------------------------------------------

NativeOp mm_native("aten::mm");
T mm(const T& self, const T& mat2) {
  return runStructured<2>(
      mm_native, "", {&self, &mat2},
      CallSignature(), {},
      [](const Metas<2>& m) { return at::meta::mm(m[0], m[1]); },
      [](T& out, const Metas<2>& in) { at::cpu::mm_out(out, in[0], in[1]); },
      [&] { return boxArguments(self, mat2); });
}

NativeOp bmm_native("aten::bmm");
T bmm(const T& self, const T& mat2) {
  return runStructured<2>(
      bmm_native, "", {&self, &mat2},
      CallSignature(), {},
      [](const Metas<2>& m) { return at::meta::bmm(m[0], m[1]); },
      [](T& out, const Metas<2>& in) { at::cpu::bmm_out(out, in[0], in[1]); },
      [&] { return boxArguments(self, mat2); });
}

NativeOp addmm_native("aten::addmm");
T addmm(const T& self, const T& mat1, const T& mat2, const at::Scalar& beta,
        const at::Scalar& alpha) {
  return runStructured<3>(
      addmm_native, "", {&self, &mat1, &mat2},
      CallSignature(), {beta, alpha},
      [&](const Metas<3>& m) {
        return at::meta::addmm(m[0], m[1], m[2], beta, alpha);
      },
      [beta, alpha](T& out, const Metas<3>& in) {
        at::cpu::addmm_out(out, in[0], in[1], in[2], beta, alpha);
      },
      [&] { return boxArguments(self, mat1, mat2, beta, alpha); });
}

// --- reductions ----------------------------------------------------------

// The dims to reduce over, owned (the queued kernel outlives the call).
std::optional<c10::SmallVector<int64_t, 4>> ownDims(at::OptionalIntArrayRef dim) {
  if (!dim.has_value()) {
    return std::nullopt;
  }
  return c10::SmallVector<int64_t, 4>(dim->begin(), dim->end());
}

at::OptionalIntArrayRef viewDims(
    const std::optional<c10::SmallVector<int64_t, 4>>& dims) {
  if (!dims) {
    return std::nullopt;
  }
  return at::IntArrayRef(*dims);
}

NativeOp sum_native("aten::sum");
T sum(const T& self, at::OptionalIntArrayRef dim, bool keepdim,
      std::optional<at::ScalarType> dtype) {
  return runStructured<1>(
      sum_native, "dim_IntList", {&self},
      CallSignature().value(dim).value(int64_t{keepdim}).value(dtype), {},
      [&](const Metas<1>& m) { return at::meta::sum(m[0], dim, keepdim, dtype); },
      [dims = ownDims(dim), keepdim, dtype](T& out, const Metas<1>& in) {
        at::cpu::sum_out(out, in[0], viewDims(dims), keepdim, dtype);
      },
      [&] { return boxArguments(self, dim, keepdim, dtype); });
}

NativeOp mean_native("aten::mean");
T mean(const T& self, at::OptionalIntArrayRef dim, bool keepdim,
       std::optional<at::ScalarType> dtype) {
  return runStructured<1>(
      mean_native, "dim", {&self},
      CallSignature().value(dim).value(int64_t{keepdim}).value(dtype), {},
      [&](const Metas<1>& m) { return at::meta::mean(m[0], dim, keepdim, dtype); },
      [dims = ownDims(dim), keepdim, dtype](T& out, const Metas<1>& in) {
        at::cpu::mean_out(out, in[0], viewDims(dims), keepdim, dtype);
      },
      [&] { return boxArguments(self, dim, keepdim, dtype); });
}

// A running sum, and sums into rows picked by an index (the offsets and
// bag sizes of sparse features). An index out of range is data: the
// queued kernel raises it, and it surfaces at the next sync.
NativeOp cumsum_native("aten::cumsum");
T cumsum(const T& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return runStructured<1>(
      cumsum_native, "", {&self},
      CallSignature().value(dim).value(dtype), {},
      [&](const Metas<1>& m) { return at::meta::cumsum(m[0], dim, dtype); },
      [dim, dtype](T& out, const Metas<1>& in) {
        at::cpu::cumsum_out(out, in[0], dim, dtype);
      },
      [&] { return boxArguments(self, dim, dtype); });
}

NativeOp index_add_native("aten::index_add");
T indexAdd(const T& self, int64_t dim, const T& index, const T& source,
           const at::Scalar& alpha) {
  return runStructured<3>(
      index_add_native, "", {&self, &index, &source},
      CallSignature().value(dim), {alpha},
      [&](const Metas<3>& m) {
        return at::meta::index_add(m[0], dim, m[1], m[2], alpha);
      },
      [dim, alpha](T& out, const Metas<3>& in) {
        at::cpu::index_add_out(out, in[0], dim, in[1], in[2], alpha);
      },
      [&] { return boxArguments(self, dim, index, source, alpha); });
}

// --- softmax -------------------------------------------------------------

NativeOp softmax_native("aten::_softmax");
T softmax(const T& self, int64_t dim, bool half_to_float) {
  return runStructured<1>(
      softmax_native, "", {&self},
      CallSignature().value(dim).value(int64_t{half_to_float}), {},
      [&](const Metas<1>& m) { return at::meta::_softmax(m[0], dim, half_to_float); },
      [dim, half_to_float](T& out, const Metas<1>& in) {
        at::cpu::_softmax_out(out, in[0], dim, half_to_float);
      },
      [&] { return boxArguments(self, dim, half_to_float); });
}

NativeOp log_softmax_native("aten::_log_softmax");
T logSoftmax(const T& self, int64_t dim, bool half_to_float) {
  return runStructured<1>(
      log_softmax_native, "", {&self},
      CallSignature().value(dim).value(int64_t{half_to_float}), {},
      [&](const Metas<1>& m) {
        return at::meta::_log_softmax(m[0], dim, half_to_float);
      },
      [dim, half_to_float](T& out, const Metas<1>& in) {
        at::cpu::_log_softmax_out(out, in[0], dim, half_to_float);
      },
      [&] { return boxArguments(self, dim, half_to_float); });
}

NativeOp softmax_backward_native("aten::_softmax_backward_data");
T softmaxBackward(const T& grad_output, const T& output, int64_t dim,
                  at::ScalarType input_dtype) {
  return runStructured<2>(
      softmax_backward_native, "", {&grad_output, &output},
      CallSignature().value(dim).value(std::optional<at::ScalarType>(input_dtype)), {},
      [&](const Metas<2>& m) {
        return at::meta::_softmax_backward_data(m[0], m[1], dim, input_dtype);
      },
      [dim, input_dtype](T& out, const Metas<2>& in) {
        at::cpu::_softmax_backward_data_out(out, in[0], in[1], dim, input_dtype);
      },
      [&] { return boxArguments(grad_output, output, dim, input_dtype); });
}

NativeOp log_softmax_backward_native("aten::_log_softmax_backward_data");
T logSoftmaxBackward(const T& grad_output, const T& output, int64_t dim,
                     at::ScalarType input_dtype) {
  return runStructured<2>(
      log_softmax_backward_native, "", {&grad_output, &output},
      CallSignature().value(dim).value(std::optional<at::ScalarType>(input_dtype)), {},
      [&](const Metas<2>& m) {
        return at::meta::_log_softmax_backward_data(m[0], m[1], dim, input_dtype);
      },
      [dim, input_dtype](T& out, const Metas<2>& in) {
        at::cpu::_log_softmax_backward_data_out(out, in[0], in[1], dim,
                                                input_dtype);
      },
      [&] { return boxArguments(grad_output, output, dim, input_dtype); });
}

// --- activations and their backwards ------------------------------------

NativeOp sigmoid_native("aten::sigmoid");
T sigmoid(const T& self) {
  return runStructured<1>(
      sigmoid_native, "", {&self},
      CallSignature(), {},
      [](const Metas<1>& m) { return at::meta::sigmoid(m[0]); },
      [](T& out, const Metas<1>& in) { at::cpu::sigmoid_out(out, in[0]); },
      [&] { return boxArguments(self); });
}

NativeOp tanh_native("aten::tanh");
T tanh(const T& self) {
  return runStructured<1>(
      tanh_native, "", {&self},
      CallSignature(), {},
      [](const Metas<1>& m) { return at::meta::tanh(m[0]); },
      [](T& out, const Metas<1>& in) { at::cpu::tanh_out(out, in[0]); },
      [&] { return boxArguments(self); });
}

NativeOp gelu_native("aten::gelu");
T gelu(const T& self, c10::string_view approximate) {
  return runStructured<1>(
      gelu_native, "", {&self},
      CallSignature().value(approximate), {},
      [&](const Metas<1>& m) {
        // The meta function leaves `approximate` to the kernel: check it
        // here, so that a bad one is refused at the call.
        at::native::get_gelutype_enum(approximate);
        return at::meta::gelu(m[0], approximate);
      },
      [approximate = std::string(approximate)](T& out, const Metas<1>& in) {
        at::cpu::gelu_out(out, in[0], approximate);
      },
      [&] { return boxArguments(self, approximate); });
}

NativeOp threshold_backward_native("aten::threshold_backward");
T thresholdBackward(const T& grad_output, const T& self,
                    const at::Scalar& threshold) {
  return runStructured<2>(
      threshold_backward_native, "", {&grad_output, &self},
      CallSignature(), {threshold},
      [&](const Metas<2>& m) {
        return at::meta::threshold_backward(m[0], m[1], threshold);
      },
      [threshold](T& out, const Metas<2>& in) {
        at::cpu::threshold_backward_out(out, in[0], in[1], threshold);
      },
      [&] { return boxArguments(grad_output, self, threshold); });
}

NativeOp sigmoid_backward_native("aten::sigmoid_backward");
T sigmoidBackward(const T& grad_output, const T& output) {
  return runStructured<2>(
      sigmoid_backward_native, "", {&grad_output, &output},
      CallSignature(), {},
      [](const Metas<2>& m) { return at::meta::sigmoid_backward(m[0], m[1]); },
      [](T& out, const Metas<2>& in) {
        at::cpu::sigmoid_backward_out(out, in[0], in[1]);
      },
      [&] { return boxArguments(grad_output, output); });
}

NativeOp tanh_backward_native("aten::tanh_backward");
T tanhBackward(const T& grad_output, const T& output) {
  return runStructured<2>(
      tanh_backward_native, "", {&grad_output, &output},
      CallSignature(), {},
      [](const Metas<2>& m) { return at::meta::tanh_backward(m[0], m[1]); },
      [](T& out, const Metas<2>& in) {
        at::cpu::tanh_backward_out(out, in[0], in[1]);
      },
      [&] { return boxArguments(grad_output, output); });
}

NativeOp gelu_backward_native("aten::gelu_backward");
T geluBackward(const T& grad_output, const T& self, c10::string_view approximate) {
  return runStructured<2>(
      gelu_backward_native, "", {&grad_output, &self},
      CallSignature().value(approximate), {},
      [&](const Metas<2>& m) {
        at::native::get_gelutype_enum(approximate);  // as in gelu above
        return at::meta::gelu_backward(m[0], m[1], approximate);
      },
      [approximate = std::string(approximate)](T& out, const Metas<2>& in) {
        at::cpu::gelu_backward_out(out, in[0], in[1], approximate);
      },
      [&] { return boxArguments(grad_output, self, approximate); });
}

// --- pointwise math and comparisons --------------------------------------
// The small ops of optimizer and line-search code (LBFGS: a negated
// gradient, reciprocals, squares, and comparisons read back as bools).

NativeOp neg_native("aten::neg");
T neg(const T& self) {
  return runStructured<1>(
      neg_native, "", {&self},
      CallSignature(), {},
      [](const Metas<1>& m) { return at::meta::neg(m[0]); },
      [](T& out, const Metas<1>& in) { at::cpu::neg_out(out, in[0]); },
      [&] { return boxArguments(self); });
}

NativeOp reciprocal_native("aten::reciprocal");
T reciprocal(const T& self) {
  return runStructured<1>(
      reciprocal_native, "", {&self},
      CallSignature(), {},
      [](const Metas<1>& m) { return at::meta::reciprocal(m[0]); },
      [](T& out, const Metas<1>& in) { at::cpu::reciprocal_out(out, in[0]); },
      [&] { return boxArguments(self); });
}

NativeOp pow_native("aten::pow");
T powScalar(const T& self, const at::Scalar& exponent) {
  return runStructured<1>(
      pow_native, "Tensor_Scalar", {&self},
      CallSignature(), {exponent},
      [&](const Metas<1>& m) { return at::meta::pow(m[0], exponent); },
      [exponent](T& out, const Metas<1>& in) {
        at::cpu::pow_out(out, in[0], exponent);
      },
      [&] { return boxArguments(self, exponent); });
}

// dot and max() have no meta function: their 0-dim output is made here,
// after the checks the CPU makes at the call (any failing one declines,
// and the generic path raises the CPU's own message).
NativeOp dot_native("aten::dot");
T dot(const T& self, const T& other) {
  return runStructured<2>(
      dot_native, "", {&self, &other},
      CallSignature(), {},
      [](const Metas<2>& m) {
        TORCH_CHECK(m[0].dim() == 1 && m[1].dim() == 1 &&
                    m[0].scalar_type() == m[1].scalar_type() &&
                    m[0].numel() == m[1].numel());
        return at::empty({}, m[0].options());
      },
      [](T& out, const Metas<2>& in) { out.copy_(at::cpu::dot(in[0], in[1])); },
      [&] { return boxArguments(self, other); });
}

NativeOp max_native("aten::max");
T maxAll(const T& self) {
  return runStructured<1>(
      max_native, "", {&self},
      CallSignature(), {},
      [](const Metas<1>& m) {
        TORCH_CHECK(m[0].numel() > 0);
        return at::empty({}, m[0].options());
      },
      [](T& out, const Metas<1>& in) { at::cpu::max_out(out, in[0]); },
      [&] { return boxArguments(self); });
}

// eq, ne, lt, le, gt, ge: a Tensor and a Scalar overload each, with their
// own admissions (the signatures differ in kind, not only in dtypes).
#define PHANTOM_NATIVE_COMPARISON(op)                                        \
  NativeOp op##_tensor_native("aten::" #op);                                \
  T op##Tensor(const T& self, const T& other) {                              \
    return runStructured<2>(                                                 \
        op##_tensor_native, "Tensor", {&self, &other}, CallSignature(), {},  \
        [](const Metas<2>& m) { return at::meta::op(m[0], m[1]); },          \
        [](T& out, const Metas<2>& in) {                                     \
          at::cpu::op##_out(out, in[0], in[1]);                              \
        },                                                                   \
        [&] { return boxArguments(self, other); });                          \
  }                                                                          \
  NativeOp op##_scalar_native("aten::" #op);                                \
  T op##Scalar(const T& self, const at::Scalar& other) {                     \
    return runStructured<1>(                                                 \
        op##_scalar_native, "Scalar", {&self}, CallSignature(), {other},     \
        [&](const Metas<1>& m) { return at::meta::op(m[0], other); },        \
        [other](T& out, const Metas<1>& in) {                                \
          at::cpu::op##_out(out, in[0], other);                              \
        },                                                                   \
        [&] { return boxArguments(self, other); });                          \
  }

PHANTOM_NATIVE_COMPARISON(eq)
PHANTOM_NATIVE_COMPARISON(ne)
PHANTOM_NATIVE_COMPARISON(lt)
PHANTOM_NATIVE_COMPARISON(le)
PHANTOM_NATIVE_COMPARISON(gt)
PHANTOM_NATIVE_COMPARISON(ge)
#undef PHANTOM_NATIVE_COMPARISON

// --- concatenation (a list of inputs) -------------------------------------

NativeOp cat_native("aten::cat");

// Whether the CPU's cat accepts inputs of these dtypes and dimensions.
bool catAdmittedByCpu(const std::vector<at::Tensor>& inputs, int64_t dim) {
  CallSignature signature;
  for (const at::Tensor& t : inputs) {
    signature.tensor(t);
  }
  signature.value(dim);
  return cat_native.admission.admits(signature, [&] {
    std::vector<at::Tensor> host;
    std::vector<at::Tensor> metas;
    for (const at::Tensor& t : inputs) {
      host.push_back(probeTensor(t));
      metas.push_back(metaLike(host.back()));
    }
    const at::Tensor out_meta = at::meta::cat(metas, dim);
    at::Tensor out = at::empty_strided(out_meta.sizes(), out_meta.strides(),
                                       at::TensorOptions(out_meta.scalar_type()));
    at::cpu::cat_out(out, host, dim);
  });
}

T cat(const at::ITensorListRef& tensors, int64_t dim) {
  std::vector<at::Tensor> inputs;
  std::optional<c10::Device> device;
  bool ours = true;
  for (const at::Tensor& t : tensors) {
    inputs.push_back(t);
    if (!isPlainPhantom(t) || (device && t.device() != *device)) {
      ours = false;
      continue;
    }
    device = t.device();
  }
  std::optional<OutputGeometry> geometry;
  if (ours && device) {
    GeometryKey key(CallSignature().value(dim).key());
    for (const at::Tensor& t : inputs) {
      key.tensor(t);
    }
    geometry = cat_native.geometries.outputOf(key, [&]() -> std::optional<at::Tensor> {
      std::vector<at::Tensor> metas;
      metas.reserve(inputs.size());
      for (const at::Tensor& t : inputs) {
        metas.push_back(metaLike(t));
      }
      std::optional<at::Tensor> meta_out;
      try {
        meta_out = at::meta::cat(metas, dim);
      } catch (const c10::Error&) {
        return std::nullopt;  // the generic path raises the CPU kernel's own error
      }
      if (!catAdmittedByCpu(inputs, dim)) {
        return std::nullopt;
      }
      return meta_out;
    });
  }
  if (!geometry) {
    torch::jit::Stack stack = boxArguments(c10::List<at::Tensor>(inputs), dim);
    runGenericBoxed("aten::cat", "", &stack);
    return stack.back().toTensor();
  }
  cat_native.counter.count();
  const c10::DeviceGuard guard(*device);
  at::Tensor out = emptyOnCurrentDevice(geometry->sizes, geometry->strides, geometry->dtype);
  std::vector<DeviceTensorRef> refs;
  refs.reserve(inputs.size());
  for (const at::Tensor& t : inputs) {
    refs.emplace_back(t);
  }
  launchAsync(getCurrentPhantomStream(device->index()), cat_native.counter.op(),
              [out_ref = DeviceTensorRef(out), refs = std::move(refs), dim] {
                PooledAliases aliases;
                std::vector<at::Tensor> in;
                in.reserve(refs.size());
                for (const DeviceTensorRef& ref : refs) {
                  in.push_back(aliases.alias(ref));
                }
                at::Tensor result = aliases.alias(out_ref);
                at::cpu::cat_out(result, in, dim);
              });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("cat", TORCH_FN(cat));
  m.impl("mm", TORCH_FN(mm));
  m.impl("bmm", TORCH_FN(bmm));
  m.impl("addmm", TORCH_FN(addmm));
  m.impl("sum.dim_IntList", TORCH_FN(sum));
  m.impl("mean.dim", TORCH_FN(mean));
  m.impl("cumsum", TORCH_FN(cumsum));
  m.impl("index_add", TORCH_FN(indexAdd));
  m.impl("_softmax", TORCH_FN(softmax));
  m.impl("_log_softmax", TORCH_FN(logSoftmax));
  m.impl("_softmax_backward_data", TORCH_FN(softmaxBackward));
  m.impl("_log_softmax_backward_data", TORCH_FN(logSoftmaxBackward));
  m.impl("sigmoid", TORCH_FN(sigmoid));
  m.impl("tanh", TORCH_FN(tanh));
  m.impl("gelu", TORCH_FN(gelu));
  m.impl("threshold_backward", TORCH_FN(thresholdBackward));
  m.impl("sigmoid_backward", TORCH_FN(sigmoidBackward));
  m.impl("tanh_backward", TORCH_FN(tanhBackward));
  m.impl("gelu_backward", TORCH_FN(geluBackward));
  m.impl("neg", TORCH_FN(neg));
  m.impl("reciprocal", TORCH_FN(reciprocal));
  m.impl("pow.Tensor_Scalar", TORCH_FN(powScalar));
  m.impl("dot", TORCH_FN(dot));
  m.impl("max", TORCH_FN(maxAll));
  m.impl("eq.Tensor", TORCH_FN(eqTensor));
  m.impl("eq.Scalar", TORCH_FN(eqScalar));
  m.impl("ne.Tensor", TORCH_FN(neTensor));
  m.impl("ne.Scalar", TORCH_FN(neScalar));
  m.impl("lt.Tensor", TORCH_FN(ltTensor));
  m.impl("lt.Scalar", TORCH_FN(ltScalar));
  m.impl("le.Tensor", TORCH_FN(leTensor));
  m.impl("le.Scalar", TORCH_FN(leScalar));
  m.impl("gt.Tensor", TORCH_FN(gtTensor));
  m.impl("gt.Scalar", TORCH_FN(gtScalar));
  m.impl("ge.Tensor", TORCH_FN(geTensor));
  m.impl("ge.Scalar", TORCH_FN(geScalar));
}

}  // namespace phantom
