// Native kernels for EmbeddingBag (forward and backward) and log_sigmoid:
// the sparse-feature ops of a DLRM step.
//
// Through the generic path these cost the host several times the CPU's
// own time per call (the remembered-signature lookup, boxing, and for the
// backward the device-generic composite, which runs index_add_, a sub_
// and a cumsum on the device to rebuild offset2bag before the dense
// backward: four queued ops per bag). Here each is one queued op, as the
// native ops in Structured.cpp are:
//   1. the call's arguments are checked on the host as the CPU checks
//      them (dtypes, dimensions, per_sample_weights against mode and
//      indices); anything unusual (another device, a sparse layout, conj
//      bits, indices and offsets of different dtypes, 2-D indices, a
//      sparse gradient) is declined and takes the generic path, which
//      raises the CPU's error at the call or runs the CPU kernel;
//   2. the outputs are allocated on the device with the shapes the CPU
//      kernel gives them. For _embedding_bag those depend on the path the
//      CPU kernel takes, decided from dtypes, strides and padding_idx
//      only (ATen's EmbeddingBag.cpp): offset2bag is empty on the sum
//      fast path (float, half or bfloat16 weights with unit row stride,
//      unit-stride per_sample_weights, no padding_idx), else one per
//      index; bag_size has one entry per bag when the op records for
//      backward or the mode is mean or max, else one per offset;
//      max_indices is (bags, dim) for max, else bag_size's shape;
//   3. the CPU implementation (at::cpu::<op>) is queued over the CPU
//      aliases of the device tensors, and its results are copied into the
//      outputs. A large output's memory is lent to the kernel's allocation
//      of its size (phantom/KernelHostMemory.h), so the embedding sums are
//      computed in place and not copied. Small calls run on one OpenMP
//      thread, as the generic path runs them (phantom/KernelThreads.h).
// The results are the CPU kernel's own, bit for bit. Data-dependent errors
// (an index out of range, offsets[0] != 0) are raised by the queued kernel
// and surface at the next synchronisation, as the generic path surfaces
// them once it queues a signature.
#include <phantom/KernelAliases.h>
#include <phantom/KernelHostMemory.h>
#include <phantom/KernelThreads.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/ops/OutputGeometry.h>

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_embedding_bag_backward_cpu_dispatch.h>
#include <ATen/ops/_embedding_bag_backward_native.h>
#include <ATen/ops/_embedding_bag_cpu_dispatch.h>
#include <ATen/ops/_embedding_bag_forward_only_cpu_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/log_sigmoid_forward_cpu_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

namespace phantom {
namespace {

using T = at::Tensor;
using Bag = std::tuple<T, T, T, T>;

bool isFloating(const T& t) {
  const at::ScalarType s = t.scalar_type();
  return s == at::kFloat || s == at::kDouble || s == at::kHalf || s == at::kBFloat16;
}

bool isIndex(const T& t) {
  return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt;
}

// Whether every defined tensor of `tensors` is a plain phantom tensor on
// `device` (the first one's).
bool allOnOneDevice(std::initializer_list<const T*> tensors, c10::Device* device) {
  bool first = true;
  for (const T* t : tensors) {
    if (!t->defined()) continue;
    if (!isPlainPhantom(*t)) return false;
    if (first) {
      *device = t->device();
      first = false;
    } else if (t->device() != *device) {
      return false;
    }
  }
  return !first;
}

// Copies the CPU kernel's `result` into `out` (a CPU alias of a device
// output), unless the kernel computed it there (lent memory).
void deliver(const T& result, T& out) {
  if (result.is_same(out)) return;  // written by an out= kernel
  if (out.numel() == 0 || computedIn(result, out)) {
    if (out.numel() > 0) noteResultInPlace();
    return;
  }
  if (result.is_contiguous() && out.is_contiguous() &&
      result.scalar_type() == out.scalar_type() && result.sizes() == out.sizes()) {
    std::memcpy(out.data_ptr(), result.const_data_ptr(), out.nbytes());
  } else {
    out.copy_(result);
  }
}

// Queues `kernel(cpu aliases of inputs, cpu aliases of outputs)` on the
// current stream of `device`; the kernel returns the CPU results, one per
// output (an output itself when it wrote there), which are delivered into
// the outputs. outputs[0]'s memory is
// lent to the kernel when it is large. Undefined inputs are passed as
// undefined tensors.
template <size_t Outs, size_t Ins, typename Kernel>
void queueWithOutputs(const char* name, c10::Device device,
                      const std::array<T, Outs>& outputs,
                      const std::array<const T*, Ins>& inputs, bool one_thread,
                      Kernel kernel) {
  c10::SmallVector<DeviceTensorRef, Outs + Ins> refs;
  std::array<bool, Ins> present{};
  for (const T& out : outputs) refs.emplace_back(out);
  for (size_t i = 0; i < Ins; ++i) {
    present[i] = inputs[i]->defined();
    if (present[i]) refs.emplace_back(*inputs[i]);
  }
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  launchAsync(stream, name,
              [name, refs = std::move(refs), present, one_thread,
               kernel = std::move(kernel), aliases = NodeAliases::forStream(stream)] {
    c10::SmallVector<const DeviceTensorRef*, Outs + Ins> pointers;
    for (const DeviceTensorRef& ref : refs) pointers.push_back(&ref);
    aliases.run(pointers, [&](c10::ArrayRef<at::Tensor> cpu) {
      std::array<T, Outs> outs;
      for (size_t i = 0; i < Outs; ++i) outs[i] = cpu[i];
      std::array<T, Ins> in;
      size_t next = Outs;
      for (size_t i = 0; i < Ins; ++i) {
        if (present[i]) in[i] = cpu[next++];
      }
      LendingScope lending;
      if (outs[0].numel() > 0 && outs[0].is_contiguous()) {
        lending.offer(outs[0].data_ptr(), outs[0].nbytes());
      }
      {
        std::array<T, Outs> results;
        {
          const OneThreadScope threads(one_thread);
          // As the CPU's autograd kernel calls the CPU kernel.
          const at::AutoDispatchBelowADInplaceOrView below_autograd;
          results = kernel(in, outs);
        }
        lending.close();
        // Only outs[0] is lent, and a kernel may have put another result
        // in it (an allocation of that size made before its own): the
        // others are delivered first, out of that memory, before outs[0]
        // is written.
        for (size_t i = Outs; i-- > 0;) deliver(results[i], outs[i]);
      }
      lending.requireNothingKept(name);
    });
  });
}

// --- _embedding_bag, _embedding_bag_forward_only ---------------------------

constexpr int64_t kSum = 0;
constexpr int64_t kMean = 1;
constexpr int64_t kMax = 2;

NativeOpCounter bag_counter("aten::_embedding_bag");
NativeOpCounter bag_forward_only_counter("aten::_embedding_bag_forward_only");

// The checks of the CPU's _embedding_bag_cpu_impl and check_arguments that
// need no data; false declines the call.
bool bagArgumentsAccepted(const T& weight, const T& indices, const T& offsets,
                          int64_t mode, const T& per_sample_weights,
                          bool include_last_offset) {
  if (weight.dim() != 2 || !isFloating(weight)) return false;
  if (indices.dim() != 1 || offsets.dim() != 1) return false;
  if (!isIndex(indices) || indices.scalar_type() != offsets.scalar_type()) return false;
  if (mode != kSum && mode != kMean && mode != kMax) return false;
  if (per_sample_weights.defined()) {
    if (mode != kSum || per_sample_weights.scalar_type() != weight.scalar_type() ||
        per_sample_weights.dim() != 1 ||
        per_sample_weights.numel() != indices.numel()) {
      return false;
    }
  }
  if (include_last_offset && offsets.size(0) < 1) return false;
  return true;
}

Bag embeddingBag(bool forward_only, const T& weight, const T& indices,
                 const T& offsets, bool scale_grad_by_freq, int64_t mode,
                 bool sparse, const std::optional<T>& per_sample_weights_opt,
                 bool include_last_offset, int64_t padding_idx) {
  const T per_sample_weights = per_sample_weights_opt.value_or(T());
  NativeOpCounter& counter = forward_only ? bag_forward_only_counter : bag_counter;
  c10::Device device(c10::DeviceType::PrivateUse1);
  if (!allOnOneDevice({&weight, &indices, &offsets, &per_sample_weights}, &device) ||
      !bagArgumentsAccepted(weight, indices, offsets, mode, per_sample_weights,
                            include_last_offset)) {
    torch::jit::Stack stack = boxArguments(
        weight, indices, offsets, scale_grad_by_freq, mode, sparse,
        per_sample_weights_opt, include_last_offset, padding_idx);
    runGenericBoxed(counter.op(), "", &stack);
    return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor(),
            stack[3].toTensor()};
  }
  counter.count();
  const c10::DeviceGuard guard(device);
  const int64_t bags = offsets.size(0) - (include_last_offset ? 1 : 0);
  const int64_t dim = weight.size(1);
  const at::ScalarType index_type = indices.scalar_type();
  // The output is (bags, dim), contiguous: its row stride is 1.
  const bool fast_path_sum =
      weight.scalar_type() != at::kDouble && weight.stride(1) == 1 &&
      (!per_sample_weights.defined() || per_sample_weights.stride(0) == 1) &&
      padding_idx < 0;
  const bool per_bag = !forward_only || mode == kMean || mode == kMax;
  std::array<T, 4> outs = {
      emptyOnCurrentDevice({bags, dim}, weight.scalar_type()),
      emptyOnCurrentDevice({(mode == kSum && fast_path_sum) ? 0 : indices.size(0)},
                           index_type),
      emptyOnCurrentDevice({per_bag ? bags : offsets.size(0)}, index_type),
      T()};
  outs[3] = mode == kMax ? emptyOnCurrentDevice({bags, dim}, index_type)
                         : emptyOnCurrentDevice(outs[2].sizes(), index_type);
  const bool one_thread = indices.numel() * dim < at::internal::GRAIN_SIZE;
  queueWithOutputs<4, 4>(
      counter.op(), device, outs, {&weight, &indices, &offsets, &per_sample_weights},
      one_thread,
      [forward_only, scale_grad_by_freq, mode, sparse, include_last_offset,
       padding_idx](const std::array<T, 4>& in, std::array<T, 4>&) -> std::array<T, 4> {
        const std::optional<T> weights =
            in[3].defined() ? std::optional<T>(in[3]) : std::nullopt;
        Bag r = forward_only
                    ? at::cpu::_embedding_bag_forward_only(
                          in[0], in[1], in[2], scale_grad_by_freq, mode, sparse,
                          weights, include_last_offset, padding_idx)
                    : at::cpu::_embedding_bag(in[0], in[1], in[2], scale_grad_by_freq,
                                              mode, sparse, weights,
                                              include_last_offset, padding_idx);
        return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
      });
  return {outs[0], outs[1], outs[2], outs[3]};
}

// One registered kernel per op: _embedding_bag records for backward,
// _embedding_bag_forward_only does not.
template <bool kForwardOnly>
Bag embeddingBagOp(const T& weight, const T& indices, const T& offsets,
                   bool scale_grad_by_freq, int64_t mode, bool sparse,
                   const std::optional<T>& per_sample_weights,
                   bool include_last_offset, int64_t padding_idx) {
  return embeddingBag(kForwardOnly, weight, indices, offsets, scale_grad_by_freq,
                      mode, sparse, per_sample_weights, include_last_offset,
                      padding_idx);
}

// --- _embedding_bag_backward ---------------------------------------------
// The CPU's kernel computes the dense gradient (num_weights, dim) in one
// call, offset2bag included. A sparse gradient, and whatever is declined,
// takes ATen's device-generic kernel, as on CUDA: dense ops and
// _sparse_coo_tensor_unsafe, each on its own path.

NativeOpCounter bag_backward_counter("aten::_embedding_bag_backward");

T embeddingBagBackward(const T& grad, const T& indices, const T& offsets,
                       const T& offset2bag, const T& bag_size,
                       const T& maximum_indices, c10::SymInt num_weights_sym,
                       bool scale_grad_by_freq, int64_t mode, bool sparse,
                       const std::optional<T>& per_sample_weights_opt,
                       int64_t padding_idx) {
  const T per_sample_weights = per_sample_weights_opt.value_or(T());
  c10::Device device(c10::DeviceType::PrivateUse1);
  const std::optional<int64_t> num_weights = num_weights_sym.maybe_as_int();
  const at::ScalarType index_type = indices.scalar_type();
  const bool accepted =
      !sparse && num_weights && *num_weights >= 0 &&
      allOnOneDevice({&grad, &indices, &offsets, &offset2bag, &bag_size,
                      &maximum_indices, &per_sample_weights},
                     &device) &&
      grad.defined() && indices.defined() && offsets.defined() &&
      offset2bag.defined() && bag_size.defined() && maximum_indices.defined() &&
      grad.dim() == 2 && isFloating(grad) && indices.dim() == 1 &&
      offsets.dim() == 1 && isIndex(indices) &&
      offsets.scalar_type() == index_type && offset2bag.scalar_type() == index_type &&
      bag_size.scalar_type() == index_type &&
      maximum_indices.scalar_type() == index_type &&
      (mode == kSum || mode == kMean || mode == kMax) &&
      (!per_sample_weights.defined() ||
       (mode == kSum && per_sample_weights.scalar_type() == grad.scalar_type() &&
        per_sample_weights.dim() == 1 &&
        per_sample_weights.numel() == indices.numel()));
  if (!accepted) {
    c10::OptionalDeviceGuard guard;
    if (isPhantom(grad)) guard.reset_device(grad.device());
    return at::native::_embedding_bag_backward_symint(
        grad, indices, offsets, offset2bag, bag_size, maximum_indices,
        std::move(num_weights_sym), scale_grad_by_freq, mode, sparse,
        per_sample_weights_opt, padding_idx);
  }
  bag_backward_counter.count();
  const c10::DeviceGuard guard(device);
  std::array<T, 1> outs = {emptyOnCurrentDevice({*num_weights, grad.size(1)},
                                   grad.scalar_type())};
  queueWithOutputs<1, 7>(
      bag_backward_counter.op(), device, outs,
      {&grad, &indices, &offsets, &offset2bag, &bag_size, &maximum_indices,
       &per_sample_weights},
      /*one_thread=*/false,
      [num_weights = *num_weights, scale_grad_by_freq, mode,
       padding_idx](const std::array<T, 7>& in, std::array<T, 1>&) -> std::array<T, 1> {
        const std::optional<T> weights =
            in[6].defined() ? std::optional<T>(in[6]) : std::nullopt;
        return {at::cpu::_embedding_bag_backward(
            in[0], in[1], in[2], in[3], in[4], in[5], num_weights,
            scale_grad_by_freq, mode, /*sparse=*/false, weights, padding_idx)};
      });
  return outs[0];
}

// --- log_sigmoid_forward -------------------------------------------------
// The CPU's kernel returns (output, buffer), both contiguous with the
// input's shape and dtype; its out= form, queued here, computes contiguous
// outputs in place with the same stub.

NativeOpCounter log_sigmoid_counter("aten::log_sigmoid_forward");

std::tuple<T, T> logSigmoidForward(const T& self) {
  c10::Device device(c10::DeviceType::PrivateUse1);
  if (!allOnOneDevice({&self}, &device) || !isFloating(self)) {
    torch::jit::Stack stack = boxArguments(self);
    runGenericBoxed(log_sigmoid_counter.op(), "", &stack);
    return {stack[0].toTensor(), stack[1].toTensor()};
  }
  log_sigmoid_counter.count();
  const c10::DeviceGuard guard(device);
  std::array<T, 2> outs = {emptyOnCurrentDevice(self.sizes(), self.scalar_type()),
                           emptyOnCurrentDevice(self.sizes(), self.scalar_type())};
  // Elementwise: the same bits on any number of threads (KernelThreads.h).
  const bool one_thread = self.numel() < at::internal::GRAIN_SIZE;
  queueWithOutputs<2, 1>(
      log_sigmoid_counter.op(), device, outs, {&self}, one_thread,
      [](const std::array<T, 1>& in, std::array<T, 2>& out) -> std::array<T, 2> {
        at::cpu::log_sigmoid_forward_out(out[0], out[1], in[0]);
        return out;
      });
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_embedding_bag", TORCH_FN(embeddingBagOp<false>));
  m.impl("_embedding_bag_forward_only", TORCH_FN(embeddingBagOp<true>));
  m.impl("_embedding_bag_backward", TORCH_FN(embeddingBagBackward));
  m.impl("log_sigmoid_forward", TORCH_FN(logSigmoidForward));
}

}  // namespace phantom
