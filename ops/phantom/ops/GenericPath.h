// The two halves of the generic path (see Fallback.cpp and
// AsyncFallback.cpp). Internal to ops/.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace phantom {

// Queues `op` on the current stream of `device` and replaces its arguments
// on `stack` by its results. Returns nullptr on success, or (leaving the
// stack untouched) why the op has to take the synchronous path.
const char* runGenericAsync(const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, c10::Device device);

}  // namespace phantom
