// Whether the CPU kernel behind a native kernel accepts a call, known at
// the call. Internal to ops/.
//
// A native kernel queues the CPU's implementation of its op (at::cpu::
// <op>_out, the CPU's foreach loop, ...) to run later on a stream. Whatever
// that implementation refuses must be refused at the call, with the CPU's
// exception and message: queued, the refusal would surface at the next
// sync as a device error, and the results would read as garbage. The C++
// meta functions make the CPU's checks of shapes and of most arguments, but
// the implementations check dtypes themselves: `mm` of float and int64
// ("expected m1 and m2 to have the same dtype"), a kernel dispatched over
// fewer dtypes than the op's meta function lets through (`add` of float8,
// `mm` of bool: "... not implemented for 'Bool'"), a Scalar that overflows
// the dtype it is converted to (`add(half, half, alpha=1e10)`).
//
// So a native kernel describes the part of a call that decides such checks
// (CallSignature: each tensor's dtype and number of dimensions, each
// scalar's kind, the other arguments' values), and asks admits(): the
// first time a signature is seen, a probe runs the CPU implementation on
// the host over tiny tensors of the same dtypes and dimensions (sizes 0,
// 1 and 2, see probeTensor) and the same other arguments; whether it raised
// is remembered for the signature. A signature the CPU refuses is declined:
// the native kernel sends the call to the generic path, which raises the
// CPU's own error at the call (its trial run) or, where the refusal came
// from the small sizes only, computes the CPU's result. Values of Scalars
// are not part of the signature; scalarsFit() declines the values that
// would not convert to a dtype of the call, which is what the CPU checks
// of them.
//
// What stays possible: an implementation that refuses a dtype only for
// some sizes the probe does not have, or a value-dependent check other than
// conversion. Data-dependent errors (an index out of range) are device
// errors on every accelerator and are not checked here.
#pragma once

#include <phantom/KernelThreads.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace phantom {

// The signature of a call as far as the CPU implementation's checks beyond
// shapes go. Built per call: appends a few bytes per argument.
class CallSignature {
 public:
  // Undefined, or dtype, number of dimensions and which have size 0 or 1,
  // CPU or not, and whether a CPU scalar is a wrapped Python number (it
  // promotes differently).
  CallSignature& tensor(const at::Tensor& t);
  CallSignature& tensor(const std::optional<at::Tensor>& t);
  // The distinct dtypes of a list (foreach ops: their CPU loop accepts a
  // list when it accepts each of its dtypes).
  CallSignature& dtypesOf(at::TensorList list);
  // A Scalar's kind (bool, integral, floating, complex), not its value.
  CallSignature& scalarKind(const at::Scalar& scalar);
  CallSignature& value(int64_t v);
  CallSignature& value(double v);
  CallSignature& value(std::string_view v);
  CallSignature& value(at::IntArrayRef v);
  CallSignature& value(at::OptionalIntArrayRef v);
  CallSignature& value(std::optional<at::ScalarType> v);

  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// True when each scalar converts, as the CPU kernels convert it
// (Scalar::to<T>, which refuses overflow), to each of the dtypes. Native
// kernels decline calls with a scalar that does not fit a dtype the call
// involves: the generic path then gives the CPU's answer, an error or not.
bool scalarsFit(at::ArrayRef<at::Scalar> scalars,
                std::initializer_list<at::ScalarType> dtypes);
bool scalarsFit(at::ArrayRef<at::Scalar> scalars, at::TensorList tensors);

// A host tensor for a probe: `like`'s dtype and number of dimensions,
// holding ones (divisors and logarithms stay harmless), of sizes
// probeSizes(like.sizes()). CPU scalars are returned as they are.
at::Tensor probeTensor(const at::Tensor& like);
std::optional<at::Tensor> probeTensor(const std::optional<at::Tensor>& like);
// 2 where a size is 2 or more; sizes 0 and 1 stay (an empty argument is
// an empty probe, as kernels treat empty tensors apart). Sizes that match
// or broadcast still do, and a probe has more than one element unless the
// call has at most one: kernels take other paths for single elements (a
// reduction copies it; mkldnn is not used), which accept dtypes the call's
// path refuses.
std::vector<int64_t> probeSizes(at::IntArrayRef sizes);

// The remembered answers of one native kernel's probes. Give each native
// kernel (each op form it registers) its own, with static storage duration.
class CpuAdmission {
 public:
  // Whether the CPU implementation accepts calls with `signature`; runs
  // `probe` (which calls the implementation over probe tensors and throws
  // what it throws) the first time the signature is seen.
  template <typename Probe>
  bool admits(const CallSignature& signature, Probe&& probe) {
    if (const std::optional<bool> known = lookup(signature.key())) {
      return *known;
    }
    const bool accepted = runProbe(std::forward<Probe>(probe));
    remember(signature.key(), accepted);
    return accepted;
  }

 private:
  template <typename Probe>
  static bool runProbe(Probe&& probe) {
    try {
      // On one OpenMP thread: only whether it raises counts, and a
      // parallel region would give the dispatching thread an OpenMP team
      // of its own (KernelThreads.h).
      const OneThreadScope one_thread(true);
      probe();
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  std::optional<bool> lookup(const std::string& key);
  void remember(const std::string& key, bool accepted);

  std::mutex mutex_;
  std::unordered_map<std::string, bool> known_;  // guarded by mutex_
};

}  // namespace phantom
