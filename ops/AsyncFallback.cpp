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
// kernel, and copies fresh results into the outputs (a large result is
// usually computed in place instead: the output's memory is lent to the
// kernel's allocation, phantom/KernelHostMemory.h). It holds no
// references to device memory (DeviceTensorRef), as a kernel on hardware.
//
// The host takes the synchronous path instead (and says why, in the ops
// report) when it cannot know the outputs in advance: no Meta kernel, a
// Meta kernel that fails (data-dependent output shapes: nonzero,
// masked_select, unique, ...), or results that are not tensors (a
// `Tensor?` result counts as one: None or a tensor, known ahead). A Meta
// kernel written in Python (in torch 2.13 torch/_meta_registrations.py
// overrides the C++ Meta kernels of most core ops, and running one costs
// ~100-300 us with the GIL, far more than the CPU kernel) is run once per
// call signature, to learn that the outputs do not depend on the data; the
// outputs themselves come from a trial run of the CPU kernel on the host
// and are remembered ("Remembered outputs", below); that first call is
// queued as well. Random ops are queued too: the device's generator is handed
// to the CPU kernel on the worker, and PhantomGeneratorImpl::queueDraw keeps
// the draws in the order the host called the ops (Generator.h), so phantom
// keeps drawing the CPU's numbers.
// Errors the CPU kernel raises (a bad index) surface at the next sync,
// naming the op, as a device-side error does on a GPU.
//
// The hottest elementwise ops (add, sub, mul, div, relu) do not come here
// in their common cases: they have native kernels (Elementwise.cpp).
#include <phantom/Generator.h>
#include <phantom/KernelHostMemory.h>
#include <phantom/Launch.h>
#include <phantom/Settings.h>
#include <phantom/Storage.h>
#include <phantom/Stream.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/HostChecks.h>
#include <phantom/ops/KernelAliases.h>
#include <phantom/ops/KernelThreads.h>
#include <phantom/ops/KernelWarnings.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace phantom {
namespace {

// Results the generic path can compute ahead: Tensor, Tensor[] and
// Tensor? (whether it is None is decided by the arguments, which the Meta
// kernel and the trial run see: fbgemm's permute_2D_sparse_data returns
// None for weights when it is given none).
bool isTensorType(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) {
    return true;
  }
  if (const auto optional = type->cast<c10::OptionalType>()) {
    return optional->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  const auto list = type->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::TensorType;
}

// The index of the op's `Generator?` argument, or -1.
int generatorArgument(const c10::FunctionSchema& schema) {
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (isGeneratorArgument(arguments[i])) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// Gives phantom tensor `t` this geometry (an out= argument the op resizes),
// growing its storage if it is too small. Nothing if it has it already.
void resizeArgument(const at::Tensor& t, c10::IntArrayRef sizes,
                    c10::IntArrayRef strides, int64_t offset) {
  if (t.sizes() == sizes && t.strides() == strides && t.storage_offset() == offset) {
    return;
  }
  const size_t needed = at::detail::computeStorageNbytes(
      sizes, strides, t.dtype().itemsize(), offset);
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    resizeStorageBytes(storage, needed);
  }
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
}

// The index of the argument that is `t` itself (not a tensor inside a
// list), or args.size() if none is.
size_t argumentIndexOf(c10::ArrayRef<c10::IValue> args, const at::Tensor& t) {
  size_t i = 0;
  while (i < args.size() &&
         !(args[i].isTensor() &&
           args[i].toTensor().unsafeGetTensorImpl() == t.unsafeGetTensorImpl())) {
    ++i;
  }
  return i;
}

// `value` with `f` applied to each tensor in it, for a tensor or a list of
// tensors or of optional tensors; nullopt for a value of any other kind.
template <typename F>
std::optional<c10::IValue> mapTensors(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    return c10::IValue(f(value.toTensor()));
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList()) {
      list.push_back(f(t));
    }
    return c10::IValue(std::move(list));
  }
  if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
      list.push_back(t.has_value() ? std::optional<at::Tensor>(f(*t)) : std::nullopt);
    }
    return c10::IValue(std::move(list));
  }
  return std::nullopt;
}

// True when another argument (or a tensor in a list) shares argument
// `index`'s storage.
bool sharesStorageWithAnother(c10::ArrayRef<c10::IValue> args, size_t index) {
  const c10::StorageImpl* storage =
      args[index].toTensor().storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < args.size(); ++i) {
    if (i == index) continue;
    bool shared = false;
    mapTensors(args[i], [&](const at::Tensor& t) {
      shared = shared || (t.defined() && t.has_storage() &&
                          t.storage().unsafeGetStorageImpl() == storage);
      return t;
    });
    if (shared) return true;
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
  // `empty`: the mirror has no elements (an out= argument; see
  // runGenericAsync).
  at::Tensor mirror(const at::Tensor& tensor, bool empty = false) {
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
    if (empty) {
      impl->set_sizes_contiguous({0});
    } else {
      impl->set_sizes_and_strides(tensor.sizes(), tensor.strides(),
                                  tensor.storage_offset());
    }
    impl->_set_conj(tensor.is_conj());
    impl->_set_neg(tensor.is_neg());
    pairs_.emplace_back(tensor, meta);
    return meta;
  }

  c10::IValue mirror(const c10::IValue& value) {
    if (std::optional<c10::IValue> mapped = mapTensors(
            value, [this](const at::Tensor& t) { return mirror(t); })) {
      return *mapped;
    }
    if (value.isDevice() &&
        value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return c10::Device(c10::DeviceType::Meta);
    }
    if (value.isGenerator()) {
      return c10::IValue();  // a Meta kernel draws nothing
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

  // The resizes the Meta kernel made to mirrors (out= arguments of the
  // wrong shape), by argument index; false if a resized tensor is not an
  // argument itself (it is inside a list).
  bool resizes(c10::ArrayRef<c10::IValue> args,
               std::vector<ArgumentGeometry>* out) const {
    for (const auto& [phantom, meta] : pairs_) {
      if (phantom.sizes() == meta.sizes() && phantom.strides() == meta.strides() &&
          phantom.storage_offset() == meta.storage_offset()) {
        continue;
      }
      const size_t i = argumentIndexOf(args, phantom);
      if (i == args.size()) return false;
      out->push_back(ArgumentGeometry::of(i, meta));
    }
    return true;
  }

  // Applies to phantom arguments the resizes the Meta kernel made to their
  // mirrors.
  void applyResizes() {
    for (auto& [phantom, meta] : pairs_) {
      resizeArgument(phantom, meta.sizes(), meta.strides(), meta.storage_offset());
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

// An op's results, flattened as flatten() does, except that a None result
// (a `Tensor?` return) takes a place too, as an undefined tensor: result
// indices then mean the same on the host (Meta kernel, trial run) and in
// the queued work.
void flattenResults(c10::ArrayRef<c10::IValue> results, std::vector<at::Tensor>& out) {
  for (const c10::IValue& value : results) {
    if (value.isNone()) {
      out.emplace_back();
    } else {
      flatten(value, out);
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

// Copies each CPU result into its device output (`outs[i]` receives
// result fresh[i].first), except a result the kernel computed in place, in
// the output's own memory (lent to it). A result that lies in another
// output's lent memory (one buffer returned as two results) is copied out
// first, before that output is written.
void copyResultsIntoOutputs(
    const c10::SmallVector<at::Tensor, 4>& outs,
    const std::vector<std::pair<size_t, DeviceTensorRef>>& fresh,
    std::vector<at::Tensor>& cpu_results) {
  const auto insideAnOutput = [&](const at::Tensor& cpu) {
    const char* begin = static_cast<const char*>(cpu.storage().data());
    const char* end = begin + cpu.storage().nbytes();
    for (const at::Tensor& out : outs) {
      const char* out_begin = static_cast<const char*>(out.data_ptr());
      if (begin < out_begin + out.nbytes() && out_begin < end) return true;
    }
    return false;
  };
  for (size_t i = 0; i < fresh.size(); ++i) {
    at::Tensor& cpu = cpu_results[fresh[i].first];
    if (!computedIn(cpu, outs[i]) && insideAnOutput(cpu)) {
      cpu = cpu.clone();
    }
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    const at::Tensor& cpu = cpu_results[fresh[i].first];
    if (computedIn(cpu, outs[i])) {
      if (cpu.nbytes() > 0) noteResultInPlace();  // not an empty result
    } else {
      outs[i].copy_(cpu);
    }
  }
}

// Queues the op's CPU kernel over aliases of `args`; each `fresh` entry
// (result index, device tensor) receives that CPU result, which must have
// the shape and dtype computed ahead.
void queueCpuKernel(const c10::OperatorHandle& op,
                    c10::ArrayRef<c10::IValue> args,
                    std::vector<std::pair<size_t, DeviceTensorRef>> fresh,
                    c10::Device device,
                    std::shared_ptr<std::atomic<bool>> wrong = nullptr) {
  const int generator_index = generatorArgument(op.schema());
  PhantomGeneratorImpl* generator = nullptr;
  std::vector<KernelArgument> kernel_args;
  kernel_args.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (static_cast<int>(i) == generator_index) {
      std::optional<at::Generator> given;
      if (args[i].isGenerator()) {
        given = args[i].toGenerator();
      }
      generator = phantomGeneratorFor(given, device.index());
      KernelArgument argument;
      argument.value = generator->cpuGenerator();
      kernel_args.push_back(std::move(argument));
    } else {
      kernel_args.push_back(KernelArgument::from(args[i]));
    }
  }
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  const bool one_thread = runsOnOneThread(op.operator_name(), args);
  auto work = [op, kernel_args = std::move(kernel_args), fresh = std::move(fresh),
               wrong = std::move(wrong), one_thread] {
    KernelAliases aliases;
    torch::jit::Stack kernel_stack;
    kernel_stack.reserve(kernel_args.size());
    for (const KernelArgument& arg : kernel_args) {
      kernel_stack.push_back(arg.toKernel(aliases));
    }
    // Each large dense output's memory is offered to the kernel's
    // allocation of its size, so the result may be computed in place
    // (KernelHostMemory.h, "Lending").
    c10::SmallVector<at::Tensor, 4> outs;
    LendingScope lending;
    for (const auto& entry : fresh) {
      outs.push_back(aliases.alias(entry.second));
      const at::Tensor& out = outs.back();
      if (out.numel() > 0 && out.is_non_overlapping_and_dense()) {
        lending.offer(out.data_ptr(), out.nbytes());
      }
    }
    {
      const OneThreadScope threads(one_thread);  // KernelThreads.h
      // Delivered at the call already (KernelWarnings.cpp); on the worker
      // they would only be printed to stderr.
      WarningCapture dropped;
      if (op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
        op.callBoxedForDispatchKey(c10::DispatchKey::CPU, kernel_stack);
      } else {
        // A composite CPU entry (Fallback.cpp, bottom), found only through
        // the dispatch table; it runs its ops on the CPU aliases.
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &kernel_stack);
      }
    }
    lending.close();
    std::vector<at::Tensor> cpu_results;
    flattenResults(kernel_stack, cpu_results);
    kernel_stack.clear();
    for (size_t i = 0; i < fresh.size(); ++i) {
      const size_t index = fresh[i].first;
      TORCH_CHECK(index < cpu_results.size(),
                  "the CPU kernel returned fewer results than its Meta kernel");
      const at::Tensor& out = outs[i];
      const at::Tensor& cpu = cpu_results[index];
      // copy_ would broadcast a smaller result: a wrong answer computed
      // ahead must fail loudly instead, and not be used again.
      if (!cpu.defined()) {
        if (wrong) wrong->store(true);
        TORCH_CHECK(false, "result ", index, " of the CPU kernel is None, but a "
                    "tensor of shape ", out.sizes(), " was computed ahead for it "
                    "on the host");
      }
      if (cpu.sizes() != out.sizes() || cpu.dtype() != out.dtype()) {
        if (wrong) wrong->store(true);
        TORCH_CHECK(false, "result ", index, " of the CPU kernel has shape ",
                    cpu.sizes(), " and dtype ", cpu.dtype(), ", but ",
                    out.sizes(), " and ", out.dtype(), " were computed ahead "
                    "for it on the host: the output depends on the data. ",
                    wrong ? "Later calls with these argument shapes wait for "
                            "the CPU kernel"
                          : "Run with PHANTOM_SYNC_GENERIC=1 to work around "
                            "it, and report it");
      }
    }
    copyResultsIntoOutputs(outs, fresh, cpu_results);
    cpu_results.clear();
    lending.requireNothingKept(op.schema().name().c_str());
  };
  if (generator != nullptr) {
    generator->queueDraw(stream, [&] {
      launchAsync(stream, op.schema().name().c_str(), std::move(work));
    });
  } else {
    launchAsync(stream, op.schema().name().c_str(), std::move(work));
  }
}

// --- Remembered outputs --------------------------------------------------
//
// In torch 2.13 most core ops have a Python Meta kernel, slower than
// waiting for the CPU kernel. But a program repeats itself: a training
// step calls the same ops on tensors of the same shapes every step. So for
// those ops the outputs' metadata is remembered per call signature (the
// op, every tensor argument's dtype, sizes, strides, offset and storage
// sharing, every other argument's value). The first call with a signature
// runs the Python Meta kernel once: if it raises, the outputs depend on the
// data (or the arguments are refused) and the call waits. If it does not,
// the CPU kernel runs once on the host over zeroed copies of the arguments
// (TrialRun), which gives the CPU's own outputs and the resizes it makes to
// out= arguments; the call is queued with them, and so are later ones.
//
// The trial is what makes queuing the first call safe. Python Meta kernels
// describe the general case and are lax about arguments, and the CPU kernel
// sometimes answers differently for a signature: for its fast path
// _embedding_bag returns an empty offset2bag where the Meta kernel gives
// one of the indices' length; in eval mode batch norm saves no statistics;
// the linalg kernels give an empty out= argument column-major strides.
// And an argument error the Meta kernel does not check (multinomial on
// integers) is raised by the trial at the call, as on the CPU, rather than
// failing the stream later and losing the work queued behind it.
// When the trial raises on zeros and on ones too (a singular matrix), or
// the arguments span more than TrialRun::kMaxBytes, the call waits and the
// synchronous path checks the Meta kernel's answer against the CPU's real
// outputs (verifyRemembered); if they differ, the CPU's own ones are
// remembered instead, once a second call has returned the same ones.
//
// The queued work checks every result's shape and dtype against the
// remembered ones and fails loudly (the stream's error, naming the op) if
// they ever differ, rather than return a wrong answer; the signature then
// waits for good. Only outputs that are fresh tensors or an argument
// itself (in-place, out=) are remembered. A signature whose results are
// views, or whose CPU kernel changes an argument in a way queued work
// cannot carry back (linalg_lu_solve(left=False) sets its out= result's
// conj bit), is remembered as "wait".
// Arguments the Meta kernel would have refused are not in the memo: a
// remembered signature passed the kernel's checks before.

struct RememberedOutput {
  enum class Kind { kUndefined, kArgument, kFresh } kind = Kind::kUndefined;
  size_t argument = 0;  // kArgument: index among the op's arguments
  c10::ScalarType dtype = c10::kFloat;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;

  static RememberedOutput argumentAt(size_t index) {
    RememberedOutput out;
    out.kind = Kind::kArgument;
    out.argument = index;
    return out;
  }
  static RememberedOutput freshLike(const at::Tensor& t) {
    RememberedOutput out;
    out.kind = Kind::kFresh;
    out.dtype = t.scalar_type();
    out.sizes.assign(t.sizes().begin(), t.sizes().end());
    out.strides.assign(t.strides().begin(), t.strides().end());
    return out;
  }
};

// Remembered::returns entries other than a list's length.
constexpr int kTensorReturn = -1;
constexpr int kNoneReturn = -2;  // a `Tensor?` result that is None

struct Remembered {
  enum class State {
    kVerifying,   // a waiting call checks the outputs below against the CPU's
    kConfirming,  // outputs below are the CPU's; the next call checks them
    kUsable,      // outputs below are queued with
    kWait,        // the signature always takes the synchronous path
  } state = State::kVerifying;
  bool from_cpu = false;  // outputs below were the CPU kernel's, not Meta's
  std::vector<RememberedOutput> outputs;  // flattened (None: kUndefined)
  std::vector<int> returns;  // per return: kTensorReturn, kNoneReturn, n >= 0 list of n
  std::vector<ArgumentGeometry> resizes;  // out= arguments the call resizes
  // Set by queued work whose CPU results had other shapes than the ones
  // remembered (they depend on the data after all): the signature waits.
  std::shared_ptr<std::atomic<bool>> wrong;
  // The warnings the CPU kernel raises at every call with this signature,
  // raised again at each queued call (KernelWarnings.cpp).
  std::vector<c10::Warning> warnings;
  // While verifying: `warnings` holds one waited run's warnings, which the
  // next waited run confirms (what both raised is raised at every call).
  bool warnings_seen = false;
};

// At most this many signatures are remembered; a new one then replaces an
// arbitrary one (a training loop's working set is a few hundred; a test
// suite sweeping shapes keeps cycling through, each new signature checked
// once more).
constexpr size_t kMaxRemembered = 1 << 14;

std::mutex& memoMutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<std::string, Remembered>& memo() {
  static auto* table = new std::unordered_map<std::string, Remembered>();
  return *table;
}

template <typename T>
void put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// Appends `t`'s signature; `storages` numbers the storages seen so far.
// False for a host mask (a boolean or uint8 CPU tensor that is not a
// scalar, which indexing ops accept): the kernel reads it on the host and
// its count of True decides the outputs' shapes.
bool putTensor(std::string& key, const at::Tensor& t,
               std::vector<const c10::StorageImpl*>& storages) {
  if (!t.defined()) {
    key += 'u';
    return true;
  }
  if (!isPhantom(t) && t.dim() > 0 &&
      (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte)) {
    return false;
  }
  key += isPhantom(t) ? 'P' : 'C';
  put(key, static_cast<int16_t>(t.device().index()));
  put(key, static_cast<int8_t>(t.scalar_type()));
  put(key, static_cast<int8_t>(t.layout()));
  put(key, static_cast<uint8_t>(t.is_conj() | (t.is_neg() << 1) |
                                (t.unsafeGetTensorImpl()->is_wrapped_number() << 2)));
  put(key, static_cast<int32_t>(t.dim()));
  for (int64_t v : t.sizes()) put(key, v);
  if (t.layout() == c10::kStrided) {
    for (int64_t v : t.strides()) put(key, v);
    put(key, t.storage_offset());
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    const auto it = std::find(storages.begin(), storages.end(), storage);
    put(key, static_cast<int32_t>(it - storages.begin()));
    if (it == storages.end()) storages.push_back(storage);
  }
  return true;
}

// The call signature of `op` on `args`, or false for an argument kind the
// memo does not know, or a host mask (then the call waits, as without it). For a pointwise
// op (ATen's `pointwise` tag: outputs broadcast from the tensor inputs) a
// floating-point scalar counts by its kind, not its value, which cannot
// change the outputs: Adam's addcdiv_ takes a new step size every step.
bool signatureOf(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                 std::string* key) {
  key->reserve(256);
  put(*key, &op.schema());
  // The name too: a schema freed with its library (torch.library ops in
  // tests) can be reused at the same address by another op.
  *key += op.schema().name();
  *key += '\0';
  const bool pointwise = op.hasTag(at::Tag::pointwise);
  std::vector<const c10::StorageImpl*> storages;
  for (const c10::IValue& arg : args) {
    if (arg.isTensor()) {
      if (!putTensor(*key, arg.toTensor(), storages)) return false;
    } else if (arg.isTensorList()) {
      *key += 'L';
      put(*key, arg.toTensorList().size());
      for (const at::Tensor& t : arg.toTensorList()) {
        if (!putTensor(*key, t, storages)) return false;
      }
    } else if (arg.isOptionalTensorList()) {
      *key += 'O';
      for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
        if (!t.has_value()) {
          *key += 'n';
        } else if (!putTensor(*key, *t, storages)) {
          return false;
        }
      }
    } else if (arg.isNone()) {
      *key += 'N';
    } else if (arg.isInt()) {
      *key += 'I';
      put(*key, arg.toInt());
    } else if (arg.isDouble()) {
      *key += 'D';
      if (!pointwise) put(*key, arg.toDouble());
    } else if (arg.isBool()) {
      *key += arg.toBool() ? 'T' : 'F';
    } else if (arg.isIntList()) {
      *key += 'i';
      for (int64_t v : arg.toIntList()) put(*key, v);
      *key += ';';
    } else if (arg.isString()) {
      *key += 'S';
      *key += arg.toStringRef();
      *key += '\0';
    } else if (arg.isDevice()) {
      *key += 'V';
      put(*key, static_cast<int16_t>(arg.toDevice().type()));
      put(*key, static_cast<int16_t>(arg.toDevice().index()));
    } else if (arg.isBoolList()) {
      *key += 'b';
      for (bool v : arg.toBoolList()) *key += v ? '1' : '0';
      *key += ';';
    } else if (arg.isGenerator()) {
      *key += 'G';  // outputs do not depend on which generator draws
    } else if (arg.isComplexDouble()) {
      *key += 'Z';
      if (!pointwise) {
        const c10::complex<double> z = arg.toComplexDouble();
        put(*key, z.real());
        put(*key, z.imag());
      }
    } else if (arg.isDoubleList()) {
      *key += 'd';
      for (double v : arg.toDoubleList()) put(*key, v);
      *key += ';';
    } else {
      return false;  // other lists
    }
  }
  return true;
}

// Queues `op` with remembered outputs and puts its results on `stack`.
void runRemembered(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   const Remembered& remembered, c10::Device device) {
  const size_t num_args = op.schema().arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(stack, num_args);
  for (const ArgumentGeometry& resize : remembered.resizes) {
    resizeArgument(args[resize.index].toTensor(), resize.sizes, resize.strides,
                   resize.offset);
  }
  std::vector<at::Tensor> results;
  std::vector<std::pair<size_t, DeviceTensorRef>> fresh;
  for (size_t i = 0; i < remembered.outputs.size(); ++i) {
    const RememberedOutput& out = remembered.outputs[i];
    switch (out.kind) {
      case RememberedOutput::Kind::kUndefined:
        results.emplace_back();
        break;
      case RememberedOutput::Kind::kArgument:
        results.push_back(args[out.argument].toTensor());
        break;
      case RememberedOutput::Kind::kFresh:
        results.push_back(at::empty_strided(
            out.sizes, out.strides, at::TensorOptions(out.dtype).device(device)));
        fresh.emplace_back(i, DeviceTensorRef(results.back()));
        break;
    }
  }
  queueCpuKernel(op, args, std::move(fresh), device, remembered.wrong);
  torch::jit::drop(stack, num_args);
  size_t next = 0;
  for (int n : remembered.returns) {
    if (n == kNoneReturn) {
      stack->push_back(c10::IValue());
      ++next;
    } else if (n == kTensorReturn) {
      stack->push_back(results[next++]);
    } else {
      c10::List<at::Tensor> list;
      for (int i = 0; i < n; ++i) list.push_back(results[next++]);
      stack->push_back(std::move(list));
    }
  }
}

// Appends `values` (an op's results: tensors, tensor lists and Nones) to
// `out`'s returns and outputs; `classify` turns each defined tensor into an
// output, or returns false for one that cannot be remembered.
template <typename Classify>
bool rememberResults(c10::ArrayRef<c10::IValue> values, Remembered* out,
                     Classify&& classify) {
  for (const c10::IValue& value : values) {
    if (value.isNone()) {
      out->returns.push_back(kNoneReturn);
      out->outputs.emplace_back();  // kUndefined: keeps the flattened places
      continue;
    }
    if (value.isTensor()) {
      out->returns.push_back(kTensorReturn);
    } else if (value.isTensorList()) {
      out->returns.push_back(static_cast<int>(value.toTensorList().size()));
    } else {
      return false;
    }
    std::vector<at::Tensor> tensors;
    flatten(value, tensors);
    for (const at::Tensor& t : tensors) {
      RememberedOutput result;  // kUndefined
      if (t.defined() && !classify(t, &result)) return false;
      out->outputs.push_back(std::move(result));
    }
  }
  return true;
}

// The op's CPU kernel run once on the host, over zeroed host memory laid
// out like the arguments' device memory: the CPU's own answer for a call
// signature (outputs, and how it changes its arguments), found at the call
// and without waiting for the stream. Each phantom storage becomes one
// zeroed buffer covering the bytes the call's tensors span in it (calloc:
// pages nobody touches cost nothing), so views keep their overlaps; a
// tensor passed twice is one CPU tensor twice. Random ops draw from a
// fresh generator, not the device's or the CPU's. An error the kernel
// raises here is a property of the arguments (a dimension out of range, a
// dtype it refuses), or of zeros (an integer division by zero, pivots of
// 0): a second trial then runs on ones, and if that raises too the call
// takes the synchronous path, where the real data decides.
class TrialRun {
 public:
  // `ones`: every phantom tensor holds ones instead of zeros.
  TrialRun(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
           bool ones = false)
      : ones_(ones) {
    for (const c10::IValue& arg : args) {
      std::vector<at::Tensor> tensors;
      flatten(arg, tensors);
      if (arg.isOptionalTensorList()) {
        for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
          if (t.has_value()) tensors.push_back(*t);
        }
      }
      for (const at::Tensor& t : tensors) span(t);
    }
    int64_t total = 0;
    for (const auto& [key, buffer] : buffers_) {
      if (buffer.hi > buffer.lo) total += buffer.hi - buffer.lo;
    }
    if (total > kMaxBytes) {
      feasible_ = false;
      return;
    }
    for (auto& [key, buffer] : buffers_) allocate(buffer);
    stack_.reserve(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      // A random op draws from a fresh generator, given or not (None would
      // draw from the CPU's default one).
      stack_.push_back(isGeneratorArgument(schema.arguments()[i])
                           ? c10::IValue(at::detail::createCPUGenerator())
                           : trialOf(args[i]));
    }
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].isTensor() && isPhantom(args[i].toTensor()) &&
          args[i].toTensor().layout() == c10::kStrided) {
        const at::Tensor& trial = stack_[i].toTensor();
        before_.push_back(ArgumentGeometry::of(i, trial));
        arguments_.emplace_back(i, trial);
      }
    }
  }

  // Largest argument memory a trial copies (the buffers' total); a call
  // over more waits instead: the trial would cost as much as the kernel,
  // and a kernel that writes its arguments would fault in that much host
  // memory.
  static constexpr int64_t kMaxBytes = int64_t{64} << 20;

  // False when the arguments span more than kMaxBytes: no trial runs.
  bool feasible() const { return feasible_; }

  // Runs the CPU kernel; false (with its message) if it raised.
  bool run(const c10::OperatorHandle& op, std::string* error) {
    if (!supported_) {
      *error = "an argument is not a strided tensor";
      return false;
    }
    try {
      if (op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
        op.callBoxedForDispatchKey(c10::DispatchKey::CPU, stack_);
      } else {
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack_);
      }
    } catch (const c10::Error& e) {
      *error = e.what_without_backtrace();
      return false;
    } catch (const std::exception& e) {
      *error = e.what();
      return false;
    }
    return true;
  }

  // After run(): the CPU's answer, as queued work can carry it out; false
  // when it cannot (a result that is a view of an argument, an argument
  // whose storage or conj/neg bit the kernel changed).
  bool answer(Remembered* out) const {
    for (size_t k = 0; k < arguments_.size(); ++k) {
      const ArgumentGeometry& was = before_[k];
      const ArgumentGeometry now = ArgumentGeometry::of(was.index, arguments_[k].second);
      if (now.storage != was.storage || now.conj != was.conj || now.neg != was.neg) {
        return false;
      }
      if (now.sizes != was.sizes || now.strides != was.strides || now.offset != was.offset) {
        // Resized (out=), once per tensor; in device terms, undoing the
        // buffer's shift.
        const c10::TensorImpl* impl = arguments_[k].second.unsafeGetTensorImpl();
        if (std::none_of(arguments_.begin(), arguments_.begin() + k, [&](const auto& a) {
              return a.second.unsafeGetTensorImpl() == impl;
            })) {
          ArgumentGeometry resize = now;
          resize.offset += shifts_.at(impl);
          out->resizes.push_back(std::move(resize));
        }
      }
    }
    return rememberResults(stack_, out, [&](const at::Tensor& t, RememberedOutput* result) {
      for (const auto& [index, trial] : arguments_) {
        if (trial.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          *result = RememberedOutput::argumentAt(index);
          return true;
        }
      }
      if (t.layout() != c10::kStrided) return false;
      if (t.has_storage() && buffers_by_storage_.count(t.storage().unsafeGetStorageImpl())) {
        return false;  // a view of an argument
      }
      for (const c10::IValue& host : hosts_) {
        if (t.has_storage() && host.toTensor().has_storage() &&
            t.storage().is_alias_of(host.toTensor().storage())) {
          return false;  // a view of a host argument
        }
      }
      *result = RememberedOutput::freshLike(t);
      return true;
    });
  }

 private:
  struct Buffer {
    int64_t lo = std::numeric_limits<int64_t>::max();  // bytes
    int64_t hi = 0;
    c10::Storage storage;
  };

  static constexpr int64_t kAlignment = 64;

  static void fillWithOnes(const at::Tensor& t) {
    try {
      t.fill_(1);
    } catch (const std::exception&) {
      // An expanded view (overlapping elements) keeps its zeros.
    }
  }

  void span(const at::Tensor& t) {
    if (!isPhantom(t) || t.layout() != c10::kStrided) return;
    Buffer& buffer = buffers_[t.storage().unsafeGetStorageImpl()];
    if (t.numel() == 0) return;
    const int64_t itemsize = static_cast<int64_t>(t.dtype().itemsize());
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    buffer.lo = std::min(buffer.lo, t.storage_offset() * itemsize);
    buffer.hi = std::max(buffer.hi, (last + 1) * itemsize);
  }

  void allocate(Buffer& buffer) {
    if (buffer.hi <= buffer.lo) {
      buffer.lo = 0;
      buffer.hi = 0;
    }
    buffer.lo -= buffer.lo % kAlignment;
    const size_t nbytes = static_cast<size_t>(buffer.hi - buffer.lo);
    void* data = nbytes == 0 ? nullptr : std::calloc(nbytes, 1);
    TORCH_CHECK(nbytes == 0 || data != nullptr, "phantom: cannot allocate ",
                nbytes, " bytes of host memory for the trial run of a call");
    buffer.storage = c10::Storage(
        c10::Storage::use_byte_size_t(), nbytes,
        c10::DataPtr(data, data, &std::free, c10::Device(c10::kCPU)),
        c10::GetCPUAllocator(), /*resizable=*/true);
    buffers_by_storage_.insert(buffer.storage.unsafeGetStorageImpl());
  }

  at::Tensor trialOf(const at::Tensor& t) {
    if (!isPhantom(t)) {
      if (t.defined()) hosts_.emplace_back(t);
      return t;
    }
    const auto known = by_impl_.find(t.unsafeGetTensorImpl());
    if (known != by_impl_.end()) return known->second;
    at::Tensor trial;
    if (t.layout() != c10::kStrided) {
      supported_ = false;  // run() declines
      trial = t;
    } else {
      const Buffer& buffer = buffers_.at(t.storage().unsafeGetStorageImpl());
      const int64_t itemsize = static_cast<int64_t>(t.dtype().itemsize());
      const int64_t shift = t.numel() == 0 ? t.storage_offset() : buffer.lo / itemsize;
      trial = at::detail::make_tensor<c10::TensorImpl>(
          c10::Storage(buffer.storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
          t.dtype());
      trial.unsafeGetTensorImpl()->set_sizes_and_strides(
          t.sizes(), t.strides(), t.storage_offset() - shift);
      trial.unsafeGetTensorImpl()->_set_conj(t.is_conj());
      trial.unsafeGetTensorImpl()->_set_neg(t.is_neg());
      shifts_.emplace(trial.unsafeGetTensorImpl(), shift);
      if (ones_) fillWithOnes(trial);
    }
    by_impl_.emplace(t.unsafeGetTensorImpl(), trial);
    return trial;
  }

  c10::IValue trialOf(const c10::IValue& value) {
    if (std::optional<c10::IValue> mapped = mapTensors(
            value, [this](const at::Tensor& t) { return trialOf(t); })) {
      return *mapped;
    }
    if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return c10::Device(c10::kCPU);
    }
    return value;
  }

  std::unordered_map<const c10::StorageImpl*, Buffer> buffers_;  // by phantom storage
  std::unordered_set<const c10::StorageImpl*> buffers_by_storage_;  // trial storages
  std::unordered_map<const c10::TensorImpl*, at::Tensor> by_impl_;  // phantom -> trial
  std::unordered_map<const c10::TensorImpl*, int64_t> shifts_;  // trial -> offset shift
  std::vector<c10::IValue> hosts_;  // host tensors passed as they are
  std::vector<std::pair<size_t, at::Tensor>> arguments_;  // index, trial tensor
  std::vector<ArgumentGeometry> before_;  // of arguments_, before the run
  torch::jit::Stack stack_;
  bool ones_;
  bool feasible_ = true;
  bool supported_ = true;
};

// What the Meta kernel gave, as remembered outputs and resizes; false when
// it cannot be remembered (a view, an argument inside a list).
bool rememberable(const MetaMirror& mirror, c10::ArrayRef<c10::IValue> args,
                  const torch::jit::Stack& meta_stack, Remembered* out) {
  if (!mirror.resizes(args, &out->resizes)) return false;
  return rememberResults(meta_stack, out, [&](const at::Tensor& meta,
                                              RememberedOutput* result) {
    if (const at::Tensor* argument = mirror.argumentFor(meta)) {
      const size_t i = argumentIndexOf(args, *argument);
      *result = RememberedOutput::argumentAt(i);
      return i < args.size();
    }
    *result = RememberedOutput::freshLike(meta);
    return mirror.storageFor(meta) == nullptr;  // a view is not remembered
  });
}

// True when two answers are the same outputs and resizes.
bool sameAnswer(const Remembered& a, const Remembered& b) {
  if (a.returns != b.returns || a.outputs.size() != b.outputs.size() ||
      a.resizes.size() != b.resizes.size()) {
    return false;
  }
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    const RememberedOutput& x = a.outputs[i];
    const RememberedOutput& y = b.outputs[i];
    if (x.kind != y.kind || x.argument != y.argument || x.dtype != y.dtype ||
        x.sizes != y.sizes || x.strides != y.strides) {
      return false;
    }
  }
  for (size_t i = 0; i < a.resizes.size(); ++i) {
    if (a.resizes[i].index != b.resizes[i].index || a.resizes[i].sizes != b.resizes[i].sizes ||
        a.resizes[i].strides != b.resizes[i].strides ||
        a.resizes[i].offset != b.resizes[i].offset) {
      return false;
    }
  }
  return true;
}

bool debugMemo() {
  // Throws (on every call) if the value is malformed: phantom/Settings.h.
  static const bool on = switchSetting("PHANTOM_DEBUG_MEMO");
  return on;
}

// The CPU kernel's real `results` (of the synchronous path) as remembered
// outputs; false when they cannot be remembered (not tensors, or a view of
// an argument).
bool observed(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<c10::IValue> results,
              Remembered* out) {
  auto sharesArgumentStorage = [&](const at::Tensor& t) {
    for (const c10::IValue& arg : args) {
      std::vector<at::Tensor> tensors;
      flatten(arg, tensors);
      for (const at::Tensor& a : tensors) {
        if (a.defined() && a.has_storage() && t.storage().is_alias_of(a.storage())) {
          return true;
        }
      }
    }
    return false;
  };
  return rememberResults(results, out, [&](const at::Tensor& t,
                                           RememberedOutput* result) {
    if (t.layout() != c10::kStrided) return false;
    const size_t i = argumentIndexOf(args, t);
    if (i < args.size()) {
      *result = RememberedOutput::argumentAt(i);
      return true;
    }
    *result = RememberedOutput::freshLike(t);
    return !sharesArgumentStorage(t);
  });
}

}  // namespace

void verifyRemembered(const std::string& signature,
                      c10::ArrayRef<c10::IValue> args,
                      c10::ArrayRef<c10::IValue> results,
                      const std::vector<ArgumentGeometry>& before,
                      const std::vector<c10::Warning>& warnings) {
  std::lock_guard<std::mutex> lock(memoMutex());
  auto it = memo().find(signature);
  if (it == memo().end() || it->second.state != Remembered::State::kVerifying) {
    return;
  }
  Remembered& entry = it->second;
  for (const ArgumentGeometry& was : before) {
    // What the argument must look like now: resized as remembered, or as
    // it was, with the same bits and storage object either way.
    ArgumentGeometry want = was;
    for (const ArgumentGeometry& resize : entry.resizes) {
      if (resize.index == was.index) {
        want.sizes = resize.sizes;
        want.strides = resize.strides;
        want.offset = resize.offset;
      }
    }
    const ArgumentGeometry now = ArgumentGeometry::of(was.index, args[was.index].toTensor());
    if (now.sizes != want.sizes || now.strides != want.strides ||
        now.offset != want.offset || now.conj != want.conj ||
        now.neg != want.neg || now.storage != want.storage) {
      entry.state = Remembered::State::kWait;
      return;
    }
  }
  bool same = results.size() == entry.returns.size();
  std::vector<at::Tensor> real;
  for (size_t i = 0; same && i < results.size(); ++i) {
    const c10::IValue& value = results[i];
    if (entry.returns[i] == kNoneReturn) {
      same = value.isNone();
    } else if (entry.returns[i] == kTensorReturn) {
      same = value.isTensor();
    } else {
      same = value.isTensorList() &&
             value.toTensorList().size() == static_cast<size_t>(entry.returns[i]);
    }
    if (same) {
      flattenResults(value, real);
    }
  }
  same = same && real.size() == entry.outputs.size();
  for (size_t i = 0; same && i < real.size(); ++i) {
    const RememberedOutput& want = entry.outputs[i];
    const at::Tensor& got = real[i];
    switch (want.kind) {
      case RememberedOutput::Kind::kUndefined:
        same = !got.defined();
        break;
      case RememberedOutput::Kind::kArgument:
        same = got.defined() && args[want.argument].isTensor() &&
               args[want.argument].toTensor().unsafeGetTensorImpl() ==
                   got.unsafeGetTensorImpl();
        break;
      case RememberedOutput::Kind::kFresh:
        same = got.defined() && got.scalar_type() == want.dtype &&
               got.sizes() == c10::IntArrayRef(want.sizes) &&
               got.strides() == c10::IntArrayRef(want.strides);
        break;
    }
  }
  if (same && !entry.warnings_seen && !warnings.empty()) {
    // Queued calls will raise the warnings the kernel raises at every
    // call: one more waited call tells them from TORCH_WARN_ONCE's.
    entry.warnings = warnings;
    entry.warnings_seen = true;
    entry.state = Remembered::State::kConfirming;
    return;
  }
  if (same) {
    if (entry.warnings_seen) {
      entry.warnings = warningsRaisedAgain(entry.warnings, warnings);
    }
    entry.state = Remembered::State::kUsable;
    entry.wrong = std::make_shared<std::atomic<bool>>(false);
    return;
  }
  // The Meta kernel's answer was not the CPU's (or the CPU's changed from
  // one call to the next): the next call checks the CPU's answer against
  // the CPU's, once.
  Remembered cpu;
  if (!entry.from_cpu && observed(args, results, &cpu)) {
    entry.outputs = std::move(cpu.outputs);
    entry.returns = std::move(cpu.returns);
    entry.resizes.clear();  // an argument the CPU resized fails the next check
    entry.from_cpu = true;
    entry.warnings = warnings;  // the next call's run confirms them too
    entry.warnings_seen = true;
    entry.state = Remembered::State::kConfirming;
  } else {
    entry.state = Remembered::State::kWait;
  }
}

void forgetRemembered(const std::string& signature) noexcept {
  std::lock_guard<std::mutex> lock(memoMutex());
  memo().erase(signature);
}

const char* runGenericAsync(const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, c10::Device device,
                            std::string* verify_signature) {
  const c10::FunctionSchema& schema = op.schema();
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) {
    return "no Meta kernel to compute its outputs ahead";
  }
  for (const auto& ret : schema.returns()) {
    if (!isTensorType(ret.type())) {
      return "returns a value that is not a tensor";
    }
  }
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(stack, num_args);
  if (const char* reason = checksNeedTheData(op, args)) {
    return reason;  // HostChecks.h
  }

  // A Python Meta kernel, or a C++ one that falls short of the CPU kernel's
  // (HostChecks.h): its results are remembered per call signature, and
  // the first call with a signature gets a trial run.
  std::string signature;
  if (!hasNativeMetaKernel(op) || metaKernelFallsShort(op) ||
      hasFloat8Argument(args)) {
    constexpr const char* kPython =
        "its Meta kernel is Python (slower than waiting) and another thread "
        "is checking this call signature";
    if (!signatureOf(op, args, &signature)) {
      return "its Meta kernel is Python (slower than waiting) and an "
             "argument cannot be part of a remembered call signature";
    }
    std::optional<Remembered> usable;  // copied out: run without the lock
    {
      std::lock_guard<std::mutex> lock(memoMutex());
      auto it = memo().find(signature);
      if (it == memo().end()) {
        if (memo().size() >= kMaxRemembered) {
          memo().erase(memo().begin());
        }
        // First call: the Meta kernel's answer, checked against the CPU's.
      } else {
        Remembered& remembered = it->second;
        switch (remembered.state) {
          case Remembered::State::kWait:
            return "its Meta kernel cannot compute the outputs ahead for "
                   "this call signature (data-dependent, a view, or an argument "
                   "changed in a way queued work cannot carry back)";
          case Remembered::State::kVerifying:
            return kPython;  // another thread is checking this signature
          case Remembered::State::kConfirming:
            remembered.state = Remembered::State::kVerifying;
            if (verify_signature != nullptr) {
              *verify_signature = std::move(signature);
            }
            return "its Meta kernel disagrees with the CPU kernel for this "
                   "call signature (this call checks that the CPU kernel "
                   "repeats its outputs)";
          case Remembered::State::kUsable:
            if (remembered.wrong && remembered.wrong->load()) {
              remembered.state = Remembered::State::kWait;
              return "the CPU kernel's output shapes for this call signature "
                     "depend on the data (a queued call found other shapes "
                     "than remembered)";
            }
            usable = remembered;
            break;
        }
      }
    }
    if (usable) {
      runRemembered(op, stack, *usable, device);
      emitWarnings(usable->warnings);
      return nullptr;
    }
  }

  // 1. Outputs' metadata, from the Meta kernel.
  MetaMirror mirror;
  torch::jit::Stack meta_stack;
  WarningCapture meta_capture;
  bool meta_ran = false;
  // Runs the Meta kernel on mirrors of the arguments; the reason to wait
  // when it raises.
  const auto runMeta = [&]() -> const char* {
    meta_ran = true;
    meta_stack.reserve(num_args);
    for (size_t i = 0; i < num_args; ++i) {
      // A Python Meta kernel warns with Python's `warnings` when it resizes
      // a non-empty out= argument, which no WarningCapture sees, and the
      // trial run below raises the CPU kernel's own warning for it: an
      // empty mirror keeps the Python one from coming too. Its answer is
      // only kept when the trial cannot run, and is then checked against
      // the CPU's.
      const bool empty_out = !signature.empty() && schema.arguments()[i].is_out() &&
                             args[i].isTensor() && isPhantom(args[i].toTensor()) &&
                             args[i].toTensor().numel() > 0 &&
                             !sharesStorageWithAnother(args, i);
      meta_stack.push_back(empty_out ? c10::IValue(mirror.mirror(args[i].toTensor(), true))
                                     : mirror.mirror(args[i]));
    }
    // The Meta kernel's warnings are the CPU kernel's checks' (a C++ Meta
    // kernel is the CPU kernel's own meta function): delivered below when
    // nothing else runs the kernel on the host.
    try {
      op.callBoxedForDispatchKey(c10::DispatchKey::Meta, meta_stack);
    } catch (const std::exception&) {
      // Data-dependent shapes, or a Meta kernel stricter than the CPU's: the
      // synchronous path runs the CPU kernel and reports its real error.
      if (!signature.empty()) {
        std::lock_guard<std::mutex> lock(memoMutex());
        memo()[signature].state = Remembered::State::kWait;
      }
      return "its Meta kernel raised: the outputs depend on the data, or the "
             "arguments are refused (the CPU kernel then raises its own error)";
    }
    return nullptr;
  };
  // An op whose output shapes cannot depend on the data goes straight to
  // the trial run (HostChecks.h); any other learns that from its Meta kernel.
  if (signature.empty() || !shapesFollowFromArguments(op)) {
    if (const char* reason = runMeta()) {
      return reason;
    }
  }
  if (!signature.empty()) {
    // The outputs do not depend on the data (the Meta kernel ran without
    // raising, or the op's shapes follow from its arguments'). The CPU
    // kernel's answer for the signature comes from a trial run on the
    // host, and the call is queued with it.
    meta_capture.take();  // the trial run's warnings are the CPU kernel's
    std::string trial_error;
    Remembered cpu;
    std::optional<TrialRun> trial(std::in_place, schema, args);
    bool ran = false;
    bool ones = false;
    std::vector<c10::Warning> trial_warnings;
    if (!trial->feasible()) {
      trial_error = "the arguments span more than 64 MiB";
    } else {
      WarningCapture capture;
      if (!(ran = trial->run(op, &trial_error))) {
        capture.take();
        WarningCapture again;
        ones = true;
        trial.emplace(schema, args, /*ones=*/true);
        ran = trial->run(op, &trial_error);
        trial_warnings = again.take();
      } else {
        trial_warnings = capture.take();
      }
    }
    const bool usable = ran && trial->answer(&cpu);
    if (usable && !trial_warnings.empty()) {
      // Which of them the kernel raises at every call: a second run tells
      // TORCH_WARN from TORCH_WARN_ONCE, which is now spent.
      TrialRun second(schema, args, ones);
      WarningCapture capture;
      std::string ignored;
      second.run(op, &ignored);
      cpu.warnings = warningsRaisedAgain(trial_warnings, capture.take());
    }
    if (debugMemo() && meta_ran) {
      Remembered meta;
      const bool meta_ok = rememberable(mirror, args, meta_stack, &meta);
      if (!ran) {
        std::fprintf(stderr, "phantom: %s: %s%s\n", schema.name().c_str(),
                     trial->feasible() ? "the trial run raised: " : "no trial run: ",
                     trial_error.c_str());
      } else if (!usable || !meta_ok || !sameAnswer(meta, cpu)) {
        std::fprintf(stderr, "phantom: %s: the Meta kernel's answer is not the "
                     "CPU kernel's%s\n", schema.name().c_str(),
                     usable ? "" : " (and the CPU's cannot be queued)");
      }
    }
    if (usable) {
      cpu.state = Remembered::State::kUsable;
      cpu.from_cpu = true;
      cpu.wrong = std::make_shared<std::atomic<bool>>(false);
      {
        std::lock_guard<std::mutex> lock(memoMutex());
        memo()[signature] = cpu;
      }
      runRemembered(op, stack, cpu, device);
      emitWarnings(trial_warnings);
      return nullptr;
    }
    if (!ran && !meta_ran) {
      // The trial could not answer: the Meta kernel's answer is the one
      // the synchronous path checks against the CPU's.
      if (const char* reason = runMeta()) {
        return reason;
      }
    }
    Remembered remembered;
    const bool ok = ran ? false : rememberable(mirror, args, meta_stack, &remembered);
    std::lock_guard<std::mutex> lock(memoMutex());
    Remembered& entry = memo()[signature];
    entry = std::move(remembered);
    if (!ran) {
      // The real data decides: the synchronous path raises the CPU's error
      // at the call, or checks the Meta kernel's answer against the CPU's.
      entry.state = ok ? Remembered::State::kVerifying : Remembered::State::kWait;
      if (ok && verify_signature != nullptr) {
        *verify_signature = std::move(signature);
      }
      return trial->feasible()
                 ? "its Meta kernel is Python, and the CPU kernel raised on "
                   "trial runs with zeros and ones (the first call with a "
                   "signature then waits)"
                 : "its Meta kernel is Python, and the arguments are too large "
                   "for a trial run (over 64 MiB: the first call with a "
                   "signature then waits)";
    }
    entry.state = Remembered::State::kWait;
    return "the CPU kernel returns a view of an argument, or changes an "
           "argument in a way queued work cannot carry back (a conj bit)";
  }

  // 2. Outputs on the device, on the host, before anything runs.
  mirror.applyResizes();
  std::vector<at::Tensor> meta_results;
  flattenResults(meta_stack, meta_results);
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
  emitWarnings(meta_capture.take());

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
    } else if (value.isNone()) {
      stack->push_back(value);  // a `Tensor?` result; flattenResults gave it a place
      ++next;
    } else {
      stack->push_back(value);
    }
  }
  return nullptr;
}

}  // namespace phantom
