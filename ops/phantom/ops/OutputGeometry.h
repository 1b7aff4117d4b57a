// A native kernel's output on the device: allocated without the
// dispatcher, and its geometry remembered per call so that a repeated call
// skips the meta function. Internal to ops/.
//
// A native kernel that is not a direct loop (the structured ops, `cat`,
// integer indexing, the binary ops' meta path) learns its output's sizes,
// strides and dtype from ATen's meta function over meta mirrors of its
// inputs, which also makes the CPU's checks; the CPU admission then asks
// whether the CPU kernel takes the dtypes. On a small op the mirrors and
// the meta function are a large part of the host's cost, and a training
// loop calls each op with the same arguments every step. So once a call
// has passed both, the kernel remembers, under the call's geometry key,
// the output geometry it got; a later call with the same key takes it
// from the memo and skips mirrors, meta function and admission.
//
// The key holds everything those depend on: the op's non-tensor
// arguments (its CallSignature), each input's device type, wrapped-number
// bit, dtype, sizes and strides, each Scalar's type and value (pow of an
// integer tensor refuses a negative exponent, a check on the value), and
// the default dtype (a Python number promotes to it). Only calls whose
// inputs are plain phantom tensors on one device (and CPU scalars, for
// the binary ops) get this far, so storage, device index and conj/neg
// bits do not enter. A call the meta function or the CPU refuses is never
// remembered: it goes to the generic path every time and raises there. A
// memo keeps at most kCapacity keys per op; calls of further geometries
// take the full path.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/SmallVector.h>

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace phantom {

// A tensor of `sizes`, `strides` and `dtype` on the current phantom device
// (the caller holds a DeviceGuard), from the device allocator: what
// at::empty_strided gives, without its two dispatcher hops (BackendSelect,
// then the PrivateUse1 kernel) and the TensorOptions it packs. The second
// form is laid out in `memory_format` (contiguous by default). Phantom's
// own `empty` and `empty_strided` kernels (Factories.cpp) end here too.
at::Tensor emptyOnCurrentDevice(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                                c10::ScalarType dtype);
at::Tensor emptyOnCurrentDevice(
    c10::IntArrayRef sizes, c10::ScalarType dtype,
    std::optional<c10::MemoryFormat> memory_format = std::nullopt);

// The geometry key of one call, built argument by argument into a buffer
// of the calling thread (no allocation per call). Use one key at a time
// per thread, and finish with it (lookup, remember) before allocating or
// launching anything.
class GeometryKey {
 public:
  // Starts the key with the default dtype and `arguments`, the call's
  // other arguments (as its CallSignature holds them, or an op's tag).
  explicit GeometryKey(std::string_view arguments);
  // Undefined, or the device type (a CPU scalar may join phantom tensors),
  // whether it is a wrapped Python number, dtype, sizes and strides.
  GeometryKey& tensor(const at::Tensor& t);
  // A symbolic Scalar makes the call one that is not remembered.
  GeometryKey& scalar(const at::Scalar& scalar);
  const std::string& str() const { return key_; }
  bool rememberable() const { return rememberable_; }

 private:
  std::string& key_;
  bool rememberable_ = true;
};

struct OutputGeometry {
  static OutputGeometry of(const at::Tensor& meta_out);
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype;
};

// One native kernel's remembered output geometries. Give each native
// kernel its own, with static storage duration.
class OutputGeometryMemo {
 public:
  static constexpr size_t kCapacity = 512;

  // The output's geometry for a call with `key`: the remembered one, or
  // else that of the meta tensor `compute()` returns (nullopt: the call is
  // refused, and so is not remembered), which is then remembered.
  template <typename Compute>
  std::optional<OutputGeometry> outputOf(const GeometryKey& key, Compute&& compute) {
    if (key.rememberable()) {
      if (const OutputGeometry* known = lookup(key)) {
        return *known;
      }
    }
    const std::optional<at::Tensor> meta_out = compute();
    if (!meta_out) {
      return std::nullopt;
    }
    if (key.rememberable()) {
      remember(key, *meta_out);
    }
    return OutputGeometry::of(*meta_out);
  }

 private:
  // The geometry remembered for `key`, or null. Entries are never removed
  // or changed, so the pointer stays valid.
  const OutputGeometry* lookup(const GeometryKey& key);
  // Remembers `meta_out`'s geometry under `key` (nothing once full).
  void remember(const GeometryKey& key, const at::Tensor& meta_out);

  std::mutex mutex_;
  std::unordered_map<std::string, OutputGeometry> known_;  // guarded by mutex_
};

}  // namespace phantom
