// The generic path for sparse layouts: every ATen op that reaches phantom
// with a sparse COO or compressed (CSR, CSC, BSR, BSC) tensor, and has no
// device-generic kernel registered in SparseLayouts.cpp, runs here by the
// CPU's own kernel over the device memory.
//
// A sparse tensor holds no memory itself: a COO tensor is an indices and a
// values tensor, a compressed one its compressed indices, plain indices and
// values, all dense phantom tensors. So the dense path's zero-copy aliases
// (KernelAliases) carry over: inside work on the current stream each dense
// member becomes a CPU alias of its device memory, and the sparse tensor a
// CPU sparse tensor (SparseCPU, SparseCsrCPU) over those aliases, with the
// same sizes, sparse and dense dimensions and coalesced flag. Dense
// arguments are aliased as on the dense path; a phantom tensor passed twice
// is aliased once. The op is then dispatched on the aliases below autograd,
// which picks the CPU's kernel exactly as a CPU call would (the sparse one,
// or a dense one for ops that take a sparse argument only sometimes), so
// results and errors are the CPU's. Results are mapped back as on the dense
// path, member by member: a member in an argument's memory is that
// argument or a phantom view of it, one the CPU kernel allocated is moved
// into new device memory; a sparse result is a phantom sparse tensor over
// the mapped members, and a sparse argument the kernel changed in place
// (add_, zero_, resize, an out= result) gets its new members, sizes and
// coalesced flag.
//
// Every call waits for its work (launchAndWait): most sparse results have
// data-dependent shapes (the nnz of a sum, a coalesce, a conversion), so a
// Meta kernel cannot give them ahead as the dense asynchronous half does.
// The wait is counted in the ops report and reported to the sync debug
// mode as the dense synchronous half's waits are. Ops on phantom and CPU
// tensors together are refused as on the dense path (0-dim CPU tensors are
// values and allowed).
#include <phantom/Generator.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/SyncDebug.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/KernelAliases.h>
#include <phantom/KernelWarnings.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/ops/SparseGenericPath.h>

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <unordered_map>
#include <vector>

namespace phantom {
namespace {

bool isSparseLayout(c10::Layout layout) {
  return layout == c10::kSparse || layout == c10::kSparseCsr ||
         layout == c10::kSparseCsc || layout == c10::kSparseBsr ||
         layout == c10::kSparseBsc;
}

// Calls f on each tensor of an argument (a tensor, or one in a list).
template <typename F>
void forEachTensor(const c10::IValue& arg, F&& f) {
  if (arg.isTensor()) {
    f(arg.toTensor());
  } else if (arg.isTensorList()) {
    for (const at::Tensor& t : arg.toTensorList()) f(t);
  } else if (arg.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
      if (t.has_value()) f(*t);
    }
  }
}

// The phantom device the op runs on; refuses tensors of other devices
// (0-dim dense CPU tensors aside: they are values, as on CUDA).
c10::Device findDevice(const c10::OperatorHandle& op,
                       c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> device;
  std::optional<c10::Device> other;
  for (const c10::IValue& arg : args) {
    if (arg.isDevice() &&
        arg.toDevice().type() == c10::DeviceType::PrivateUse1 && !device) {
      device = arg.toDevice();
    }
    forEachTensor(arg, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (isPhantom(t)) {
        if (!device) {
          device = t.device();
        } else if (*device != t.device()) {
          failMixedDevices(op, *device, t.device());
        }
      } else if (!(t.device().is_cpu() && t.layout() == c10::kStrided &&
                   t.dim() == 0)) {
        other = t.device();
      }
    });
  }
  TORCH_CHECK(device.has_value(), op.schema().name(),
              " was dispatched to phantom's sparse path but has no phantom "
              "tensor or device argument");
  if (other) failMixedDevices(op, *device, *other);
  return *device;
}

// A compressed sparse tensor over the given members, made directly: with
// torch.sparse.check_sparse_tensor_invariants on, ATen's constructors check
// the members' values, which here (inside device work) are already the
// CPU's or an argument's, and on phantom would wait for the device from
// inside its own work. (_sparse_coo_tensor_with_dims_and_tensors, used for
// COO, checks no values.)
at::Tensor makeCompressed(const at::Tensor& compressed, const at::Tensor& plain,
                          const at::Tensor& values, c10::IntArrayRef sizes,
                          c10::Layout layout, c10::Device device) {
  const c10::DispatchKey key = device.is_cpu()
                                   ? c10::DispatchKey::SparseCsrCPU
                                   : c10::DispatchKey::SparseCsrPrivateUse1;
  at::Tensor result = at::detail::make_tensor<at::SparseCsrTensorImpl>(
      c10::DispatchKeySet(key), device, layout, values.dtype());
  at::sparse_csr::get_sparse_csr_impl(result)->set_member_tensors(
      compressed, plain, values, sizes);
  return result;
}

// Sparse phantom tensors as CPU sparse tensors over aliases of their
// members, and results mapped back (see the file comment).
class SparseAliases {
 public:
  explicit SparseAliases(c10::Device device) : device_(device) {}

  at::Tensor alias(const at::Tensor& t) {
    if (!isPhantom(t)) return t;
    if (t.layout() == c10::kStrided) {
      at::Tensor cpu = dense_.alias(t);
      inputs_.push_back(t);
      return cpu;
    }
    const auto known = by_phantom_.find(t.unsafeGetTensorImpl());
    if (known != by_phantom_.end()) return sparse_[known->second].cpu;
    Sparse entry;
    entry.phantom = t;
    if (t.layout() == c10::kSparse) {
      at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(t);
      entry.members = {impl->indices(), impl->values()};
      const at::Tensor indices = alias(entry.members[0]);
      const at::Tensor values = alias(entry.members[1]);
      entry.cpu = at::_sparse_coo_tensor_with_dims_and_tensors(
          t.sparse_dim(), t.dense_dim(), t.sizes(), indices, values,
          values.options().layout(c10::kSparse), t.is_coalesced());
    } else {
      at::SparseCsrTensorImpl* impl = at::sparse_csr::get_sparse_csr_impl(t);
      entry.members = {impl->compressed_indices(), impl->plain_indices(),
                       impl->values()};
      const at::Tensor compressed = alias(entry.members[0]);
      const at::Tensor plain = alias(entry.members[1]);
      const at::Tensor values = alias(entry.members[2]);
      entry.cpu = makeCompressed(compressed, plain, values, t.sizes(),
                                 t.layout(), c10::Device(c10::kCPU));
    }
    for (const at::Tensor& m : cpuMembers(entry.cpu)) {
      entry.cpu_members.push_back(m.unsafeGetTensorImpl());
    }
    by_phantom_.emplace(t.unsafeGetTensorImpl(), sparse_.size());
    by_cpu_.emplace(entry.cpu.unsafeGetTensorImpl(), sparse_.size());
    sparse_.push_back(std::move(entry));
    return sparse_.back().cpu;
  }

  c10::IValue argument(const c10::IValue& arg, const c10::Argument& schema_arg) {
    if (isGeneratorArgument(schema_arg)) {
      std::optional<at::Generator> generator;
      if (arg.isGenerator()) generator = arg.toGenerator();
      return cpuGeneratorFor(generator, device_.index());
    }
    if (arg.isTensor()) return alias(arg.toTensor());
    if (arg.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : arg.toTensorList()) list.push_back(alias(t));
      return list;
    }
    if (arg.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
        list.push_back(t.has_value() ? std::optional<at::Tensor>(alias(*t))
                                     : std::nullopt);
      }
      return list;
    }
    if (arg.isDevice() && arg.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return c10::Device(c10::kCPU);
    }
    return arg;
  }

  // After the kernel: dense write-back, then sparse arguments the kernel
  // changed in place take their new members and metadata.
  void writeBack() {
    dense_.writeBack();
    for (Sparse& entry : sparse_) {
      const std::vector<at::Tensor> now = cpuMembers(entry.cpu);
      bool changed = entry.phantom.sizes() != entry.cpu.sizes();
      for (size_t i = 0; i < now.size(); ++i) {
        changed = changed || now[i].unsafeGetTensorImpl() != entry.cpu_members[i] ||
                  now[i].sizes() != entry.members[i].sizes();
      }
      if (entry.cpu.layout() == c10::kSparse) {
        changed = changed || entry.cpu.sparse_dim() != entry.phantom.sparse_dim() ||
                  entry.cpu.is_coalesced() != entry.phantom.is_coalesced();
        if (!changed) continue;
        at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(entry.phantom);
        impl->raw_resize_(entry.cpu.sparse_dim(), entry.cpu.dense_dim(),
                          entry.cpu.sizes());
        impl->set_indices_and_values_unsafe(mapDense(now[0]), mapDense(now[1]));
        impl->set_coalesced(entry.cpu.is_coalesced());
      } else if (changed) {
        at::sparse_csr::get_sparse_csr_impl(entry.phantom)
            ->set_member_tensors(mapDense(now[0]), mapDense(now[1]),
                                 mapDense(now[2]), entry.cpu.sizes());
      }
    }
  }

  c10::IValue result(const c10::IValue& value) {
    if (value.isTensor()) return mapTensor(value.toTensor());
    if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : value.toTensorList()) list.push_back(mapTensor(t));
      return list;
    }
    return value;
  }

 private:
  struct Sparse {
    at::Tensor phantom;
    at::Tensor cpu;
    std::vector<at::Tensor> members;  // the phantom members aliased
    std::vector<const c10::TensorImpl*> cpu_members;  // their aliases
  };

  static std::vector<at::Tensor> cpuMembers(const at::Tensor& cpu) {
    if (cpu.layout() == c10::kSparse) {
      at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(cpu);
      return {impl->indices(), impl->values()};
    }
    at::SparseCsrTensorImpl* impl = at::sparse_csr::get_sparse_csr_impl(cpu);
    return {impl->compressed_indices(), impl->plain_indices(), impl->values()};
  }

  at::Tensor mapTensor(const at::Tensor& cpu) {
    if (!cpu.defined() || !cpu.device().is_cpu()) return cpu;
    if (cpu.layout() == c10::kStrided) return mapDense(cpu);
    const auto known = by_cpu_.find(cpu.unsafeGetTensorImpl());
    if (known != by_cpu_.end()) {
      return sparse_[known->second].phantom;  // in place or out=
    }
    const std::vector<at::Tensor> members = cpuMembers(cpu);
    if (cpu.layout() == c10::kSparse) {
      const at::Tensor values = mapDense(members[1]);
      return at::_sparse_coo_tensor_with_dims_and_tensors(
          cpu.sparse_dim(), cpu.dense_dim(), cpu.sizes(), mapDense(members[0]),
          values, values.options().layout(c10::kSparse), cpu.is_coalesced());
    }
    const at::Tensor values = mapDense(members[2]);
    return makeCompressed(mapDense(members[0]), mapDense(members[1]), values,
                          cpu.sizes(), cpu.layout(), device_);
  }

  at::Tensor mapDense(const at::Tensor& cpu) {
    if (!cpu.defined() || !cpu.device().is_cpu()) return cpu;
    if (const c10::Storage* storage = dense_.phantomStorageOf(cpu)) {
      for (const at::Tensor& input : inputs_) {
        if (input.storage().is_alias_of(*storage) &&
            input.sizes() == cpu.sizes() && input.strides() == cpu.strides() &&
            input.storage_offset() == cpu.storage_offset() &&
            input.dtype() == cpu.dtype()) {
          return input;
        }
      }
      return phantomViewLike(*storage, cpu);
    }
    return newDeviceTensorFrom(cpu, device_);
  }

  c10::Device device_;
  KernelAliases dense_;
  std::vector<at::Tensor> inputs_;  // dense phantom tensors aliased
  std::vector<Sparse> sparse_;
  std::unordered_map<const c10::TensorImpl*, size_t> by_phantom_;
  std::unordered_map<const c10::TensorImpl*, size_t> by_cpu_;
};

// The keys the CPU kernel is found by: the aliases' own, and for a factory
// (no sparse argument, a sparse `layout`) the CPU's sparse key.
c10::DispatchKeySet cpuKeys(c10::ArrayRef<c10::IValue> kernel_args) {
  c10::DispatchKeySet keys;
  for (const c10::IValue& arg : kernel_args) {
    forEachTensor(arg, [&](const at::Tensor& t) {
      if (t.defined()) keys = keys | t.key_set();
    });
  }
  return keys;
}

}  // namespace

void sparseFallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                    torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(stack, num_args);
  const c10::Device device = findDevice(op, args);
  const c10::DeviceGuard guard(device);
  // A factory given a sparse layout (and no sparse tensor) is run by the
  // CPU's sparse kernel for that layout.
  std::optional<c10::DispatchKey> layout_key;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::TypePtr& type = schema.arguments()[i].type();
    const bool layout_arg =
        type->kind() == c10::TypeKind::LayoutType ||
        (type->cast<c10::OptionalType>() &&
         type->cast<c10::OptionalType>()->getElementType()->kind() ==
             c10::TypeKind::LayoutType);
    if (layout_arg && args[i].isInt()) {
      const auto layout = static_cast<c10::Layout>(args[i].toInt());
      if (layout == c10::kSparse) {
        layout_key = c10::DispatchKey::SparseCPU;
      } else if (isSparseLayout(layout)) {
        layout_key = c10::DispatchKey::SparseCsrCPU;
      }
    }
  }
  const char* reason =
      "sparse layouts run synchronously (data-dependent results)";
  noteHostWait(schema.name().c_str(), reason);
  recordOpPath(schema.name(), OpPath::kGenericSync, reason);
  for (size_t i = 0; i < num_args; ++i) {
    if (isGeneratorArgument(schema.arguments()[i])) {
      std::optional<at::Generator> given;
      if (args[i].isGenerator()) given = args[i].toGenerator();
      phantomGeneratorFor(given, device.index())->waitForQueuedDraws();
    }
  }
  std::vector<c10::IValue> results;
  std::vector<c10::Warning> warnings;
  launchAndWait(getCurrentPhantomStream(device.index()), schema.name().c_str(),
                [&] {
    // What the kernel warns is the call's; what making the aliases and the
    // phantom results warns (the CSR constructor's "beta" warning) is not:
    // the CPU makes neither.
    SparseAliases aliases(device);
    torch::jit::Stack kernel_stack;
    kernel_stack.reserve(num_args);
    {
      const WarningCapture ours;
      for (size_t i = 0; i < num_args; ++i) {
        kernel_stack.push_back(aliases.argument(args[i], schema.arguments()[i]));
      }
    }
    c10::DispatchKeySet keys = cpuKeys(kernel_stack);
    if (layout_key) keys = keys.add(*layout_key);
    keys = keys & c10::after_ADInplaceOrView_keyset;
    if (keys.empty()) keys = c10::DispatchKeySet(c10::DispatchKey::CPU);
    {
      WarningCapture capture;
      // As below autograd on the CPU: the kernel's own calls on the aliases
      // skip autograd whichever thread runs the work.
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      op.redispatchBoxed(keys, &kernel_stack);
      warnings = capture.take();
    }
    const WarningCapture ours;
    aliases.writeBack();
    results.reserve(kernel_stack.size());
    for (const c10::IValue& result : kernel_stack) {
      results.push_back(aliases.result(result));
    }
  });
  emitWarnings(warnings);
  torch::jit::drop(stack, num_args);
  for (c10::IValue& result : results) stack->push_back(std::move(result));
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
}

}  // namespace phantom
