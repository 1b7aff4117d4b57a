// Which calls of the generic path cannot have their argument checks done
// by a Meta kernel on the host, and what the generic path does instead
// (HostChecks.cpp). Internal to ops/.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace phantom {

// True for an op whose C++ Meta kernel does not do at the call what its
// CPU kernel does: it accepts arguments the CPU kernel refuses
// (`_index_put_impl_`'s checks nothing), or the CPU kernel warns in its
// body (`index_reduce`). Such an op is treated as ops with a Python Meta
// kernel are: a trial run of the CPU kernel on the host, once per call
// signature, raises the CPU's error and warnings at the call.
bool metaKernelFallsShort(const c10::OperatorHandle& op);

// True when a tensor argument is float8: the CPU kernels of most ops refuse
// float8 in their dtype dispatch, which no Meta kernel checks, so such a
// call gets the trial run too.
bool hasFloat8Argument(c10::ArrayRef<c10::IValue> args);

// Why this call must wait for its data before its arguments can be
// checked (an index_put with a boolean mask: the value's shape is checked
// against the mask's count of True), or nullptr. Such a call takes the
// synchronous half, as CUDA synchronizes to count the mask.
const char* checksNeedTheData(const c10::OperatorHandle& op,
                              c10::ArrayRef<c10::IValue> args);

// True for an op whose outputs' shapes follow from its arguments' shapes
// whatever the data: a pointwise op, or an in-place random fill (its result
// is its argument). The first call of such an op with a call signature
// needs no Python Meta kernel to show that its outputs do not depend on the
// data; the trial run's answer is taken directly, and the Meta kernel runs
// only when the trial cannot answer. (Torch's Python Meta kernels for
// pointwise ops import torch._dynamo and sympy on their first call.)
bool shapesFollowFromArguments(const c10::OperatorHandle& op);

}  // namespace phantom
