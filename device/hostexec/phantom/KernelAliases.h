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

#include <phantom/Stream.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <memory>
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

// CPU aliases of device tensors for one run of a queued kernel, made from
// alias tensors this thread has made before.
//
// A queued kernel's aliases live only while it runs, and a fresh alias is
// two heap objects (a TensorImpl and a StorageImpl) made on the worker and
// freed there after a few microseconds of arithmetic. For a small kernel
// that costs about what its arithmetic does. So each thread that runs
// kernels keeps the aliases its kernels have dropped (up to kPoolSize) and
// points them at the next kernel's memory: storage address and size,
// dtype, sizes, strides, offset, conjugate and negative bits, everything an
// alias is. An alias goes back to the pool only when nothing but the pool
// holds it (a kernel that kept a reference keeps it to itself) and it is
// still a plain CPU tensor. As with KernelAliases, refs of one device
// storage share one CPU storage (the CPU kernels' overlap checks see the
// aliasing), and a storage without memory is a storage of its own. Only
// for refs: the generic path, which maps results back to device tensors,
// uses KernelAliases.
class PooledAliases {
 public:
  PooledAliases() = default;
  PooledAliases(const PooledAliases&) = delete;
  PooledAliases& operator=(const PooledAliases&) = delete;
  // Returns the aliases it lent that nobody else holds to this thread's
  // pool. Drop the tensors alias() returned before this runs.
  ~PooledAliases();

  at::Tensor alias(const DeviceTensorRef& ref);

  // How many aliases the calling thread keeps for reuse; at most kPoolSize.
  static size_t pooled();
  static constexpr size_t kPoolSize = 64;

 private:
  // The CPU storage aliasing `ref`'s device storage in this run: one this
  // run already made for that storage, else `reusable` (a pooled alias's
  // storage that no other alias shares) re-pointed, else a new one.
  c10::Storage storageFor(const DeviceTensorRef& ref,
                          const c10::Storage* reusable);

  c10::SmallVector<at::Tensor, 8> lent_;
  c10::SmallVector<std::pair<void*, c10::Storage>, 8> storages_;
};

// The CPU aliases of a queued kernel's tensors, kept from one run to the
// next when the kernel is a graph node.
//
// A graph replays each node over the same device tensors, so building the
// aliases (a CPU storage and tensor per argument) and destroying them again
// at every replay would cost as much as a small kernel's arithmetic. A
// kernel recorded into a graph (forStream, while its stream captures) keeps
// the aliases its first run built; a later run reuses them when they still
// describe the device tensors exactly: each storage's kernel view is where
// the aliases point (ph_kernel_address is asked again at every run: the
// HAL does not promise a fixed kernel view), and no kernel changed their
// geometry. Otherwise they are built again. Kept aliases go with the
// graph's node, destroyed on a host thread like every finished launch's
// closure (Launch.h, releaseFinishedWork). Work that runs once (eager
// ops, not captured) builds them at its run and drops them at its end on
// the worker, as a local KernelAliases does. Should two streams run the
// same node at once (replays of one graph on two streams, unordered), the
// second one builds its own aliases for that run.
class NodeAliases {
 public:
  NodeAliases() = default;  // built and dropped at every run
  // Kept between runs if `stream` is capturing a graph (the work about to
  // be queued on it is recorded, to be replayed).
  static NodeAliases forStream(const PhantomStream& stream);

  // Calls kernel(c10::ArrayRef<at::Tensor>) with the CPU aliases of `refs`,
  // in order (the aliases of one storage share a CPU storage, as with
  // KernelAliases). Runs on the stream's worker.
  template <typename Kernel>
  void run(c10::ArrayRef<const DeviceTensorRef*> refs, Kernel&& kernel) const {
    if (kept_ && !kept_->busy.exchange(true, std::memory_order_acquire)) {
      const BusyRelease release{kept_->busy};
      kernel(c10::ArrayRef<at::Tensor>(kept_->current(refs)));
      return;
    }
    PooledAliases pooled;
    c10::SmallVector<at::Tensor, 6> local;  // dropped before `pooled`
    for (const DeviceTensorRef* ref : refs) {
      local.push_back(pooled.alias(*ref));
    }
    kernel(c10::ArrayRef<at::Tensor>(local));
  }

 private:
  struct Kept {
    std::atomic<bool> busy{false};
    std::vector<at::Tensor> tensors;
    // The aliases of `refs`: the kept ones if still exact, else new ones.
    const std::vector<at::Tensor>& current(
        c10::ArrayRef<const DeviceTensorRef*> refs);
  };
  struct BusyRelease {
    std::atomic<bool>& busy;
    ~BusyRelease() { busy.store(false, std::memory_order_release); }
  };
  static c10::SmallVector<at::Tensor, 6> build(
      c10::ArrayRef<const DeviceTensorRef*> refs);

  std::shared_ptr<Kept> kept_;
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
