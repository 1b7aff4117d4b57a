// Compiled kernels (torch.compile's generated code) as device work.
//
// Inductor generates C++/OpenMP kernels that take raw pointers and sizes.
// On phantom those pointers are device addresses, which the host cannot
// touch, so a kernel is never called on the host thread: it is queued on a
// stream like any other device work, and on the stream's worker each
// pointer argument is translated to the kernel view of the memory
// (ph_kernel_address) before the kernel runs. The host half is only
// "pack the arguments, queue": no synchronisation, no reference to the
// tensors (like a kernel launch on a GPU, the queued work keeps none; the
// caching allocator's stream-ordered reuse and record_stream keep the
// memory valid, as for the native kernels in KernelAliases.h).
//
// Calling convention: every compiled kernel gets a trampoline with C
// linkage, `void entry(const uint64_t* args)`, that unpacks one 64-bit
// word per argument (a pointer, an int64_t, or a double holding a float)
// and calls the kernel. Keeping the launcher unaware of the kernel's real
// signature is what lets one launcher serve every kernel, from Python
// (python/csrc/Compile.cpp) or from C++.
#pragma once

#include <phantom/Stream.h>

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

namespace phantom {

using CompiledKernelEntry = void (*)(const uint64_t* args);

// A compiled kernel as the launcher sees it. Instances made by
// internCompiledKernel live until the process exits: work already queued
// refers to them, and the library holding `entry` is never unloaded.
struct CompiledKernel {
  CompiledKernelEntry entry;
  std::string name;  // names the work in a stream's error
  // Position of each argument that is a device pointer; the others are
  // passed through unchanged.
  std::vector<uint16_t> pointer_args;
  size_t num_args;
};

// The one CompiledKernel for (entry, name, pointer_args, num_args).
const CompiledKernel* internCompiledKernel(CompiledKernelEntry entry,
                                           const std::string& name,
                                           std::vector<uint16_t> pointer_args,
                                           size_t num_args);

// A value the kernel reads through a pointer argument but that lives in
// host memory: a 0-dim CPU tensor (an optimizer's step count, a Python
// number Dynamo wrapped) read by a device kernel. Its bytes are taken at
// the launch, as a GPU kernel receives a host scalar by value, and the
// kernel gets a pointer to that copy.
struct HostValue {
  uint16_t position;  // the argument's position
  alignas(16) unsigned char bytes[16];  // up to a complex double
};

// Queues `kernel` on `stream` with `args` (num_args words; pointer
// arguments are device addresses, or 0 for an empty tensor or a host
// value) and returns. An exception the kernel throws becomes the stream's
// error, reported by the next synchronisation, naming the kernel.
void launchCompiledKernel(const CompiledKernel& kernel,
                          c10::ArrayRef<uint64_t> args,
                          const PhantomStream& stream,
                          c10::ArrayRef<HostValue> host_values = {});

}  // namespace phantom
