// CPU tensors that alias phantom tensors, for kernels running on a stream.
//
// The fake device computes with the CPU's kernels. Inside work running on a
// stream (and only there: host code must never touch device memory), the
// driver gives a second address for device memory, its kernel view
// (ph_kernel_address). KernelAliases builds CPU tensors over those
// addresses with the phantom tensors' sizes, strides and offsets, so a CPU
// kernel reads and writes device memory directly, without copies.
//
// Storages are aliased once per KernelAliases (keyed by device address):
// two phantom views of one storage become two CPU views of one CPU storage,
// so the CPU kernels' overlap checks see the aliasing a user created. And a
// tensor is aliased once: the same phantom tensor passed as two arguments
// (self and out of an in-place op routed through its out= form) is the same
// CPU tensor twice, so kernels that test identity (TensorIterator treats an
// output that is also an input as read-write and refuses to resize it)
// behave as on the CPU.
//
// Queued kernels hold DeviceTensorRefs, not tensors: like a kernel on real
// hardware they keep no reference to the memory they use. Whether that
// memory is still valid when they run is the caching allocator's stream
// semantics (and record_stream), exactly as on a GPU, so a missing
// synchronisation in user code shows up on phantom too.
//
// For the generic path (which waits for its work) aliases of real tensors
// also support mapping results back: phantomStorageOf finds the phantom
// storage a CPU result lives in, and writeBack carries a kernel's resizes
// of out= arguments back (an alias storage is resizable, backed by the CPU
// allocator; a grown one is moved into a new device buffer), and the
// conjugate and negative bits a kernel set on them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace phantom {

// A phantom tensor's memory and geometry, without ownership.
struct DeviceTensorRef {
  explicit DeviceTensorRef(const at::Tensor& tensor);

  void* storage_data;
  size_t storage_nbytes;
  c10::SmallVector<int64_t, 5> sizes;  // inline up to 5 dims: no allocation
  c10::SmallVector<int64_t, 5> strides;
  int64_t storage_offset;
  caffe2::TypeMeta dtype;
  bool is_conj;
  bool is_neg;
};

class KernelAliases {
 public:
  // A CPU tensor over `tensor`'s device memory. `tensor` must be a phantom
  // tensor (or undefined, which is returned as is).
  at::Tensor alias(const at::Tensor& tensor);
  at::Tensor alias(const DeviceTensorRef& ref);

  // The phantom storage whose CPU alias `cpu` lives in, or nullptr. Only
  // storages aliased through alias(const at::Tensor&) are known.
  const c10::Storage* phantomStorageOf(const at::Tensor& cpu) const;

  // After the kernel ran: carries resizes of aliases back to the phantom
  // tensors and storages (see above). Runs on the stream's worker.
  void writeBack();

 private:
  struct Entry {
    std::optional<c10::Storage> phantom;
    c10::Storage cpu;
    void* kernel_address;
    size_t nbytes;
  };
  // `key` is the device address, or for storages without memory (null
  // data) the StorageImpl, so that two empty tensors stay two storages.
  Entry& entryFor(const void* key, void* device_address, size_t nbytes);
  at::Tensor makeAlias(Entry& entry, const DeviceTensorRef& ref);
  // Gives `phantom` the memory of `cpu`'s storage after a kernel replaced it.
  void adoptStorage(const at::Tensor& phantom, const at::Tensor& cpu);

  struct Aliased {
    at::Tensor phantom;
    at::Tensor cpu;
    Entry* entry;
  };
  std::vector<Aliased> tensors_;
  // Index in tensors_ of each phantom tensor aliased, so that a tensor
  // passed twice (in-place ops: self and out) gets one CPU alias.
  std::unordered_map<const c10::TensorImpl*, size_t> by_impl_;
  std::unordered_map<const void*, Entry> by_key_;
  std::unordered_map<const c10::StorageImpl*, const Entry*> by_cpu_;
};

// Whether the CPU result `cpu` already is `out` (an alias of a device
// output): same address, sizes, strides and dtype. A kernel lent the
// output's memory (phantom/KernelHostMemory.h) computes its result there,
// and then nothing needs copying.
bool computedIn(const at::Tensor& cpu, const at::Tensor& out);

// A phantom tensor that views `storage` with `cpu`'s dtype and geometry.
at::Tensor phantomViewLike(const c10::Storage& storage, const at::Tensor& cpu);

// Inside device work: a new phantom tensor on `device` holding a copy of
// the CPU tensor `cpu` (same strides when they are dense). Undefined stays
// undefined.
at::Tensor newDeviceTensorFrom(const at::Tensor& cpu, c10::Device device);

}  // namespace phantom
