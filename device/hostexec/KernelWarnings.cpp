// Warnings of CPU kernels on phantom: once, at the call, on the calling
// thread, whichever path the op took.
//
// A CPU kernel raises its warnings (TORCH_WARN) on the thread that runs
// it, to that thread's handler; a Python call's handler turns them into
// Python warnings when the call returns. On phantom a kernel's warnings
// can come from several runs, on several threads, for one call:
//   - the Meta kernel on the host (a C++ structured Meta kernel runs the
//     CPU kernel's checks, and raises its warnings, on meta tensors);
//   - the trial run of the CPU kernel on the host (the first call with a
//     call signature);
//   - the kernel itself, on the stream's worker thread (queued work),
//     whose handler only prints to stderr, or on the calling thread
//     (waited work on an idle stream).
// Left alone, a warning came twice or three times, or only as a line on
// stderr from the worker, or not at all. So every run collects its
// warnings (WarningCapture) and the generic path delivers one run's, on
// the calling thread, at the call:
//   - synchronous half: the kernel's own run (collected where it ran);
//   - asynchronous half, first call of a signature: the trial run's;
//     later calls: the warnings the trial showed the kernel raises at
//     every call (the trial runs a second time when the first warned:
//     TORCH_WARN_ONCE raises only the first time, and must not be
//     repeated at every call);
//   - asynchronous half with a C++ Meta kernel (no trial): the Meta
//     kernel's, which are the CPU kernel's checks.
// The queued run's warnings are dropped: they were delivered at the call.
// Warnings a Python Meta kernel raises with `warnings.warn` are Python's
// own and are not seen here.
#include <phantom/KernelWarnings.h>

#include <variant>

namespace phantom {
namespace {

bool sameWarning(const c10::Warning& a, const c10::Warning& b) {
  return a.msg() == b.msg() && a.type().index() == b.type().index();
}

}  // namespace

void emitWarnings(const std::vector<c10::Warning>& warnings) {
  for (const c10::Warning& warning : warnings) {
    c10::warn(warning);
  }
}

std::vector<c10::Warning> warningsRaisedAgain(
    const std::vector<c10::Warning>& first,
    const std::vector<c10::Warning>& second) {
  std::vector<bool> used(second.size(), false);
  std::vector<c10::Warning> again;
  for (const c10::Warning& warning : first) {
    for (size_t i = 0; i < second.size(); ++i) {
      if (!used[i] && sameWarning(warning, second[i])) {
        used[i] = true;
        again.push_back(warning);
        break;
      }
    }
  }
  return again;
}

}  // namespace phantom
