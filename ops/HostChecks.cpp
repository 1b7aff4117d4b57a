// Argument checks the generic path cannot leave to a Meta kernel.
//
// The asynchronous half (AsyncFallback.cpp) raises an argument error at
// the call only if something on the host sees it: the Meta kernel, or the
// trial run of the CPU kernel that ops with a Python Meta kernel get once
// per call signature. Two kinds of call slip through, and the error then
// reaches the user at the next sync as a device error, after which work
// queued behind it was lost:
//
//   - ops whose C++ Meta kernel checks nothing the CPU kernel checks:
//     `_index_put_impl_` (what `x[i] = v`, `index_put_` and `index_put`
//     run) returns `self` for any indices and value, and `put_` does not
//     compare the index's and the source's sizes. They are given the
//     trial run too (metaKernelFallsShort). Checks that need the index
//     values (out of range) still fail on the device, as on CUDA.
//     (`index_reduce.out` is there for a warning: its CPU kernel warns
//     that the op is in beta in its body, which its Meta kernel does not
//     run; see KernelWarnings.cpp.)
//   - an index_put with a boolean (or uint8) mask: the indexed shape is
//     the mask's count of True, so whether `value` broadcasts to it is a
//     question about the data. CUDA answers it on the host after a sync
//     (its kernel runs `nonzero` on the mask, which copies the count to
//     the host); phantom does the same by taking the synchronous half
//     (checksNeedTheData). A one-element value fits any count, so
//     `x[mask] = 0.0` (whose value Python makes a phantom scalar tensor;
//     CUDA's a CPU one, which its kernel turns into a masked_fill) needs
//     no sync and is queued.
#include <phantom/ops/HostChecks.h>

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>

namespace phantom {
namespace {

bool isMask(const at::Tensor& t) {
  return t.defined() &&
         (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte);
}

bool isIndexPut(const c10::OperatorHandle& op) {
  return op.schema().name() == "aten::_index_put_impl_";
}

// True when ATen tags `op`, or the functional overload of an out=
// overload (ATen tags `_unique2` but not `_unique2.out`), as having
// outputs whose shapes depend on the data.
bool taggedDataDependent(const c10::OperatorHandle& op) {
  const auto tagged = [](const c10::OperatorHandle& handle) {
    return handle.hasTag(at::Tag::dynamic_output_shape) ||
           handle.hasTag(at::Tag::data_dependent_output);
  };
  if (tagged(op)) return true;
  const c10::FunctionSchema& schema = op.schema();
  const bool out = std::any_of(schema.arguments().begin(), schema.arguments().end(),
                               [](const c10::Argument& a) { return a.is_out(); });
  if (!out) return false;
  std::string functional = schema.overload_name();  // out, Tensor_out, output
  for (const char* suffix : {"_out", "out", "_output", "output"}) {
    const size_t n = std::strlen(suffix);
    if (functional.size() >= n &&
        functional.compare(functional.size() - n, n, suffix) == 0) {
      functional.resize(functional.size() - n);
      break;
    }
  }
  for (const std::string& overload : {functional, std::string()}) {
    const std::optional<c10::OperatorHandle> handle =
        c10::Dispatcher::singleton().findOp({schema.name(), overload});
    if (handle && handle->hasSchema() && tagged(*handle)) return true;
  }
  return false;
}

bool isIntegral(const at::Tensor& t) {
  return t.defined() && c10::isIntegralType(t.scalar_type(), /*includeBool=*/true);
}

// True when a tensor the op reads (not an out= argument, which it only
// writes) holds integers or booleans, on the device or the host.
bool readsIntegerTensor(const c10::FunctionSchema& schema,
                        c10::ArrayRef<c10::IValue> args) {
  for (size_t i = 0; i < args.size() && i < schema.arguments().size(); ++i) {
    if (schema.arguments()[i].is_out()) continue;
    const c10::IValue& arg = args[i];
    if (arg.isTensor() && isIntegral(arg.toTensor())) return true;
    if (arg.isTensorList()) {
      for (const at::Tensor& t : arg.toTensorList()) {
        if (isIntegral(t)) return true;
      }
    }
    if (arg.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
        if (t.has_value() && isIntegral(*t)) return true;
      }
    }
  }
  return false;
}

// Ops (every overload) whose outputs' shapes follow from their arguments'
// shapes and non-tensor arguments whatever the values of their integer
// and boolean tensors: those are indices, targets, masks, lengths and
// offsets counted by their shapes, or data reduced, sorted or copied.
// Read from each op's definition in torch 2.13; an op that is not here
// (`_padded_dense_to_jagged_forward`, whose row count is its offsets'
// last value, is not tagged) has its Meta kernel decide. So does the
// forward `_embedding_bag`, whose CPU kernel picks among several paths
// (one leaves offset2bag empty) in ways not audited here.
bool integerValuesCannotShapeOutputsByName(const std::string& name) {
  static const std::unordered_set<std::string> kNames = {
      // class targets
      "aten::nll_loss_forward", "aten::nll_loss_backward",
      "aten::nll_loss2d_forward", "aten::nll_loss2d_backward",
      "aten::multi_margin_loss", "aten::multi_margin_loss_backward",
      "aten::multilabel_margin_loss_forward", "aten::multilabel_margin_loss_backward",
      // indices: outputs are shaped like self, the index or the source
      "aten::gather", "aten::scatter", "aten::scatter_add", "aten::scatter_reduce",
      "aten::index_select", "aten::index_add", "aten::index_copy", "aten::index_fill",
      "aten::index_reduce", "aten::take", "aten::put", "aten::index_put",
      "aten::_index_put_impl_", "aten::searchsorted", "aten::bucketize",
      "aten::embedding_dense_backward", "aten::_embedding_bag_backward",
      "aten::_embedding_bag_dense_backward",
      "aten::_embedding_bag_per_sample_weights_backward",
      "aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward",
      "aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool3d_backward",
      "aten::fractional_max_pool2d_backward", "aten::fractional_max_pool3d_backward",
      "aten::max_unpool2d", "aten::max_unpool3d",
      // lengths and offsets: one output segment per length or offset pair
      "aten::segment_reduce", "aten::_segment_reduce_backward",
      // masks
      "aten::masked_fill", "aten::masked_scatter", "aten::_masked_softmax",
      "aten::_masked_softmax_backward", "aten::where",
      "aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
      // integer data reduced, sorted or copied
      "aten::sum", "aten::prod", "aten::all", "aten::any", "aten::amax", "aten::amin",
      "aten::aminmax", "aten::argmax", "aten::argmin", "aten::cumsum", "aten::cumprod",
      "aten::sort", "aten::topk", "aten::cat", "aten::roll", "aten::tril", "aten::triu",
      "aten::narrow_copy", "aten::count_nonzero", "aten::trace",
  };
  return kNames.count(name) > 0;
}

}  // namespace

bool integerValuesCannotShapeOutputs(const c10::OperatorHandle& op) {
  // An in-place op returns its own arguments, whose shapes it keeps; an
  // elementwise op's outputs broadcast from its inputs' shapes.
  if (op.hasTag(at::Tag::inplace) || elementwise(op)) return true;
  std::string name = op.schema().name();
  if (integerValuesCannotShapeOutputsByName(name)) return true;
  if (!name.empty() && name.back() == '_') {  // scatter_, masked_fill_, ...
    name.pop_back();
    return integerValuesCannotShapeOutputsByName(name);
  }
  return false;
}

bool elementwise(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::pointwise)) return true;
  const c10::OperatorName& name = op.schema().operator_name();
  // Elementwise ops ATen does not tag: `a // b`, `1 - a`, ...
  static const std::unordered_set<std::string> kUntagged = {
      "aten::floor_divide", "aten::floor_divide_", "aten::rsub",
      "aten::_add_relu", "aten::_add_relu_"};
  if (kUntagged.count(name.name) > 0) return true;
  // An in-place variant (`ne_`) whose functional overload is tagged.
  if (name.name.size() > 1 && name.name.back() == '_' && op.hasTag(at::Tag::inplace)) {
    const std::optional<c10::OperatorHandle> functional =
        c10::Dispatcher::singleton().findOp(
            {name.name.substr(0, name.name.size() - 1), name.overload_name});
    return functional && functional->hasSchema() &&
           functional->hasTag(at::Tag::pointwise);
  }
  return false;
}

bool metaKernelFallsShort(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name == "aten::_index_put_impl_" || name == "aten::put_" ||
         name == "aten::index_reduce";
}

ShapeEvidence shapeEvidence(const c10::OperatorHandle& op,
                            c10::ArrayRef<c10::IValue> args) {
  if (taggedDataDependent(op)) {
    return ShapeEvidence::kMetaKernel;
  }
  if (op.hasTag(at::Tag::pointwise) ||
      (op.hasTag(at::Tag::inplace) && op.hasTag(at::Tag::nondeterministic_seeded))) {
    return ShapeEvidence::kByDefinition;
  }
  // ATen tags its data-dependent ops (torch.compile relies on the tags);
  // other libraries' ops (torchvision's nms) need not be.
  if (op.schema().name().rfind("aten::", 0) != 0) {
    return ShapeEvidence::kMetaKernel;
  }
  // Trials keep integer and boolean tensors at zero (TrialRun.h), so they
  // show nothing about those tensors' values: the op must be one whose
  // integer arguments cannot shape its outputs.
  if (readsIntegerTensor(op.schema(), args) && !integerValuesCannotShapeOutputs(op)) {
    return ShapeEvidence::kMetaKernel;
  }
  return ShapeEvidence::kTwoTrials;
}

bool hasFloat8Argument(c10::ArrayRef<c10::IValue> args) {
  for (const c10::IValue& arg : args) {
    if (arg.isTensor()) {
      const at::Tensor& t = arg.toTensor();
      if (t.defined() && c10::isFloat8Type(t.scalar_type())) return true;
    } else if (arg.isTensorList()) {
      for (const at::Tensor& t : arg.toTensorList()) {
        if (t.defined() && c10::isFloat8Type(t.scalar_type())) return true;
      }
    }
  }
  return false;
}

const char* checksNeedTheData(const c10::OperatorHandle& op,
                              c10::ArrayRef<c10::IValue> args) {
  // _index_put_impl_(self, indices, values, accumulate, unsafe)
  if (!isIndexPut(op) || args.size() < 4 || !args[1].isOptionalTensorList()) {
    return nullptr;
  }
  bool mask = false;
  for (const std::optional<at::Tensor>& index : args[1].toOptionalTensorList()) {
    mask = mask || (index.has_value() && isMask(*index));
  }
  if (!mask) {
    return nullptr;
  }
  if (args[2].toTensor().numel() == 1) {
    // One value broadcasts to any count: the trial run checks the rest.
    return nullptr;
  }
  return "index_put with a boolean mask: whether the value fits is a "
         "question about the mask's count of True, answered on the host "
         "after a sync, as CUDA does";
}

}  // namespace phantom
