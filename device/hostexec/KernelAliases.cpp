// See phantom/KernelAliases.h.
#include <phantom/Exception.h>
#include <phantom/BoundsCheck.h>
#include <phantom/Graph.h>
#include <phantom/KernelAliases.h>
#include <phantom/PrivatePool.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace phantom {

DeviceTensorRef::DeviceTensorRef(const at::Tensor& tensor)
    : storage_data(tensor.storage().mutable_data()),
      storage_nbytes(tensor.storage().nbytes()),
      sizes(tensor.sizes().begin(), tensor.sizes().end()),
      strides(tensor.strides().begin(), tensor.strides().end()),
      storage_offset(tensor.storage_offset()),
      dtype(tensor.dtype()),
      is_conj(tensor.is_conj()),
      is_neg(tensor.is_neg()) {
  TORCH_INTERNAL_ASSERT(tensor.device().type() == c10::DeviceType::PrivateUse1);
  // Every queued kernel takes its tensors here, on the host: a view past
  // its storage is refused before it reaches the device.
  checkInsideStorage(tensor);
}

namespace {

// A CPU storage over `kernel_address` (a kernel view, or null for none),
// resizable through the CPU allocator as a kernel's out= argument may be.
c10::Storage cpuStorageOver(void* kernel_address, size_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      c10::DataPtr(kernel_address, c10::Device(c10::kCPU)),
                      c10::GetCPUAllocator(), /*resizable=*/true);
}

// Gives an alias `ref`'s geometry and bits (its storage and dtype are set).
void describeAs(c10::TensorImpl* impl, const DeviceTensorRef& ref) {
  impl->set_sizes_and_strides(ref.sizes, ref.strides, ref.storage_offset);
  // Lazy conjugation and negation are part of a tensor's value.
  impl->_set_conj(ref.is_conj);
  impl->_set_neg(ref.is_neg);
}

}  // namespace

KernelAliases::Entry& KernelAliases::entryFor(const void* key,
                                              void* device_address,
                                              size_t nbytes) {
  auto it = by_key_.find(key);
  if (it != by_key_.end()) {
    return it->second;
  }
  void* kernel_address = nullptr;
  if (device_address != nullptr) {
    PHANTOM_CHECK(ph_kernel_address(device_address, &kernel_address));
  }
  c10::Storage cpu = cpuStorageOver(kernel_address, nbytes);
  Entry& entry = by_key_
                     .emplace(key,
                              Entry{std::nullopt, std::move(cpu),
                                    kernel_address, nbytes})
                     .first->second;
  by_cpu_.emplace(entry.cpu.unsafeGetStorageImpl(), &entry);
  return entry;
}

at::Tensor KernelAliases::makeAlias(Entry& entry, const DeviceTensorRef& ref) {
  auto cpu = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(entry.cpu), c10::DispatchKeySet(c10::DispatchKey::CPU),
      ref.dtype);
  describeAs(cpu.unsafeGetTensorImpl(), ref);
  return cpu;
}

at::Tensor KernelAliases::alias(const DeviceTensorRef& ref) {
  if (ref.storage_data == nullptr) {
    // No memory to alias: a private empty storage.
    Entry scratch{std::nullopt, cpuStorageOver(nullptr, 0), nullptr, 0};
    return makeAlias(scratch, ref);
  }
  return makeAlias(entryFor(ref.storage_data, ref.storage_data,
                            ref.storage_nbytes),
                   ref);
}

at::Tensor KernelAliases::alias(const at::Tensor& tensor) {
  if (!tensor.defined()) {
    return tensor;
  }
  // One tensor passed twice (x.logical_and_(y) runs logical_and.out(x, y,
  // out=x)) is one CPU tensor twice: kernels test identity (is_same) to
  // tell an in-place write from an out= one, and an in-place result must
  // not be resized to the broadcast shape.
  const auto known = by_impl_.find(tensor.unsafeGetTensorImpl());
  if (known != by_impl_.end()) {
    return tensors_[known->second].cpu;
  }
  const DeviceTensorRef ref(tensor);
  const void* key = ref.storage_data != nullptr
                        ? ref.storage_data
                        : static_cast<const void*>(
                              tensor.storage().unsafeGetStorageImpl());
  Entry& entry = entryFor(key, ref.storage_data, ref.storage_nbytes);
  if (!entry.phantom.has_value()) {
    entry.phantom = tensor.storage();
  }
  at::Tensor cpu = makeAlias(entry, ref);
  by_impl_.emplace(tensor.unsafeGetTensorImpl(), tensors_.size());
  tensors_.push_back(Aliased{tensor, cpu, &entry});
  return cpu;
}

const c10::Storage* KernelAliases::phantomStorageOf(const at::Tensor& cpu) const {
  if (!cpu.defined() || !cpu.has_storage()) {
    return nullptr;
  }
  auto it = by_cpu_.find(cpu.storage().unsafeGetStorageImpl());
  if (it == by_cpu_.end() || !it->second->phantom.has_value()) {
    return nullptr;
  }
  return &*it->second->phantom;
}

void KernelAliases::writeBack() {
  // Storages the kernel grew (into host memory): move them to the device.
  for (auto& [key, entry] : by_key_) {
    const c10::Storage& cpu = entry.cpu;
    if (!entry.phantom.has_value() ||
        (cpu.data() == entry.kernel_address && cpu.nbytes() == entry.nbytes)) {
      continue;
    }
    c10::StorageImpl* phantom = entry.phantom->unsafeGetStorageImpl();
    TORCH_CHECK(phantom->resizable(),
                "an operation tried to resize a phantom tensor whose storage "
                "is not resizable");
    c10::DataPtr fresh = phantom->allocator()->allocate(cpu.nbytes());
    if (cpu.nbytes() > 0) {
      void* kernel_address = nullptr;
      PHANTOM_CHECK(ph_kernel_address(fresh.get(), &kernel_address));
      std::memcpy(kernel_address, cpu.data(), cpu.nbytes());
    }
    phantom->set_data_ptr_noswap(std::move(fresh));
    phantom->set_nbytes(cpu.nbytes());
  }
  // Tensors the kernel resized or pointed at other memory.
  for (Aliased& aliased : tensors_) {
    const at::Tensor& phantom = aliased.phantom;
    const at::Tensor& cpu = aliased.cpu;
    if (cpu.storage().unsafeGetStorageImpl() !=
        aliased.entry->cpu.unsafeGetStorageImpl()) {
      adoptStorage(phantom, cpu);
    }
    c10::TensorImpl* impl = phantom.unsafeGetTensorImpl();
    if (phantom.sizes() != cpu.sizes() || phantom.strides() != cpu.strides() ||
        phantom.storage_offset() != cpu.storage_offset()) {
      impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(),
                                  cpu.storage_offset());
    }
    // Lazy conjugation and negation are part of the value: a kernel may
    // leave its out= result conjugated (linalg_lu_solve with left=False
    // does), and the memory is only right read through that bit.
    if (phantom.is_conj() != cpu.is_conj()) {
      impl->_set_conj(cpu.is_conj());
    }
    if (phantom.is_neg() != cpu.is_neg()) {
      impl->_set_neg(cpu.is_neg());
    }
  }
}

void KernelAliases::adoptStorage(const at::Tensor& phantom,
                                 const at::Tensor& cpu) {
  c10::TensorImpl* impl = phantom.unsafeGetTensorImpl();
  if (const c10::Storage* known = phantomStorageOf(cpu)) {
    impl->set_storage_keep_dtype(*known);  // now shares another argument's
    return;
  }
  // Host memory the kernel allocated: copy it into a new device storage.
  const c10::Storage& host = cpu.storage();
  c10::Allocator* allocator = phantom.storage().allocator();
  c10::Storage fresh(c10::Storage::use_byte_size_t(), host.nbytes(),
                     allocator->allocate(host.nbytes()), allocator,
                     /*resizable=*/true);
  if (host.nbytes() > 0) {
    void* kernel_address = nullptr;
    PHANTOM_CHECK(ph_kernel_address(fresh.mutable_data(), &kernel_address));
    std::memcpy(kernel_address, host.data(), host.nbytes());
  }
  impl->set_storage_keep_dtype(std::move(fresh));
}

at::Tensor phantomViewLike(const c10::Storage& storage, const at::Tensor& cpu) {
  auto view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      cpu.dtype());
  c10::TensorImpl* impl = view.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
  impl->_set_conj(cpu.is_conj());
  impl->_set_neg(cpu.is_neg());
  return view;
}

namespace {

// This thread's aliases that no kernel holds, to be pointed at the next
// kernel's memory (PooledAliases).
std::vector<at::Tensor>& aliasPool() {
  thread_local std::vector<at::Tensor> pool;
  return pool;
}

// Whether a lent alias can go back to the pool: nothing else holds it or
// its storage, and a kernel left nothing on it that re-pointing would not
// reset (autograd or a Python object).
bool reusableAlias(const at::Tensor& cpu) {
  const c10::TensorImpl* impl = cpu.unsafeGetTensorImpl();
  return cpu.use_count() == 1 && cpu.weak_use_count() == 1 &&
         impl->autograd_meta() == nullptr && !impl->is_wrapped_number() &&
         impl->has_storage() && !impl->pyobj_slot()->load_pyobj();
}

}  // namespace

PooledAliases::~PooledAliases() {
  std::vector<at::Tensor>& pool = aliasPool();
  storages_.clear();  // a lent alias may now be its storage's only holder
  for (at::Tensor& cpu : lent_) {
    if (pool.size() < kPoolSize && reusableAlias(cpu)) {
      pool.push_back(std::move(cpu));
    }
  }
}

size_t PooledAliases::pooled() { return aliasPool().size(); }

c10::Storage PooledAliases::storageFor(const DeviceTensorRef& ref,
                                       const c10::Storage* reusable) {
  if (ref.storage_data != nullptr) {
    for (const auto& [device_address, storage] : storages_) {
      if (device_address == ref.storage_data) {
        return storage;
      }
    }
  }
  void* kernel_address = nullptr;
  if (ref.storage_data != nullptr) {
    PHANTOM_CHECK(ph_kernel_address(ref.storage_data, &kernel_address));
  }
  c10::Storage storage;
  if (reusable != nullptr) {
    storage = *reusable;
    // Frees what a kernel grew.
    storage.set_data_ptr_noswap(
        c10::DataPtr(kernel_address, c10::Device(c10::kCPU)));
    storage.set_nbytes(ref.storage_nbytes);
  } else {
    storage = cpuStorageOver(kernel_address, ref.storage_nbytes);
  }
  if (ref.storage_data != nullptr) {
    storages_.emplace_back(ref.storage_data, storage);
  }
  return storage;
}

at::Tensor PooledAliases::alias(const DeviceTensorRef& ref) {
  std::vector<at::Tensor>& pool = aliasPool();
  at::Tensor cpu;
  const c10::Storage* reusable = nullptr;
  if (!pool.empty()) {
    cpu = std::move(pool.back());
    pool.pop_back();
    const c10::Storage& own = cpu.unsafeGetTensorImpl()->unsafe_storage();
    // Its storage is re-pointed only if no other alias shares it.
    if (own.use_count() == 1 && own.allocator() == c10::GetCPUAllocator() &&
        own.resizable()) {
      reusable = &own;
    }
  }
  c10::Storage storage = storageFor(ref, reusable);
  if (cpu.defined()) {
    cpu.unsafeGetTensorImpl()->set_storage_and_dtype(std::move(storage), ref.dtype);
  } else {
    cpu = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), ref.dtype);
  }
  describeAs(cpu.unsafeGetTensorImpl(), ref);
  lent_.push_back(cpu);
  return cpu;
}

NodeAliases NodeAliases::forStream(const PhantomStream& stream) {
  NodeAliases aliases;
  // One relaxed load when no capture is underway (every eager op).
  if (privatePoolRoutingActive() && isStreamCapturing(stream.unwrap())) {
    aliases.kept_ = std::make_shared<Kept>();
  }
  return aliases;
}

c10::SmallVector<at::Tensor, 6> NodeAliases::build(
    c10::ArrayRef<const DeviceTensorRef*> refs) {
  KernelAliases aliases;  // shares one CPU storage per device storage
  c10::SmallVector<at::Tensor, 6> tensors;
  for (const DeviceTensorRef* ref : refs) {
    tensors.push_back(aliases.alias(*ref));
  }
  return tensors;
}

namespace {

// Whether `cpu`, an alias built for `ref`, still is exactly that alias.
bool stillAliases(const at::Tensor& cpu, const DeviceTensorRef& ref) {
  const c10::TensorImpl* impl = cpu.unsafeGetTensorImpl();
  if (!impl->has_storage()) return false;
  const c10::Storage& storage = impl->unsafe_storage();
  void* expected = nullptr;
  if (ref.storage_data != nullptr &&
      ph_kernel_address(ref.storage_data, &expected) != PH_SUCCESS) {
    return false;
  }
  return storage.data() == expected && storage.nbytes() == ref.storage_nbytes &&
         impl->dtype() == ref.dtype && impl->sizes() == c10::IntArrayRef(ref.sizes) &&
         impl->strides() == c10::IntArrayRef(ref.strides) &&
         impl->storage_offset() == ref.storage_offset &&
         impl->is_conj() == ref.is_conj && impl->is_neg() == ref.is_neg;
}

}  // namespace

const std::vector<at::Tensor>& NodeAliases::Kept::current(
    c10::ArrayRef<const DeviceTensorRef*> refs) {
  bool exact = tensors.size() == refs.size();
  for (size_t i = 0; exact && i < refs.size(); ++i) {
    exact = stillAliases(tensors[i], *refs[i]);
  }
  if (!exact) {
    const c10::SmallVector<at::Tensor, 6> fresh = build(refs);
    tensors.assign(fresh.begin(), fresh.end());
  }
  return tensors;
}

bool computedIn(const at::Tensor& cpu, const at::Tensor& out) {
  return cpu.data_ptr() == out.data_ptr() && cpu.sizes() == out.sizes() &&
         cpu.strides() == out.strides() && cpu.dtype() == out.dtype();
}

at::Tensor newDeviceTensorFrom(const at::Tensor& cpu, c10::Device device) {
  if (!cpu.defined()) {
    return cpu;
  }
  at::Tensor out = cpu.is_non_overlapping_and_dense()
                       ? at::empty_strided(cpu.sizes(), cpu.strides(),
                                           cpu.options().device(device))
                       : at::empty(cpu.sizes(), cpu.options().device(device));
  KernelAliases aliases;
  aliases.alias(out).copy_(cpu);
  return out;
}

}  // namespace phantom
