// The generic path's asynchronous half: run an op's CPU kernel over device
// memory as work queued on the current stream, and return before it has run.
// This file queues the work; the meta mirror that computes the outputs'
// metadata (MetaMirror.h), the remembered outputs (RememberedOutputs.h) and
// the trial run (TrialRun.h) are their own files.
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
// ~100-300 us with the GIL, far more than the CPU kernel, and its first
// call imports torch._dynamo and sympy) is not run per call: the outputs
// come from a trial run of the CPU kernel on the host, once per call
// signature, and are remembered (RememberedOutputs.h); that first call is
// queued as well. The Meta kernel runs only when nothing else shows that
// the outputs do not depend on the data (HostChecks.h, ShapeEvidence).
// Random ops are queued too: the device's generator is handed
// to the CPU kernel on the worker, and PhantomGeneratorImpl::queueDraw keeps
// the draws in the order the host called the ops (Generator.h), so phantom
// keeps drawing the CPU's numbers.
// Errors the CPU kernel raises (a bad index) surface at the next sync,
// naming the op, as a device-side error does on a GPU.
//
// The hottest elementwise ops (add, sub, mul, div, relu) do not come here
// in their common cases: they have native kernels (Elementwise.cpp).
#include <phantom/Generator.h>
#include <phantom/Generator.h>
#include <phantom/KernelAliases.h>
#include <phantom/KernelHostMemory.h>
#include <phantom/KernelThreads.h>
#include <phantom/KernelWarnings.h>
#include <phantom/Launch.h>
#include <phantom/Settings.h>
#include <phantom/Stream.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/HostChecks.h>
#include <phantom/ops/MetaMirror.h>
#include <phantom/ops/RememberedOutputs.h>
#include <phantom/ops/TrialRun.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace phantom {
namespace {

using namespace async_path;

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

  // Appends the device tensors this argument holds, in order.
  void collectRefs(c10::SmallVectorImpl<const DeviceTensorRef*>& out) const {
    for (const std::optional<DeviceTensorRef>& ref : refs) {
      if (ref) out.push_back(&*ref);
    }
  }

  // The argument as the CPU kernel receives it; its device tensors are
  // aliases[*next], aliases[*next + 1], ... (collectRefs's order).
  c10::IValue toKernel(c10::ArrayRef<at::Tensor> aliases, size_t* next) const {
    switch (kind) {
      case Kind::kValue:
        return value;
      case Kind::kTensor:
        return aliases[(*next)++];
      case Kind::kTensorList: {
        c10::List<at::Tensor> list;
        for (size_t i = 0; i < refs.size(); ++i) {
          list.push_back(refs[i] ? aliases[(*next)++] : hosts[i].toTensor());
        }
        return list;
      }
      case Kind::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (size_t i = 0; i < refs.size(); ++i) {
          if (refs[i]) {
            list.push_back(aliases[(*next)++]);
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

// True when the Meta kernel the dispatcher would run for `op` is a C++
// one. Python registrations show their .py file in the computed table, or
// a pseudo-file in angle brackets for code without one (`python -c`'s
// <string>, a notebook cell's <ipython-input-...>). Decided once per op.
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
             entry.find("registered at <") == std::string::npos &&
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
               wrong = std::move(wrong), one_thread,
               aliases = NodeAliases::forStream(stream)] {
    // Every device tensor: the arguments', in order, then the outputs.
    c10::SmallVector<const DeviceTensorRef*, 8> refs;
    for (const KernelArgument& arg : kernel_args) {
      arg.collectRefs(refs);
    }
    for (const auto& entry : fresh) {
      refs.push_back(&entry.second);
    }
    aliases.run(refs, [&](c10::ArrayRef<at::Tensor> aliased) {
      size_t next = 0;
      torch::jit::Stack kernel_stack;
      kernel_stack.reserve(kernel_args.size());
      for (const KernelArgument& arg : kernel_args) {
        kernel_stack.push_back(arg.toKernel(aliased, &next));
      }
      // Each large dense output's memory is offered to the kernel's
      // allocation of its size, so the result may be computed in place
      // (KernelHostMemory.h, "Lending").
      c10::SmallVector<at::Tensor, 4> outs;
      LendingScope lending;
      for (size_t i = 0; i < fresh.size(); ++i) {
        outs.push_back(aliased[next++]);
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
          // As the CPU's autograd kernel calls it: the ops the CPU kernel
          // calls skip autograd's and view tracking's kernels.
          const at::AutoDispatchBelowADInplaceOrView below_autograd;
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
    });
  };
  if (generator != nullptr) {
    generator->queueDraw(stream, [&] {
      launchAsync(stream, op.schema().name().c_str(), std::move(work));
    });
  } else {
    launchAsync(stream, op.schema().name().c_str(), std::move(work));
  }
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

}  // namespace

using namespace async_path;

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
  // An op whose output shapes are known not to depend on the data, or can
  // be checked not to by a second trial, goes straight to the trial run
  // (HostChecks.h); any other learns that from its Meta kernel.
  const ShapeEvidence evidence =
      signature.empty() ? ShapeEvidence::kMetaKernel : shapeEvidence(op, args);
  if (evidence == ShapeEvidence::kMetaKernel) {
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
    // After zeros raised: ones in floating-point tensors, and in integer
    // ones too only for an elementwise op, which uses no value as an index
    // (TrialRun.h, HostChecks.h).
    const int integer_ones = elementwise(op) ? 1 : 0;
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
        trial.emplace(schema, args, /*fill=*/1, integer_ones);
        ran = trial->run(op, &trial_error);
        trial_warnings = again.take();
      } else {
        trial_warnings = capture.take();
      }
    }
    const bool usable = ran && trial->answer(&cpu);
    if (usable && !meta_ran && trial->resizedAnArgumentItReads()) {
      // Queued work would resize the argument before the kernel reads it
      // (TrialRun::resizedAnArgumentItReads): the Meta kernel decides, as
      // for every op before trial runs could answer (addbmm_'s refuses a
      // self without the product's shape, and the call waits).
      if (const char* reason = runMeta()) {
        return reason;
      }
    }
    if (usable && !trial_warnings.empty()) {
      // Which of them the kernel raises at every call: a second run tells
      // TORCH_WARN from TORCH_WARN_ONCE, which is now spent.
      TrialRun second(schema, args, ones ? 1 : 0, ones ? integer_ones : 0);
      WarningCapture capture;
      std::string ignored;
      second.run(op, &ignored);
      cpu.warnings = warningsRaisedAgain(trial_warnings, capture.take());
    }
    if (usable && evidence == ShapeEvidence::kTwoTrials) {
      // The same answer on other floating-point data shows the outputs do
      // not depend on it (integer tensors stay zero; shapeEvidence let
      // through only ops whose integer values cannot shape the outputs);
      // a second trial that raises, or that could not vary every
      // floating-point tensor, shows nothing, and the Meta kernel decides
      // (its raising means: wait).
      TrialRun other(schema, args, /*fill=*/2, ones ? integer_ones : 0);
      WarningCapture dropped;  // the first trial's are the ones delivered
      std::string ignored;
      Remembered other_answer;
      if (!(other.varied() && other.run(op, &ignored) && other.answer(&other_answer))) {
        if (const char* reason = runMeta()) {
          return reason;
        }
      } else if (!sameAnswer(cpu, other_answer)) {
        if (debugMemo()) {
          std::fprintf(stderr, "phantom: %s: trial runs on other values gave "
                       "other outputs: the signature waits\n", schema.name().c_str());
        }
        std::lock_guard<std::mutex> lock(memoMutex());
        memo()[signature].state = Remembered::State::kWait;
        return "the CPU kernel's outputs for this call signature depend on "
               "the data (trial runs on other values gave other shapes)";
      }
    }
    if (debugMemo() && !ran) {
      std::fprintf(stderr, "phantom: %s: %s%s\n", schema.name().c_str(),
                   trial->feasible() ? "the trial run raised: " : "no trial run: ",
                   trial_error.c_str());
    } else if (debugMemo() && meta_ran) {
      Remembered meta;
      const bool meta_ok = rememberable(mirror, args, meta_stack, &meta);
      if (!usable || !meta_ok || !sameAnswer(meta, cpu)) {
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
