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

// How the first call of an op with a call signature learns that the op's
// outputs (shapes, strides, dtypes) do not depend on the data, so that the
// trial run's answer can stand for every call with the signature. Torch's
// Python Meta kernels, the other witness, import torch._dynamo and sympy
// (close to a second) on their first call, so they are asked last.
enum class ShapeEvidence {
  // A pointwise op, or an in-place random fill (its result is its
  // argument): true by definition; the trial run's answer is taken.
  kByDefinition,
  // An aten op that ATen does not tag as data-dependent
  // (`dynamic_output_shape`, `data_dependent_output`, on the op or, for
  // an out= overload, on its functional overload): a second trial on
  // other floating-point data (twos, 2+2i in complex tensors) must give
  // the same answer. Trials keep integer and boolean tensors at zero
  // (TrialRun.h), so an op that reads one qualifies only when its integer
  // values cannot shape its outputs (integerValuesCannotShapeOutputs). If
  // the trials disagree the signature waits; if the second trial raises,
  // or could not vary every floating-point tensor, the Meta kernel
  // decides.
  kTwoTrials,
  // Anything else (a tagged op, an op of another library, whose tags
  // nobody checked, an op whose integer arguments may shape its outputs):
  // the Meta kernel must run without raising.
  kMetaKernel,
};
ShapeEvidence shapeEvidence(const c10::OperatorHandle& op,
                            c10::ArrayRef<c10::IValue> args);

// True for an op that computes each output element from the inputs'
// elements at the same place and so uses no value as an index or a
// length: ATen's `pointwise` tag, an in-place variant of a tagged op
// (`ne_`), or one of the few untagged ones (`floor_divide`, `rsub`).
bool elementwise(const c10::OperatorHandle& op);

// True for an op whose outputs' shapes cannot depend on the values of its
// integer and boolean tensor arguments: an in-place or elementwise op, or
// one of a list read from the ops' definitions (indices, class targets,
// masks, lengths and offsets counted by their shapes, integer data reduced
// or sorted).
bool integerValuesCannotShapeOutputs(const c10::OperatorHandle& op);

}  // namespace phantom
