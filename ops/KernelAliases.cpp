// See phantom/ops/KernelAliases.h.
#include <phantom/Exception.h>
#include <phantom/ops/KernelAliases.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>

namespace phantom {

at::Tensor KernelAliases::alias(const at::Tensor& tensor) {
  if (!tensor.defined()) {
    return tensor;
  }
  TORCH_INTERNAL_ASSERT(tensor.device().type() == c10::DeviceType::PrivateUse1);
  const c10::Storage& storage = tensor.storage();
  const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  auto it = by_phantom_.find(key);
  if (it == by_phantom_.end()) {
    void* kernel_address = nullptr;
    if (storage.data() != nullptr) {
      PHANTOM_CHECK(ph_kernel_address(storage.data(), &kernel_address));
    }
    c10::Storage cpu_storage(
        c10::Storage::use_byte_size_t(), storage.nbytes(),
        c10::DataPtr(kernel_address, c10::Device(c10::DeviceType::CPU)),
        c10::GetCPUAllocator(), /*resizable=*/true);
    it = by_phantom_
             .emplace(key, Entry{storage, std::move(cpu_storage),
                                 kernel_address, storage.nbytes()})
             .first;
    by_cpu_.emplace(it->second.cpu.unsafeGetStorageImpl(), &it->second);
  }
  auto cpu = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(it->second.cpu), c10::DispatchKeySet(c10::DispatchKey::CPU),
      tensor.dtype());
  c10::TensorImpl* impl = cpu.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(tensor.sizes(), tensor.strides(),
                              tensor.storage_offset());
  // Lazy conjugation and negation are part of a tensor's value.
  impl->_set_conj(tensor.is_conj());
  impl->_set_neg(tensor.is_neg());
  tensors_.emplace_back(tensor, cpu);
  return cpu;
}

void KernelAliases::writeBack() {
  for (auto& [key, entry] : by_phantom_) {
    const c10::Storage& cpu = entry.cpu;
    if (cpu.data() == entry.kernel_address && cpu.nbytes() == entry.nbytes) {
      continue;
    }
    // The kernel resized the storage into host memory: move it to the
    // device. The old device buffer is freed by its DataPtr.
    c10::StorageImpl* phantom = entry.phantom.unsafeGetStorageImpl();
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
  for (auto& [phantom, cpu] : tensors_) {
    if (phantom.sizes() != cpu.sizes() || phantom.strides() != cpu.strides() ||
        phantom.storage_offset() != cpu.storage_offset()) {
      phantom.unsafeGetTensorImpl()->set_sizes_and_strides(
          cpu.sizes(), cpu.strides(), cpu.storage_offset());
    }
  }
}

const c10::Storage* KernelAliases::phantomStorageOf(const at::Tensor& cpu) const {
  if (!cpu.defined() || !cpu.has_storage()) {
    return nullptr;
  }
  auto it = by_cpu_.find(cpu.storage().unsafeGetStorageImpl());
  return it == by_cpu_.end() ? nullptr : &it->second->phantom;
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

}  // namespace phantom
