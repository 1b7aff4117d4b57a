// See phantom/ops/OutputGeometry.h.
#include <phantom/ops/OutputGeometry.h>

#include <phantom/DeviceAllocator.h>

#include <ATen/EmptyTensor.h>
#include <c10/core/DefaultDtype.h>

#include <complex>
#include <cstdint>

namespace phantom {
namespace {

constexpr c10::DispatchKeySet kPhantomKeys(c10::DispatchKey::PrivateUse1);

template <typename T>
void put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

std::string& threadKeyBuffer() {
  thread_local std::string buffer;
  return buffer;
}

}  // namespace

at::Tensor emptyOnCurrentDevice(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                                c10::ScalarType dtype) {
  return at::detail::empty_strided_generic(sizes, strides, &deviceAllocator(),
                                           kPhantomKeys, dtype);
}

at::Tensor emptyOnCurrentDevice(c10::IntArrayRef sizes, c10::ScalarType dtype,
                                std::optional<c10::MemoryFormat> memory_format) {
  return at::detail::empty_generic(sizes, &deviceAllocator(), kPhantomKeys,
                                   dtype, memory_format);
}

GeometryKey::GeometryKey(std::string_view arguments) : key_(threadKeyBuffer()) {
  key_.clear();
  key_.push_back(static_cast<char>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  put(key_, static_cast<uint32_t>(arguments.size()));
  key_.append(arguments);
}

GeometryKey& GeometryKey::tensor(const at::Tensor& t) {
  if (!t.defined()) {
    key_.push_back('u');
    return *this;
  }
  key_.push_back('T');
  key_.push_back(static_cast<char>(t.device().type()));
  key_.push_back(static_cast<char>(t.unsafeGetTensorImpl()->is_wrapped_number()));
  key_.push_back(static_cast<char>(t.scalar_type()));
  key_.push_back(static_cast<char>(t.dim()));
  for (int64_t v : t.sizes()) put(key_, v);
  for (int64_t v : t.strides()) put(key_, v);
  return *this;
}

GeometryKey& GeometryKey::scalar(const at::Scalar& scalar) {
  if (scalar.isSymbolic()) {
    rememberable_ = false;
    return *this;
  }
  key_.push_back('S');
  key_.push_back(static_cast<char>(scalar.type()));
  if (scalar.isComplex()) {
    put(key_, scalar.toComplexDouble());
  } else if (scalar.isFloatingPoint()) {
    put(key_, scalar.toDouble());
  } else if (scalar.isBoolean()) {
    put(key_, scalar.toBool());
  } else if (scalar.type() == c10::ScalarType::UInt64) {
    put(key_, scalar.toUInt64());
  } else {
    put(key_, scalar.toLong());
  }
  return *this;
}

OutputGeometry OutputGeometry::of(const at::Tensor& meta_out) {
  return {c10::SmallVector<int64_t, 5>(meta_out.sizes().begin(), meta_out.sizes().end()),
          c10::SmallVector<int64_t, 5>(meta_out.strides().begin(), meta_out.strides().end()),
          meta_out.scalar_type()};
}

const OutputGeometry* OutputGeometryMemo::lookup(const GeometryKey& key) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = known_.find(key.str());
  return it == known_.end() ? nullptr : &it->second;
}

void OutputGeometryMemo::remember(const GeometryKey& key, const at::Tensor& meta_out) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (known_.size() >= kCapacity) {
    return;
  }
  known_.try_emplace(key.str(), OutputGeometry::of(meta_out));
}

}  // namespace phantom
