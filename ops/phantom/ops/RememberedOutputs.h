// The generic path's asynchronous half, part 2: remembered outputs.
//
// In torch 2.13 most core ops have a Python Meta kernel, slower than
// waiting for the CPU kernel. But a program repeats itself: a training
// step calls the same ops on tensors of the same shapes every step. So for
// those ops the outputs' metadata is remembered per call signature (the
// op, every tensor argument's dtype, sizes, strides, offset and storage
// sharing, every other argument's value). The first call with a signature
// runs the CPU kernel once on the host over zeroed copies of the arguments
// (TrialRun), which gives the CPU's own outputs and the resizes it makes to
// out= arguments; the call is queued with them, and so are later ones.
// That the outputs do not depend on the data is known by definition
// (pointwise ops), or shown by a second trial on other floating-point
// values that gives the same answer (aten ops ATen does not tag as
// data-dependent, whose integer arguments, zeros in every trial, cannot
// shape the outputs), or else
// by the Python Meta kernel running without raising (HostChecks.h,
// ShapeEvidence); if the trials disagree or the Meta kernel raises, the
// call waits. The Meta kernel comes last because torch's Python Meta
// kernels import torch._dynamo and sympy on their first call.
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
// When the trial raises on zeros and on ones (in floating-point tensors)
// too (a singular matrix), or
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
// Arguments the CPU kernel refuses are not in the memo: a remembered
// signature passed the trial run (or the Meta kernel's checks) before.
#pragma once

#include <phantom/ops/GenericPath.h>
#include <phantom/ops/MetaMirror.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace phantom {
namespace async_path {

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

// The memo: call signature -> what is remembered for it, under memoMutex().
std::mutex& memoMutex();
std::unordered_map<std::string, Remembered>& memo();

// The call signature of `op` on `args`, or false for an argument kind the
// memo does not know, or a host mask (then the call waits, as without it).
// For a pointwise op (ATen's `pointwise` tag: outputs broadcast from the
// tensor inputs) a floating-point scalar counts by its kind, not its
// value, which cannot change the outputs: Adam's addcdiv_ takes a new step
// size every step.
bool signatureOf(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                 std::string* key);

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

// What the Meta kernel gave, as remembered outputs and resizes; false when
// it cannot be remembered (a view, an argument inside a list).
bool rememberable(const MetaMirror& mirror, c10::ArrayRef<c10::IValue> args,
                  const torch::jit::Stack& meta_stack, Remembered* out);

// True when two answers are the same outputs and resizes.
bool sameAnswer(const Remembered& a, const Remembered& b);

// PHANTOM_DEBUG_MEMO: compare the Meta kernel's answer with the trial's.
bool debugMemo();

// The CPU kernel's real `results` (of the synchronous path) as remembered
// outputs; false when they cannot be remembered (not tensors, or a view of
// an argument).
bool observed(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<c10::IValue> results,
              Remembered* out);

}  // namespace async_path
}  // namespace phantom
