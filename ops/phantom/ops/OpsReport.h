// Which path each operator took on phantom, counted per op.
//
// A vendor porting phantom to real hardware needs to know which ops their
// models send through the generic path (the CPU kernel over device memory)
// and which of those had to wait for the device, to plan native kernels.
// torch_phantom.ops_report() returns these counts; PHANTOM_OPS_REPORT=1
// prints them at exit.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace phantom {

// Calls of one op's native kernel (ops with a phantom kernel of their own
// that queues the CPU kernel directly, e.g. Elementwise.cpp): a relaxed
// atomic increment per call. Counters must have static storage duration;
// they register themselves for opsReport().
class NativeOpCounter {
 public:
  explicit NativeOpCounter(const char* op);
  NativeOpCounter(const NativeOpCounter&) = delete;
  NativeOpCounter& operator=(const NativeOpCounter&) = delete;
  void count() { calls_.fetch_add(1, std::memory_order_relaxed); }
  const char* op() const { return op_; }
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  void reset() { calls_.store(0, std::memory_order_relaxed); }

 private:
  const char* op_;
  std::atomic<int64_t> calls_{0};
};

enum class OpPath {
  kGenericAsync,  // Meta computed the outputs; the kernel was only queued
  kGenericSync,   // the host waited for the kernel (see the reason)
  kCopyingFallback,  // no kernel view: run on host copies (CopyingFallback.cpp)
};

void recordOpPath(const std::string& op, OpPath path, const char* reason = "");

struct OpPathCount {
  std::string op;
  int64_t native_calls = 0;
  int64_t async_calls = 0;
  int64_t sync_calls = 0;
  int64_t copied_calls = 0;  // through the copying CPU fallback
  std::string sync_reason;  // why the last synchronous call waited
};

std::vector<OpPathCount> opsReport();
void resetOpsReport();

}  // namespace phantom
