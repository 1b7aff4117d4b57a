// The two halves of the generic path (see Fallback.cpp and
// AsyncFallback.cpp). Internal to ops/.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace phantom {

inline bool isPhantom(const at::Tensor& tensor) {
  return tensor.defined() &&
         tensor.device().type() == c10::DeviceType::PrivateUse1;
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

// The boxed fallback for PrivateUse1 (Fallback.cpp): runs `op` by its CPU
// kernel over device memory, queued or waited for. Native kernels call it
// for the cases they decline.
void genericFallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                     torch::jit::Stack* stack);

// Queues `op` on the current stream of `device` and replaces its arguments
// on `stack` by its results. Returns nullptr on success, or (leaving the
// stack untouched) why the op has to take the synchronous path.
const char* runGenericAsync(const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, c10::Device device);

}  // namespace phantom
