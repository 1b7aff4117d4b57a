// The asynchronous generic path: run an op's CPU kernel over device memory
// as work queued on the current stream, and return before it has run.
//
// What the host must return at once is the outputs' metadata. The op's Meta
// kernel computes it: the arguments are mirrored as meta tensors (same
// sizes, strides, offsets and storage sharing, no memory) and the op runs
// on them. Then, on the host:
//   - an argument the op writes and returns (in-place, out=) is returned
//     itself, resized first if the Meta kernel resized its mirror;
//   - a result that shares a mirror's storage (a view) becomes a phantom
//     view of the argument's storage;
//   - any other result gets new device memory with the Meta strides.
// The queued work aliases arguments and outputs as CPU tensors, runs the CPU
// kernel, and copies fresh results into the outputs. It holds no
// references to device memory (DeviceTensorRef), as a kernel on hardware.
//
// The host takes the synchronous path instead (and says why, in the ops
// report) when it cannot know the outputs in advance cheaply or the op must
// run in host order: no Meta kernel, a Meta kernel written in Python (in
// torch 2.13 torch/_meta_registrations.py overrides the C++ Meta kernels of
// most core ops, and running one costs ~280 us with the GIL, far more than
// waiting for the CPU kernel), a Meta kernel that fails (data-dependent
// output shapes: nonzero, masked_select, unique, ...), results that are not
// tensors, or a Generator argument (random ops consume the generator in
// the order the host calls them, so phantom keeps drawing the CPU's numbers).
// Errors the CPU kernel raises (a bad index) surface at the next sync,
// naming the op, as a device-side error does on a GPU.
//
// The hottest elementwise ops (add, sub, mul, div, relu) do not come here
// in their common cases: they have native kernels (Elementwise.cpp).
#include <phantom/Launch.h>
#include <phantom/Storage.h>
#include <phantom/Stream.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/KernelAliases.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/TensorImpl.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace phantom {
namespace {

bool isTensorType(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) {
    return true;
  }
  const auto list = type->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::TensorType;
}

bool takesGenerator(const c10::FunctionSchema& schema) {
  for (const auto& argument : schema.arguments()) {
    if (isGeneratorArgument(argument)) {
      return true;
    }
  }
  return false;
}

// Mirrors phantom tensors as meta tensors, keeping storage sharing and
// identity: a tensor passed twice (self and out of an in-place op routed
// through its out= form) is mirrored once, so the Meta kernel sees an
// output that is also an input and refuses, as the CPU kernel does, to
// resize it to the broadcast shape.
class MetaMirror {
 public:
  at::Tensor mirror(const at::Tensor& tensor) {
    if (!isPhantom(tensor)) {
      return tensor;
    }
    for (const auto& [phantom, meta] : pairs_) {
      if (phantom.unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) {
        return meta;
      }
    }
    const c10::StorageImpl* key = tensor.storage().unsafeGetStorageImpl();
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      c10::Storage meta(c10::Storage::use_byte_size_t(), tensor.storage().nbytes(),
                        c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)),
                        c10::GetAllocator(c10::DeviceType::Meta),
                        /*resizable=*/true);
      it = storages_.emplace(key, Mirrored{tensor.storage(), meta}).first;
      by_meta_.emplace(meta.unsafeGetStorageImpl(), &it->second);
    }
    auto meta = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(it->second.meta), c10::DispatchKeySet(c10::DispatchKey::Meta),
        tensor.dtype());
    c10::TensorImpl* impl = meta.unsafeGetTensorImpl();
    impl->set_sizes_and_strides(tensor.sizes(), tensor.strides(),
                                tensor.storage_offset());
    impl->_set_conj(tensor.is_conj());
    impl->_set_neg(tensor.is_neg());
    pairs_.emplace_back(tensor, meta);
    return meta;
  }

  c10::IValue mirror(const c10::IValue& value) {
    if (value.isTensor()) {
      return mirror(value.toTensor());
    }
    if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : value.toTensorList()) {
        list.push_back(mirror(t));
      }
      return list;
    }
    if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
        list.push_back(t.has_value() ? std::optional<at::Tensor>(mirror(*t))
                                     : std::nullopt);
      }
      return list;
    }
    if (value.isDevice() &&
        value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return c10::Device(c10::DeviceType::Meta);
    }
    return value;
  }

  // The phantom argument whose mirror is `meta` itself, if any.
  const at::Tensor* argumentFor(const at::Tensor& meta) const {
    for (const auto& [phantom, mirror] : pairs_) {
      if (mirror.unsafeGetTensorImpl() == meta.unsafeGetTensorImpl()) {
        return &phantom;
      }
    }
    return nullptr;
  }

  // The phantom storage whose mirror `meta` lives in, if any.
  const c10::Storage* storageFor(const at::Tensor& meta) const {
    if (!meta.has_storage()) {
      return nullptr;
    }
    auto it = by_meta_.find(meta.storage().unsafeGetStorageImpl());
    return it == by_meta_.end() ? nullptr : &it->second->phantom;
  }

  // Applies to phantom arguments the resizes the Meta kernel made to their
  // mirrors (out= arguments of the wrong shape).
  void applyResizes() {
    for (auto& [phantom, meta] : pairs_) {
      if (phantom.sizes() == meta.sizes() && phantom.strides() == meta.strides() &&
          phantom.storage_offset() == meta.storage_offset()) {
        continue;
      }
      const size_t needed = at::detail::computeStorageNbytes(
          meta.sizes(), meta.strides(), meta.dtype().itemsize(),
          meta.storage_offset());
      c10::StorageImpl* storage = phantom.storage().unsafeGetStorageImpl();
      if (needed > storage->nbytes()) {
        resizeStorageBytes(storage, needed);
      }
      phantom.unsafeGetTensorImpl()->set_sizes_and_strides(
          meta.sizes(), meta.strides(), meta.storage_offset());
    }
  }

 private:
  struct Mirrored {
    c10::Storage phantom;
    c10::Storage meta;
  };
  std::unordered_map<const c10::StorageImpl*, Mirrored> storages_;
  std::unordered_map<const c10::StorageImpl*, const Mirrored*> by_meta_;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs_;  // phantom, meta
};

// An argument as queued work holds it: device tensors by reference only.
struct KernelArgument {
  enum class Kind { kValue, kTensor, kTensorList, kOptionalTensorList };
  Kind kind = Kind::kValue;
  c10::IValue value;  // kValue; also host tensors inside lists, by position
  std::vector<std::optional<DeviceTensorRef>> refs;
  std::vector<c10::IValue> hosts;

  static KernelArgument from(const c10::IValue& arg) {
    KernelArgument result;
    if (arg.isTensor() && isPhantom(arg.toTensor())) {
      result.kind = Kind::kTensor;
      result.refs.emplace_back(DeviceTensorRef(arg.toTensor()));
    } else if (arg.isTensorList()) {
      result.kind = Kind::kTensorList;
      for (const at::Tensor& t : arg.toTensorList()) {
        result.add(t);
      }
    } else if (arg.isOptionalTensorList()) {
      result.kind = Kind::kOptionalTensorList;
      for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
        if (t.has_value()) {
          result.add(*t);
        } else {
          result.refs.emplace_back(std::nullopt);
          result.hosts.emplace_back();  // None
        }
      }
    } else if (arg.isDevice() &&
               arg.toDevice().type() == c10::DeviceType::PrivateUse1) {
      result.value = c10::Device(c10::kCPU);
    } else {
      result.value = arg;
    }
    return result;
  }

  void add(const at::Tensor& t) {
    if (isPhantom(t)) {
      refs.emplace_back(DeviceTensorRef(t));
      hosts.emplace_back();
    } else {
      refs.emplace_back(std::nullopt);
      hosts.emplace_back(t);
    }
  }

  c10::IValue toKernel(KernelAliases& aliases) const {
    switch (kind) {
      case Kind::kValue:
        return value;
      case Kind::kTensor:
        return aliases.alias(*refs[0]);
      case Kind::kTensorList: {
        c10::List<at::Tensor> list;
        for (size_t i = 0; i < refs.size(); ++i) {
          list.push_back(refs[i] ? aliases.alias(*refs[i])
                                 : hosts[i].toTensor());
        }
        return list;
      }
      case Kind::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (size_t i = 0; i < refs.size(); ++i) {
          if (refs[i]) {
            list.push_back(aliases.alias(*refs[i]));
          } else if (hosts[i].isTensor()) {
            list.push_back(hosts[i].toTensor());
          } else {
            list.push_back(std::nullopt);
          }
        }
        return list;
      }
    }
    return value;
  }
};

void flatten(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) {
      out.push_back(t);
    }
  }
}

// True when the Meta kernel the dispatcher would run for `op` is a C++
// one. Python registrations show their .py file in the computed table.
// Decided once per op.
bool hasNativeMetaKernel(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* known = new std::unordered_map<c10::OperatorHandle, bool>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known->find(op);
  if (it != known->end()) {
    return it->second;
  }
  bool native = false;
  const std::string table = op.dumpComputedTable();
  const size_t line = table.find("\nMeta: ");
  if (line != std::string::npos) {
    const size_t end = table.find('\n', line + 1);
    const std::string entry = table.substr(line + 1, end - line - 1);
    native = entry.find(".py") == std::string::npos &&
             entry.find("fallthrough") == std::string::npos;
  }
  known->emplace(op, native);
  return native;
}

// Queues the op's CPU kernel over aliases of `args`; each `fresh` entry
// (result index, device tensor) receives that CPU result.
void queueCpuKernel(const c10::OperatorHandle& op,
                    c10::ArrayRef<c10::IValue> args,
                    std::vector<std::pair<size_t, DeviceTensorRef>> fresh,
                    c10::Device device) {
  std::vector<KernelArgument> kernel_args;
  kernel_args.reserve(args.size());
  for (const c10::IValue& arg : args) {
    kernel_args.push_back(KernelArgument::from(arg));
  }
  launchAsync(
      getCurrentPhantomStream(device.index()), op.schema().name().c_str(),
      [op, kernel_args = std::move(kernel_args), fresh = std::move(fresh)] {
        KernelAliases aliases;
        torch::jit::Stack kernel_stack;
        kernel_stack.reserve(kernel_args.size());
        for (const KernelArgument& arg : kernel_args) {
          kernel_stack.push_back(arg.toKernel(aliases));
        }
        op.callBoxedForDispatchKey(c10::DispatchKey::CPU, kernel_stack);
        std::vector<at::Tensor> cpu_results;
        for (const c10::IValue& value : kernel_stack) {
          flatten(value, cpu_results);
        }
        for (const auto& [index, ref] : fresh) {
          TORCH_CHECK(index < cpu_results.size(),
                      "the CPU kernel returned fewer results than its Meta kernel");
          aliases.alias(ref).copy_(cpu_results[index]);
        }
      });
}

}  // namespace

const char* runGenericAsync(const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, c10::Device device) {
  const c10::FunctionSchema& schema = op.schema();
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) {
    return "no Meta kernel to compute its outputs ahead";
  }
  if (!hasNativeMetaKernel(op)) {
    return "its Meta kernel is Python (slower than waiting)";
  }
  if (takesGenerator(schema)) {
    return "draws random numbers (the generator is consumed in host order)";
  }
  for (const auto& ret : schema.returns()) {
    if (!isTensorType(ret.type())) {
      return "returns a value that is not a tensor";
    }
  }
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(stack, num_args);

  // 1. Outputs' metadata, from the Meta kernel.
  MetaMirror mirror;
  torch::jit::Stack meta_stack;
  meta_stack.reserve(num_args);
  for (const c10::IValue& arg : args) {
    meta_stack.push_back(mirror.mirror(arg));
  }
  try {
    op.callBoxedForDispatchKey(c10::DispatchKey::Meta, meta_stack);
  } catch (const std::exception&) {
    // Data-dependent shapes, or a Meta kernel stricter than the CPU's: the
    // synchronous path runs the CPU kernel and reports its real error.
    return "its Meta kernel cannot compute the outputs (data-dependent)";
  }

  // 2. Outputs on the device, on the host, before anything runs.
  mirror.applyResizes();
  std::vector<at::Tensor> meta_results;
  for (const c10::IValue& value : meta_stack) {
    flatten(value, meta_results);
  }
  std::vector<at::Tensor> results;
  std::vector<std::pair<size_t, DeviceTensorRef>> fresh;  // result index, ref
  for (size_t i = 0; i < meta_results.size(); ++i) {
    const at::Tensor& meta = meta_results[i];
    if (!meta.defined()) {
      results.emplace_back();
    } else if (const at::Tensor* argument = mirror.argumentFor(meta)) {
      results.push_back(*argument);
    } else if (const c10::Storage* storage = mirror.storageFor(meta)) {
      results.push_back(phantomViewLike(*storage, meta));
    } else {
      results.push_back(at::empty_strided(meta.sizes(), meta.strides(),
                                          meta.options().device(device)));
      fresh.emplace_back(i, DeviceTensorRef(results.back()));
    }
  }

  // 3. The kernel, queued.
  queueCpuKernel(op, args, std::move(fresh), device);

  // 4. Results, in the schema's shape.
  torch::jit::drop(stack, num_args);
  size_t next = 0;
  for (const c10::IValue& value : meta_stack) {
    if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      for (size_t i = 0; i < value.toTensorList().size(); ++i) {
        list.push_back(results[next++]);
      }
      stack->push_back(std::move(list));
    } else if (value.isTensor()) {
      stack->push_back(results[next++]);
    } else {
      stack->push_back(value);
    }
  }
  return nullptr;
}

}  // namespace phantom
