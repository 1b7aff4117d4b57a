// Which path each operator took on phantom, counted per op.
//
// A vendor porting phantom to real hardware needs to know which ops their
// models send through the generic path (the CPU kernel over device memory)
// and which of those had to wait for the device, to plan native kernels.
// torch_phantom.ops_report() returns these counts; PHANTOM_OPS_REPORT=1
// prints them at exit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace phantom {

enum class OpPath {
  kGenericAsync,  // Meta computed the outputs; the kernel was only queued
  kGenericSync,   // the host waited for the kernel (see the reason)
};

void recordOpPath(const std::string& op, OpPath path, const char* reason = "");

struct OpPathCount {
  std::string op;
  int64_t async_calls = 0;
  int64_t sync_calls = 0;
  std::string sync_reason;  // why the last synchronous call waited
};

std::vector<OpPathCount> opsReport();
void resetOpsReport();

}  // namespace phantom
