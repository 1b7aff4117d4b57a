// The generic path: an op's CPU kernel run over device memory. Its
// synchronous half (Fallback.cpp), its asynchronous half
// (AsyncFallback.cpp, with MetaMirror.cpp and RememberedOutputs.cpp) and
// the copying fallback for drivers without a kernel view
// (CopyingFallback.cpp). Internal to ops/; the machinery they run kernels
// with is the CPU-kernel execution layer's (device/hostexec).
#pragma once

#include <phantom/Generator.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace phantom {

inline bool isPhantom(const at::Tensor& tensor) {
  return tensor.defined() &&
         tensor.device().type() == c10::DeviceType::PrivateUse1;
}

// A phantom tensor a native kernel can take as it is: strided, with no
// lazy conjugation or negation bits, and not float8 (the CPU computes few
// ops in float8 and refuses the rest in its kernels, past every Meta
// check: the generic path's trial run raises that at the call,
// HostChecks.h).
inline bool isPlainPhantom(const at::Tensor& tensor) {
  return isPhantom(tensor) && tensor.layout() == c10::kStrided &&
         !tensor.is_conj() && !tensor.is_neg() &&
         !c10::isFloat8Type(tensor.scalar_type());
}

// A meta tensor with `tensor`'s sizes, strides and dtype (no memory): what
// ATen's C++ meta functions (at::meta::<op>) take to compute an op's
// outputs.
inline at::Tensor metaLike(const at::Tensor& tensor) {
  return at::detail::empty_strided_meta(tensor.sizes(), tensor.strides(),
                                        tensor.scalar_type(), std::nullopt,
                                        std::nullopt, std::nullopt);
}

// True for a `Generator` or `Generator?` argument.
inline bool isGeneratorArgument(const c10::Argument& argument) {
  const c10::TypePtr& type = argument.type();
  if (type->kind() == c10::TypeKind::GeneratorType) {
    return true;
  }
  const auto optional = type->cast<c10::OptionalType>();
  return optional &&
         optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// `value` with `f` applied to each tensor in it, for a tensor or a list of
// tensors or of optional tensors (None stays None); nullopt for a value of
// any other kind.
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
      list.push_back(t.has_value() ? std::optional<at::Tensor>(f(*t))
                                   : std::nullopt);
    }
    return c10::IValue(std::move(list));
  }
  return std::nullopt;
}

// An op's argument `arg` as its CPU kernel takes it, on device `device`:
// each phantom tensor in it (alone or in a list) becomes `to_host(tensor)`,
// a CPU tensor with its contents (an alias of its device memory in the
// kernel view, or a host copy without one); the Generator? argument
// becomes the CPU generator behind the device's; a phantom device becomes
// the CPU; everything else is passed as it is.
template <typename ToHost>
c10::IValue cpuKernelArgument(const c10::IValue& arg,
                              const c10::Argument& schema_arg,
                              c10::DeviceIndex device, ToHost&& to_host) {
  if (isGeneratorArgument(schema_arg)) {
    std::optional<at::Generator> generator;
    if (arg.isGenerator()) {
      generator = arg.toGenerator();
    }
    return cpuGeneratorFor(generator, device);
  }
  if (std::optional<c10::IValue> mapped =
          mapTensors(arg, [&](const at::Tensor& t) -> at::Tensor {
            return isPhantom(t) ? to_host(t) : t;
          })) {
    return *std::move(mapped);
  }
  if (arg.isDevice() && arg.toDevice().type() == c10::DeviceType::PrivateUse1) {
    return c10::Device(c10::kCPU);
  }
  return arg;
}

// Raises the error for an op given tensors of two devices `a` and `b`
// (Fallback.cpp): the dense and sparse paths refuse mixed devices alike.
[[noreturn]] void failMixedDevices(const c10::OperatorHandle& op,
                                   const c10::Device& a, const c10::Device& b);

// The boxed fallback for PrivateUse1 (Fallback.cpp): runs `op` by its CPU
// kernel over device memory, queued or waited for. Native kernels call it
// for the cases they decline.
void genericFallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                     torch::jit::Stack* stack);

// Whether the driver offers the kernel view (ph_kernel_address). Without
// it ops run through the copying CPU fallback (CopyingFallback.cpp).
bool kernelViewAvailable();

// The copying CPU fallback: runs `op` (its arguments on `stack`, all on
// `device`) by its CPU kernel over host copies of the device memory it
// uses, copying written arguments back; replaces the arguments by the
// results. `composite_cpu_kernel`: see genericFallback.
void runCopyingFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::Device device, bool composite_cpu_kernel);

// An op without a CPU kernel that the copying mode computes with another
// CPU op (convolution_overrideable and its backward: aten::convolution).
bool hasHostEquivalent(const c10::OperatorName& name);

// Without a kernel view, once per process: every aten op whose phantom
// kernel queues a CPU kernel over the kernel view is re-registered to the
// generic path. Called before the first phantom tensor is allocated.
void stepAsideWithoutKernelView();

// Runs the op `name`.`overload` through genericFallback with the boxed
// arguments on `stack` (its results replace them). For native kernels'
// declined cases; looks the op up by name, so not for hot paths.
inline void runGenericBoxed(const char* name, const char* overload,
                            torch::jit::Stack* stack) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  genericFallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                  stack);
}

template <typename... Args>
torch::jit::Stack boxArguments(Args&&... args) {
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (stack.emplace_back(std::forward<Args>(args)), ...);
  return stack;
}

// A tensor argument's metadata a call may change: an out= argument's
// geometry, a conj or neg bit, its storage.
struct ArgumentGeometry {
  size_t index = 0;  // among the op's arguments
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  bool conj = false;
  bool neg = false;
  const c10::StorageImpl* storage = nullptr;

  static ArgumentGeometry of(size_t index, const at::Tensor& t) {
    ArgumentGeometry g;
    g.index = index;
    g.sizes.assign(t.sizes().begin(), t.sizes().end());
    g.strides.assign(t.strides().begin(), t.strides().end());
    g.offset = t.storage_offset();
    g.conj = t.is_conj();
    g.neg = t.is_neg();
    g.storage = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    return g;
  }
};

// The metadata of each phantom tensor argument (not those inside lists).
inline std::vector<ArgumentGeometry> argumentGeometries(
    c10::ArrayRef<c10::IValue> args) {
  std::vector<ArgumentGeometry> result;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].isTensor() && isPhantom(args[i].toTensor()) &&
        args[i].toTensor().layout() == c10::kStrided) {
      result.push_back(ArgumentGeometry::of(i, args[i].toTensor()));
    }
  }
  return result;
}

// Queues `op` on the current stream of `device` and replaces its arguments
// on `stack` by its results. Returns nullptr on success, or (leaving the
// stack untouched) why the op has to take the synchronous path.
// When it declines but wants the synchronous path's results checked
// against a remembered Meta answer (AsyncFallback.cpp, "Remembered
// outputs"), it sets *verify_signature; the caller then passes the results
// to verifyRemembered.
const char* runGenericAsync(const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, c10::Device device,
                            std::string* verify_signature);
// `before`: argumentGeometries(args) before the call. A change the
// remembered answer did not predict (linalg_lu_solve(left=False) sets the
// conj bit of its out= argument) cannot be carried back by queued work, so
// the signature then keeps waiting. `warnings`: the ones the call raised
// (queued calls raise those the kernel raises at every call).
void verifyRemembered(const std::string& signature,
                      c10::ArrayRef<c10::IValue> args,
                      c10::ArrayRef<c10::IValue> results,
                      const std::vector<ArgumentGeometry>& before,
                      const std::vector<c10::Warning>& warnings);
// The call that was to check `signature` raised: forget the signature.
void forgetRemembered(const std::string& signature) noexcept;

}  // namespace phantom
