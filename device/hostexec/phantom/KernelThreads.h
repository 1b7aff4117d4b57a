// How many OpenMP threads a queued CPU kernel runs with.
//
// The stream worker runs the CPU's kernels with the launching thread's
// thread count (device/hostexec/Launch.cpp, useThreadCount): many CPU
// kernels split a reduction by thread, so the count decides their bits (docs/performance.md, "Training steps: what is left"). A few
// kernels, though, call at::parallel_for with a grain of 1 and give each
// thread whole outputs, each computed the same way whatever the split. On a
// small input such a kernel spends more waking the worker's OpenMP team
// (a futex wake and a barrier, tens of µs on a virtual machine whose
// other vCPU sleeps) than computing, and the woken thread competes with
// the host thread for a core. Those kernels, and only those, run on one
// thread when their work is under ATen's own grain (at::internal::
// GRAIN_SIZE elements), which gives the same bits with no team at all.
//
// The ops, and why each gives the same bits on any thread count:
//   _embedding_bag, _embedding_bag_forward_only: a thread sums whole bags,
//     each bag's rows in index order;
//   log_sigmoid_forward: elementwise, each element a function of its
//     input alone.
// The tests compare them bit for bit with the CPU on two threads,
// log_sigmoid at sizes that put the end of a thread's chunk inside a
// vector (where a kernel with scalar tail code would differ).
//
// OpenMP's thread count is a per-thread setting, so lowering it on the
// worker for one kernel touches no other thread. It is reached through the
// libgomp that libtorch_cpu loaded; a torch built without OpenMP leaves
// every kernel as it is.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

namespace c10 {
struct OperatorName;
}

namespace phantom {

// Whether `op`'s CPU kernel, called with `args` (phantom tensors: only
// their metadata is read), runs on one OpenMP thread on the worker. For
// the generic path; the native kernels of these ops (ops/Embedding.cpp)
// apply the same rule to their own arguments.
bool runsOnOneThread(const c10::OperatorName& op, c10::ArrayRef<c10::IValue> args);

// While alive, kernels on this thread run on one OpenMP thread (when
// `active`); the thread's own count comes back at the end of the scope.
// Also taken by the host-side checks that run a CPU kernel only for its
// outputs' geometry or its errors (the generic path's trial run, the
// admission probes): on the dispatching thread, a parallel region would
// give that thread an OpenMP team for device work (autograd's device
// thread, in backward), which libgomp counts against the CPUs.
class OneThreadScope {
 public:
  explicit OneThreadScope(bool active);
  ~OneThreadScope();
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  int saved_ = 0;  // the thread's count before, 0 if unchanged
};

}  // namespace phantom
