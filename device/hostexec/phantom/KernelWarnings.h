// Warnings a CPU kernel raises, delivered once, at the call, on the
// calling thread (KernelWarnings.cpp). Internal to ops/.
#pragma once

#include <c10/util/Exception.h>

#include <vector>

namespace phantom {

// While alive, collects the c10 warnings raised on this thread (TORCH_WARN
// in a kernel, a Meta kernel or a trial run) instead of handing them to
// the thread's handler, which for a Python call turns them into Python
// warnings when the call returns.
class WarningCapture final : public c10::WarningHandler {
 public:
  WarningCapture() : previous_(c10::WarningUtils::get_warning_handler()) {
    c10::WarningUtils::set_warning_handler(this);
  }
  ~WarningCapture() override { release(); }
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;

  void process(const c10::Warning& warning) override {
    warnings_.push_back(warning);
  }

  // Stops collecting (the thread's handler is back) and returns what was
  // collected.
  std::vector<c10::Warning> take() {
    release();
    return std::move(warnings_);
  }

 private:
  void release() {
    if (previous_ != nullptr) {
      c10::WarningUtils::set_warning_handler(previous_);
      previous_ = nullptr;
    }
  }

  c10::WarningHandler* previous_;
  std::vector<c10::Warning> warnings_;
};

// Raises `warnings` on this thread, in order, as the kernel raised them.
void emitWarnings(const std::vector<c10::Warning>& warnings);

// The warnings of `first` that `second` raised again (each matched once,
// by message and kind): what a kernel raises at every call, as opposed to
// TORCH_WARN_ONCE, which a process raises once.
std::vector<c10::Warning> warningsRaisedAgain(
    const std::vector<c10::Warning>& first,
    const std::vector<c10::Warning>& second);

}  // namespace phantom
