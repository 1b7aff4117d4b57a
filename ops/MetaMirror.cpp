// See phantom/ops/MetaMirror.h.
#include <phantom/ops/MetaMirror.h>

#include <phantom/Storage.h>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include <optional>

namespace phantom {
namespace async_path {

// Gives phantom tensor `t` this geometry (an out= argument the op resizes),
// growing its storage if it is too small. Nothing if it has it already.
void resizeArgument(const at::Tensor& t, c10::IntArrayRef sizes,
                    c10::IntArrayRef strides, int64_t offset) {
  if (t.sizes() == sizes && t.strides() == strides && t.storage_offset() == offset) {
    return;
  }
  const size_t needed = at::detail::computeStorageNbytes(
      sizes, strides, t.dtype().itemsize(), offset);
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    resizeStorageBytes(storage, needed);
  }
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
}

// The index of the argument that is `t` itself (not a tensor inside a
// list), or args.size() if none is.
size_t argumentIndexOf(c10::ArrayRef<c10::IValue> args, const at::Tensor& t) {
  size_t i = 0;
  while (i < args.size() &&
         !(args[i].isTensor() &&
           args[i].toTensor().unsafeGetTensorImpl() == t.unsafeGetTensorImpl())) {
    ++i;
  }
  return i;
}

// True when another argument (or a tensor in a list) shares argument
// `index`'s storage.
bool sharesStorageWithAnother(c10::ArrayRef<c10::IValue> args, size_t index) {
  const c10::StorageImpl* storage =
      args[index].toTensor().storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < args.size(); ++i) {
    if (i == index) continue;
    bool shared = false;
    mapTensors(args[i], [&](const at::Tensor& t) {
      shared = shared || (t.defined() && t.has_storage() &&
                          t.storage().unsafeGetStorageImpl() == storage);
      return t;
    });
    if (shared) return true;
  }
  return false;
}

void flatten(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) {
      out.push_back(t);
    }
  }
}

// An op's results, flattened as flatten() does, except that a None result
// (a `Tensor?` return) takes a place too, as an undefined tensor: result
// indices then mean the same on the host (Meta kernel, trial run) and in
// the queued work.
void flattenResults(c10::ArrayRef<c10::IValue> results, std::vector<at::Tensor>& out) {
  for (const c10::IValue& value : results) {
    if (value.isNone()) {
      out.emplace_back();
    } else {
      flatten(value, out);
    }
  }
}

at::Tensor MetaMirror::mirror(const at::Tensor& tensor, bool empty) {
  if (!isPhantom(tensor)) {
    return tensor;
  }
  for (const auto& [phantom, meta] : pairs_) {
    if (phantom.unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) {
      return meta;
    }
  }
  const c10::StorageImpl* key = tensor.storage().unsafeGetStorageImpl();
  auto it = storages_.find(key);
  if (it == storages_.end()) {
    c10::Storage meta(c10::Storage::use_byte_size_t(), tensor.storage().nbytes(),
                      c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)),
                      c10::GetAllocator(c10::DeviceType::Meta),
                      /*resizable=*/true);
    it = storages_.emplace(key, Mirrored{tensor.storage(), meta}).first;
    by_meta_.emplace(meta.unsafeGetStorageImpl(), &it->second);
  }
  auto meta = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(it->second.meta), c10::DispatchKeySet(c10::DispatchKey::Meta),
      tensor.dtype());
  c10::TensorImpl* impl = meta.unsafeGetTensorImpl();
  if (empty) {
    impl->set_sizes_contiguous({0});
  } else {
    impl->set_sizes_and_strides(tensor.sizes(), tensor.strides(),
                                tensor.storage_offset());
  }
  impl->_set_conj(tensor.is_conj());
  impl->_set_neg(tensor.is_neg());
  pairs_.emplace_back(tensor, meta);
  return meta;
}

c10::IValue MetaMirror::mirror(const c10::IValue& value) {
  if (std::optional<c10::IValue> mapped = mapTensors(
          value, [this](const at::Tensor& t) { return mirror(t); })) {
    return *mapped;
  }
  if (value.isDevice() &&
      value.toDevice().type() == c10::DeviceType::PrivateUse1) {
    return c10::Device(c10::DeviceType::Meta);
  }
  if (value.isGenerator()) {
    return c10::IValue();  // a Meta kernel draws nothing
  }
  return value;
}

const at::Tensor* MetaMirror::argumentFor(const at::Tensor& meta) const {
  for (const auto& [phantom, mirror] : pairs_) {
    if (mirror.unsafeGetTensorImpl() == meta.unsafeGetTensorImpl()) {
      return &phantom;
    }
  }
  return nullptr;
}

const c10::Storage* MetaMirror::storageFor(const at::Tensor& meta) const {
  if (!meta.has_storage()) {
    return nullptr;
  }
  auto it = by_meta_.find(meta.storage().unsafeGetStorageImpl());
  return it == by_meta_.end() ? nullptr : &it->second->phantom;
}

bool MetaMirror::resizes(c10::ArrayRef<c10::IValue> args,
                         std::vector<ArgumentGeometry>* out) const {
  for (const auto& [phantom, meta] : pairs_) {
    if (phantom.sizes() == meta.sizes() && phantom.strides() == meta.strides() &&
        phantom.storage_offset() == meta.storage_offset()) {
      continue;
    }
    const size_t i = argumentIndexOf(args, phantom);
    if (i == args.size()) return false;
    out->push_back(ArgumentGeometry::of(i, meta));
  }
  return true;
}

void MetaMirror::applyResizes() {
  for (auto& [phantom, meta] : pairs_) {
    resizeArgument(phantom, meta.sizes(), meta.strides(), meta.storage_offset());
  }
}

}  // namespace async_path
}  // namespace phantom
