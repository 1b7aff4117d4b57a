// The generic path: every ATen op without a phantom kernel of its own runs
// here, by running the op's CPU kernel over the device memory.
//
// The boxed fallback registered for PrivateUse1 receives the op's
// arguments, checks that all tensors are on one phantom device (CPU
// scalars, i.e. 0-dim tensors, are allowed as on CUDA), and queues work on
// that device's current stream which
//   1. turns each phantom tensor into a CPU alias of its device memory
//      (KernelAliases: zero-copy, views and aliasing preserved),
//   2. hands `Generator?` arguments the device generator's CPU generator,
//      so phantom draws exactly the CPU's random numbers (after the draws
//      queued before, see Generator.h),
//   3. calls the op's CPU kernel, and
//   4. maps each result back: a result living in an argument's storage is
//      that argument (in-place and out= ops) or a phantom view of it (view
//      ops); a result the CPU kernel allocated is moved into a new phantom
//      tensor, on the worker, before the host sees it.
// That is the synchronous half: the host waits for the work
// (launchAndWait), which is right for every op, including those whose
// output shape depends on data, and exceptions from the CPU kernel reach
// the caller unchanged. Most ops first try the asynchronous half
// (AsyncFallback.cpp), which only queues the work; PHANTOM_SYNC_GENERIC=1
// turns that off (a debugging aid: every generic op then waits). Which
// half each op took is counted (OpsReport.h). A driver without a kernel
// view gets neither: its ops run on host copies (CopyingFallback.cpp).
#include <phantom/Launch.h>
#include <phantom/Settings.h>
#include <phantom/Generator.h>
#include <phantom/Stream.h>
#include <phantom/SyncDebug.h>
#include <phantom/BoundsCheck.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/KernelAliases.h>
#include <phantom/KernelWarnings.h>
#include <phantom/ops/OpsReport.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace phantom {

[[noreturn]] void failMixedDevices(const c10::OperatorHandle& op,
                                   const c10::Device& a, const c10::Device& b) {
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ", a, " and ", b, " (in ", op.schema().name(),
              "). Move them to one device first, e.g. with tensor.to(\"", a,
              "\")");
}

namespace {

// Ops that, like on CUDA, accept CPU index tensors next to device tensors.
bool acceptsHostIndices(const c10::OperatorName& name) {
  return name.name == "aten::index" || name.name == "aten::index_put_" ||
         name.name == "aten::_index_put_impl_" || name.name == "aten::index_put";
}

// TorchScript's interpreter passes a `Tensor?[]` argument (the indices of
// `x[mask] = v`) as a list whose element type is its own `Tensor?` type
// object, which IValue::isOptionalTensorList() does not recognise: it
// compares the type object with c10's own. Every step of the generic path
// (device check, aliases, Meta mirrors, trial runs, signatures) then took
// the list for a plain value and handed phantom tensors to the CPU kernel,
// which ran `nonzero` on phantom from inside device work. The arguments
// are rebuilt as the lists eager mode passes, once, on entry.
void normalizeTensorLists(const c10::FunctionSchema& schema,
                          torch::jit::Stack* stack) {
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& arg = (*stack)[first + i];
    if (!arg.isList() || arg.isTensorList() || arg.isOptionalTensorList()) {
      continue;
    }
    const auto list_type = schema.arguments()[i].type()->cast<c10::ListType>();
    if (!list_type) {
      continue;
    }
    const c10::TypePtr& element = list_type->getElementType();
    const auto optional = element->cast<c10::OptionalType>();
    if (optional &&
        optional->getElementType()->kind() == c10::TypeKind::TensorType) {
      c10::List<std::optional<at::Tensor>> list;
      for (const c10::IValue& item : arg.toListRef()) {
        list.push_back(item.isNone() ? std::nullopt
                                     : std::optional<at::Tensor>(item.toTensor()));
      }
      arg = std::move(list);
    } else if (element->kind() == c10::TypeKind::TensorType) {
      c10::List<at::Tensor> list;
      for (const c10::IValue& item : arg.toListRef()) {
        list.push_back(item.toTensor());
      }
      arg = std::move(list);
    }
  }
}

// Finds the phantom device an op runs on and rejects mixed devices.
class DeviceChecker {
 public:
  explicit DeviceChecker(const c10::OperatorHandle& op) : op_(op) {}

  void visit(const at::Tensor& tensor, bool host_indices_allowed) {
    if (!tensor.defined()) {
      return;
    }
    const c10::Device device = tensor.device();
    if (device.type() == c10::DeviceType::PrivateUse1) {
      checkInsideStorage(tensor, op_.schema().name().c_str());
      if (!device_) {
        device_ = device;
      } else if (*device_ != device) {
        fail(*device_, device);
      }
      return;
    }
    if (device.is_cpu() && (tensor.dim() == 0 || host_indices_allowed)) {
      return;  // CPU scalars are values, not memory on another device
    }
    other_ = device;
  }

  void visitGenerator(const at::Generator& generator) {
    if (generator.defined() &&
        generator.device().type() == c10::DeviceType::PrivateUse1) {
      generator_device_ = generator.device();
    }
  }

  void visitDevice(const c10::Device& device) {
    if (device.type() == c10::DeviceType::PrivateUse1 && !device_) {
      device_ = device;
    }
  }

  c10::Device result() const {
    // Like CUDA: a phantom generator handed to an op on CPU tensors.
    TORCH_CHECK(device_.has_value() || !generator_device_.has_value(),
                "Expected a 'cpu' device type for generator but found '",
                generator_device_.value_or(c10::Device(c10::kCPU)), "' (in ",
                op_.schema().name(), ")");
    TORCH_CHECK(device_.has_value(), op_.schema().name(),
                " was dispatched to phantom but has no phantom tensor or "
                "device argument");
    if (other_) {
      fail(*device_, *other_);
    }
    return *device_;
  }

 private:
  [[noreturn]] void fail(const c10::Device& a, const c10::Device& b) const {
    failMixedDevices(op_, a, b);
  }

  const c10::OperatorHandle& op_;
  std::optional<c10::Device> device_;
  std::optional<c10::Device> other_;
  std::optional<c10::Device> generator_device_;
};

c10::Device findDevice(const c10::OperatorHandle& op,
                       c10::ArrayRef<c10::IValue> args) {
  DeviceChecker checker(op);
  const bool host_indices = acceptsHostIndices(op.operator_name());
  const auto& schema_args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& arg = args[i];
    const bool indices = host_indices && schema_args[i].name() == "indices";
    if (arg.isTensor()) {
      checker.visit(arg.toTensor(), indices);
    } else if (arg.isTensorList()) {
      for (const at::Tensor& t : arg.toTensorList()) {
        checker.visit(t, indices);
      }
    } else if (arg.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : arg.toOptionalTensorList()) {
        if (t.has_value()) {
          checker.visit(*t, indices);
        }
      }
    } else if (arg.isDevice()) {
      checker.visitDevice(arg.toDevice());
    } else if (arg.isGenerator()) {
      checker.visitGenerator(arg.toGenerator());
    }
  }
  return checker.result();
}

// A CPU result becomes a phantom tensor (see the file comment, step 4).
class ResultMapper {
 public:
  ResultMapper(const KernelAliases& aliases,
               c10::ArrayRef<c10::IValue> phantom_args, c10::Device device)
      : aliases_(aliases), device_(device) {
    for (const c10::IValue& arg : phantom_args) {
      if (arg.isTensor() && isPhantom(arg.toTensor())) {
        inputs_.push_back(arg.toTensor());
      } else if (arg.isTensorList()) {
        for (const at::Tensor& t : arg.toTensorList()) {
          if (isPhantom(t)) {
            inputs_.push_back(t);
          }
        }
      }
    }
  }

  c10::IValue map(const c10::IValue& result) const {
    if (result.isTensor()) {
      return mapTensor(result.toTensor());
    }
    if (result.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : result.toTensorList()) {
        list.push_back(mapTensor(t));
      }
      return list;
    }
    return result;
  }

 private:
  at::Tensor mapTensor(const at::Tensor& cpu) const {
    if (!cpu.defined() || !cpu.device().is_cpu()) {
      return cpu;
    }
    if (const c10::Storage* storage = aliases_.phantomStorageOf(cpu)) {
      for (const at::Tensor& input : inputs_) {
        if (input.storage().is_alias_of(*storage) &&
            input.sizes() == cpu.sizes() && input.strides() == cpu.strides() &&
            input.storage_offset() == cpu.storage_offset() &&
            input.dtype() == cpu.dtype()) {
          return input;  // in-place or out=: the argument itself
        }
      }
      return phantomViewLike(*storage, cpu);
    }
    // Memory the CPU kernel allocated: move it to the device.
    return newDeviceTensorFrom(cpu, device_);
  }

  const KernelAliases& aliases_;
  c10::Device device_;
  std::vector<at::Tensor> inputs_;
};

}  // namespace

void genericFallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                     torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  TORCH_CHECK_NOT_IMPLEMENTED(
      op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU) ||
          (!kernelViewAvailable() && hasHostEquivalent(op.operator_name())),
      schema.name(), " has no phantom kernel, and no CPU kernel for phantom's "
      "generic path to run; it is not supported on phantom yet");
  normalizeTensorLists(schema, stack);
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(stack, num_args);
  const c10::Device device = findDevice(op, args);
  const c10::DeviceGuard guard(device);
  // Throws (on every call) if the value is malformed: phantom/Settings.h.
  static const bool force_sync = switchSetting("PHANTOM_SYNC_GENERIC");
  // An op whose CPU entry is a composite kernel (registered for every
  // backend, not for CPU: addr_, mode.values, conj_physical_; see the
  // bottom of this file) has to be called through the dispatch table.
  const bool composite_cpu_kernel =
      !op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
  if (!kernelViewAvailable()) {
    runCopyingFallback(op, stack, device, composite_cpu_kernel);
    return;
  }
  const char* sync_reason = "PHANTOM_SYNC_GENERIC=1";
  std::string verify_signature;  // set when the results check a Meta answer
  if (!force_sync) {
    sync_reason = runGenericAsync(op, stack, device, &verify_signature);
    if (sync_reason == nullptr) {
      recordOpPath(schema.name(), OpPath::kGenericAsync);
      return;
    }
  }
  // torch.phantom.set_sync_debug_mode: warn, or refuse before anything
  // is counted, waited for or run.
  noteHostWait(schema.name().c_str(), sync_reason);
  recordOpPath(schema.name(), OpPath::kGenericSync, sync_reason);
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  for (size_t i = 0; i < num_args; ++i) {
    if (isGeneratorArgument(schema.arguments()[i])) {
      // Draws queued before this one (perhaps on another stream) come first.
      std::optional<at::Generator> given;
      if (args[i].isGenerator()) {
        given = args[i].toGenerator();
      }
      phantomGeneratorFor(given, device.index())->waitForQueuedDraws();
    }
  }

  std::vector<ArgumentGeometry> before;  // to check a remembered answer
  if (!verify_signature.empty()) {
    before = argumentGeometries(args);
  }
  std::vector<c10::IValue> results;
  // A call that checks a remembered answer and raises leaves nothing to
  // check: the signature is forgotten, so the next call checks it again.
  struct ForgetOnThrow {
    const std::string& signature;
    bool armed = true;
    ~ForgetOnThrow() {
      if (armed && !signature.empty()) forgetRemembered(signature);
    }
  } forget_on_throw{verify_signature};
  // The kernel's warnings, raised on the calling thread after the wait:
  // the work may run on the stream's worker (KernelWarnings.cpp).
  std::vector<c10::Warning> warnings;
  launchAndWait(stream, schema.name().c_str(), [&] {
    WarningCapture capture;
    KernelAliases aliases;
    torch::jit::Stack kernel_stack;
    kernel_stack.reserve(num_args);
    for (size_t i = 0; i < num_args; ++i) {
      kernel_stack.push_back(cpuKernelArgument(
          args[i], schema.arguments()[i], device.index(),
          [&](const at::Tensor& t) { return aliases.alias(t); }));
    }
    if (composite_cpu_kernel) {
      // callBoxedForDispatchKey only finds kernels registered for CPU
      // itself; the dispatch table also holds the composite one.
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU),
                         &kernel_stack);
    } else {
      op.callBoxedForDispatchKey(c10::DispatchKey::CPU, kernel_stack);
    }
    warnings = capture.take();
    aliases.writeBack();
    const ResultMapper mapper(aliases, args, device);
    results.reserve(kernel_stack.size());
    for (const c10::IValue& result : kernel_stack) {
      results.push_back(mapper.map(result));
    }
  });
  forget_on_throw.armed = false;
  emitWarnings(warnings);
  if (!verify_signature.empty()) {
    verifyRemembered(verify_signature, args, results, before, warnings);
  }
  torch::jit::drop(stack, num_args);
  for (c10::IValue& result : results) {
    stack->push_back(std::move(result));
  }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&genericFallback>());
}

// Ops whose CompositeExplicitAutograd kernel would otherwise be chosen for
// PrivateUse1 over the boxed fallback (a backend-specific kernel wins over
// the fallback, and a CompositeExplicitAutograd kernel counts as one for
// every backend). Route them to the CPU kernel like every other op:
//   native_group_norm, addr, addr.out: a decomposition
//     into many small ops, slower and not bit-identical to the CPU's fused
//     kernel (addr on float16/bfloat16 rounds each step: 1 ulp off);
//   addr_: its composite calls addr.out(self, out=self), and the CPU
//     kernel tells in-place from out= by the address of the Tensor object
//     (a 0-d self must then raise, not be resized to the outer product),
//     which no boxed call can carry; run on the CPU aliases, the composite
//     passes the one alias twice, as on the CPU;
//   mode.values: checks that the device is CPU, CUDA or XPU and refuses
//     phantom; its CPU kernel is this very composite, which on CPU aliases
//     passes the check;
//   conj_physical_: calls a DispatchStub directly with phantom tensors,
//     which has no phantom entry ("DispatchStub: missing kernel");
//   mse_loss, smooth_l1_loss: the composite allocates the 0-d result of a
//     reduced loss and calls the .out op, whose CPU kernel first gives its
//     output the inputs' shape, so it warns that "an output with one or
//     more elements was resized" at every call, which the CPU's own call
//     never does;
//   index_reduce(_), scatter(_).reduce, scatter(_).value_reduce:
//     structured ops, whose CompositeExplicitAutogradNonFunctional kernel
//     runs the meta function on phantom tensors and then calls the .out
//     op, whose CPU kernel runs it again: each warning of the meta
//     function (scatter's reduce argument is deprecated) came twice.
//     (index.Tensor, the same case, has a native kernel, Indexing.cpp,
//     which sends the calls it declines, masks among them, here.)
// The generic path runs each op's computed CPU kernel, which for the ops
// without a CPU kernel of their own is the same composite, over CPU aliases.
// (native_layer_norm has a native kernel, LayerNorm.cpp, which sends the
// cases it declines here.)
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name :
       {"native_group_norm", "addr", "addr.out",
        "addr_", "mode.values", "conj_physical_", "mse_loss",
        "smooth_l1_loss", "index_reduce", "index_reduce_",
        "scatter.reduce", "scatter_.reduce", "scatter.value_reduce",
        "scatter_.value_reduce"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&genericFallback>());
  }
}

}  // namespace phantom
