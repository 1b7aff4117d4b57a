// See phantom/CpuAdmission.h. A signature is a short byte string (a
// tag and a few bytes per argument: most fit the string's inline buffer,
// so building one allocates nothing); the answers are a hash map behind
// one uncontended lock per native kernel.
#include <phantom/CpuAdmission.h>

#include <ATen/ops/ones.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace phantom {
namespace {

static_assert(static_cast<int>(c10::ScalarType::NumOptions) <= 64,
              "dtypesOf() keeps a list's dtypes as a 64-bit set");

void appendBytes(std::string& key, const void* data, size_t n) {
  key.append(static_cast<const char*>(data), n);
}

// Converts `scalar` to the C++ type of `dtype` as the CPU kernels do;
// throws (std::runtime_error) if it does not fit. Dtypes without a conversion
// (quantized, sub-byte) have no Scalar argument in any kernel that takes
// them, and pass.
void convertTo(const at::Scalar& scalar, c10::ScalarType dtype) {
  switch (dtype) {
#define PHANTOM_CONVERT_CASE(type, name) \
  case c10::ScalarType::name:            \
    (void)scalar.to<type>();             \
    return;
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX(PHANTOM_CONVERT_CASE)
    PHANTOM_CONVERT_CASE(uint16_t, UInt16)
    PHANTOM_CONVERT_CASE(uint32_t, UInt32)
    PHANTOM_CONVERT_CASE(uint64_t, UInt64)
#undef PHANTOM_CONVERT_CASE
    default:
      return;
  }
}

bool fits(const at::Scalar& scalar, c10::ScalarType dtype) {
  try {
    convertTo(scalar, dtype);
    return true;
  } catch (const std::exception&) {  // c10::report_overflow: runtime_error
    return false;
  }
}

}  // namespace

CallSignature& CallSignature::tensor(const at::Tensor& t) {
  if (!t.defined()) {
    key_.push_back('u');
    return *this;
  }
  const bool cpu = t.device().is_cpu();
  const char flags = static_cast<char>(
      (cpu ? 1 : 0) |
      (cpu && t.unsafeGetTensorImpl()->is_wrapped_number() ? 2 : 0) |
      (t.is_conj() ? 4 : 0) | (t.is_neg() ? 8 : 0));
  // Which of the first 8 dims have size 1, and which 0: they keep those
  // sizes in the probe.
  uint8_t ones = 0;
  uint8_t zeros = 0;
  for (int64_t d = 0; d < std::min<int64_t>(t.dim(), 8); ++d) {
    ones |= static_cast<uint8_t>((t.size(d) == 1) << d);
    zeros |= static_cast<uint8_t>((t.size(d) == 0) << d);
  }
  key_.push_back('T');
  key_.push_back(static_cast<char>(t.scalar_type()));
  key_.push_back(static_cast<char>(t.dim()));
  key_.push_back(flags);
  key_.push_back(static_cast<char>(ones));
  key_.push_back(static_cast<char>(zeros));
  return *this;
}

CallSignature& CallSignature::tensor(const std::optional<at::Tensor>& t) {
  return t.has_value() ? tensor(*t) : tensor(at::Tensor());
}

CallSignature& CallSignature::dtypesOf(at::TensorList list) {
  uint64_t dtypes = 0;
  for (const at::Tensor& t : list) {
    dtypes |= uint64_t{1} << static_cast<int>(t.scalar_type());
  }
  key_.push_back('L');
  appendBytes(key_, &dtypes, sizeof(dtypes));
  return *this;
}

CallSignature& CallSignature::scalarKind(const at::Scalar& scalar) {
  key_.push_back('S');
  key_.push_back(scalar.isBoolean()    ? 'b'
                 : scalar.isIntegral(false) ? 'i'
                 : scalar.isComplex()  ? 'c'
                                       : 'f');
  return *this;
}

CallSignature& CallSignature::value(int64_t v) {
  key_.push_back('i');
  appendBytes(key_, &v, sizeof(v));
  return *this;
}

CallSignature& CallSignature::value(double v) {
  key_.push_back('d');
  appendBytes(key_, &v, sizeof(v));
  return *this;
}

CallSignature& CallSignature::value(std::string_view v) {
  key_.push_back('s');
  const uint32_t n = static_cast<uint32_t>(v.size());
  appendBytes(key_, &n, sizeof(n));
  key_.append(v);
  return *this;
}

CallSignature& CallSignature::value(at::IntArrayRef v) {
  key_.push_back('a');
  const uint32_t n = static_cast<uint32_t>(v.size());
  appendBytes(key_, &n, sizeof(n));
  appendBytes(key_, v.data(), v.size() * sizeof(int64_t));
  return *this;
}

CallSignature& CallSignature::value(at::OptionalIntArrayRef v) {
  if (!v.has_value()) {
    key_.push_back('n');
    return *this;
  }
  return value(*v);
}

CallSignature& CallSignature::value(std::optional<at::ScalarType> v) {
  key_.push_back('D');
  key_.push_back(v.has_value() ? static_cast<char>(*v) : char{-1});
  return *this;
}

bool scalarsFit(at::ArrayRef<at::Scalar> scalars,
                std::initializer_list<at::ScalarType> dtypes) {
  for (const at::Scalar& scalar : scalars) {
    for (const at::ScalarType dtype : dtypes) {
      if (!fits(scalar, dtype)) {
        return false;
      }
    }
  }
  return true;
}

bool scalarsFit(at::ArrayRef<at::Scalar> scalars, at::TensorList tensors) {
  uint64_t seen = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) {
      continue;
    }
    const c10::ScalarType dtype = t.scalar_type();
    const uint64_t bit = uint64_t{1} << static_cast<int>(dtype);
    if (seen & bit) {
      continue;
    }
    seen |= bit;
    for (const at::Scalar& scalar : scalars) {
      if (!fits(scalar, dtype)) {
        return false;
      }
    }
  }
  return true;
}

at::Tensor probeTensor(const at::Tensor& like) {
  if (!like.defined() || (like.device().is_cpu() && like.dim() == 0)) {
    return like;
  }
  return at::ones(probeSizes(like.sizes()), at::TensorOptions(like.scalar_type()));
}

std::vector<int64_t> probeSizes(at::IntArrayRef sizes) {
  std::vector<int64_t> result(sizes.begin(), sizes.end());
  for (int64_t& size : result) {
    size = size <= 1 ? size : 2;
  }
  return result;
}

std::optional<at::Tensor> probeTensor(const std::optional<at::Tensor>& like) {
  if (!like.has_value()) {
    return std::nullopt;
  }
  return probeTensor(*like);
}

std::optional<bool> CpuAdmission::lookup(const std::string& key) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = known_.find(key);
  if (it == known_.end()) {
    return std::nullopt;
  }
  return it->second;
}

void CpuAdmission::remember(const std::string& key, bool accepted) {
  const std::lock_guard<std::mutex> lock(mutex_);
  known_.emplace(key, accepted);
}

}  // namespace phantom
