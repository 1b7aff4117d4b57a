// CPU tensors that alias phantom tensors, for kernels running on a stream.
//
// The fake device computes with the CPU's kernels. Inside work running on a
// stream (and only there: host code must never touch device memory), the
// driver gives a second address for device memory, its kernel view
// (ph_kernel_address). KernelAliases builds CPU tensors over those
// addresses with the phantom tensors' sizes, strides and offsets, so a CPU
// kernel reads and writes device memory directly, without copies.
//
// Storages are aliased once per KernelAliases: two phantom views of one
// storage become two CPU views of one CPU storage, so the CPU kernels'
// overlap checks see the aliasing a user created. phantomStorageOf maps a
// CPU result back to the phantom storage it lives in (a view or an
// in-place result).
//
// CPU kernels resize out= arguments. An alias storage is therefore
// resizable, backed by the CPU allocator: a kernel that grows it gets host
// memory (holding the old bytes), and writeBack() then moves that storage
// into a new device buffer and gives the phantom tensors the sizes and
// strides the kernel gave their aliases.
#pragma once

#include <ATen/core/Tensor.h>

#include <unordered_map>
#include <utility>
#include <vector>

namespace phantom {

class KernelAliases {
 public:
  // A CPU tensor over `tensor`'s device memory. `tensor` must be a phantom
  // tensor (or undefined, which is returned as is).
  at::Tensor alias(const at::Tensor& tensor);

  // The phantom storage whose CPU alias `cpu` lives in, or nullptr.
  const c10::Storage* phantomStorageOf(const at::Tensor& cpu) const;

  // After the kernel ran: carries resizes of aliases back to the phantom
  // tensors and storages (see above). Runs on the stream's worker.
  void writeBack();

 private:
  struct Entry {
    c10::Storage phantom;
    c10::Storage cpu;
    void* kernel_address;
    size_t nbytes;
  };
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors_;  // phantom, alias
  // Keyed by the CPU alias storage's impl, and by the phantom one.
  std::unordered_map<const c10::StorageImpl*, const Entry*> by_cpu_;
  std::unordered_map<const c10::StorageImpl*, Entry> by_phantom_;
};

// A phantom tensor that views `storage` with `cpu`'s dtype and geometry.
at::Tensor phantomViewLike(const c10::Storage& storage, const at::Tensor& cpu);

}  // namespace phantom
