// A native kernel for advanced indexing by integer tensors (index.Tensor:
// `x[:, rows, cols]`, the pairwise interaction of a DLRM step).
//
// index.Tensor is structured: its C++ meta function (at::meta::index)
// broadcasts the indices and computes the output's shape and strides as
// the CPU's kernel does, without reading the indices' values. So, as in
// Structured.cpp: the meta function runs over meta mirrors of the
// arguments (raising nothing at the call: a refused call goes to the
// generic path, which raises the CPU's error), a CpuAdmission probe asks
// the CPU implementation once per call signature whether it takes these
// dtypes, the output is allocated on the device, and at::cpu::index_out is
// queued over the CPU aliases, writing straight into it. Boolean and byte
// masks, whose output's shape is their count of true values (data the
// host does not have), indices on another device or the CPU, and
// non-plain tensors are left to the generic path. An index out of range
// is data too: the queued kernel raises it and it surfaces at the next
// sync, as on the generic path once a signature is queued.
#include <phantom/CpuAdmission.h>
#include <phantom/KernelAliases.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/ops/OutputGeometry.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/index_cpu_dispatch.h>
#include <ATen/ops/index_meta_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <optional>
#include <utility>
#include <vector>

namespace phantom {
namespace {

using Indices = c10::List<std::optional<at::Tensor>>;

NativeOpCounter index_counter("aten::index");
CpuAdmission index_admission;
OutputGeometryMemo index_geometries;

// `indices` with each defined index replaced by `f(index)`.
template <typename F>
Indices mapIndices(const Indices& indices, F f) {
  Indices result;
  result.reserve(indices.size());
  for (const std::optional<at::Tensor>& index : indices) {
    if (index.has_value() && index->defined()) {
      result.push_back(f(*index));
    } else {
      result.push_back(std::nullopt);
    }
  }
  return result;
}

bool admittedByCpu(const at::Tensor& self, const Indices& indices) {
  CallSignature signature;
  signature.tensor(self);
  for (const std::optional<at::Tensor>& index : indices) {
    signature.tensor(index.has_value() ? *index : at::Tensor());
  }
  return index_admission.admits(signature, [&] {
    const at::Tensor host = probeTensor(self);
    const Indices host_indices =
        mapIndices(indices, [](const at::Tensor& t) { return probeTensor(t); });
    (void)at::cpu::index(host, host_indices);
  });
}

// The output's geometry, or nullopt when the call is not taken here: the
// one an earlier call with the same geometry key got (OutputGeometry.h),
// else the meta function's once the CPU admits the call.
std::optional<OutputGeometry> nativeOutput(const at::Tensor& self, const Indices& indices) {
  if (!isPlainPhantom(self)) return std::nullopt;
  bool any = false;
  GeometryKey key({});
  key.tensor(self);
  for (const std::optional<at::Tensor>& index : indices) {
    if (!index.has_value() || !index->defined()) {
      key.tensor(at::Tensor());
      continue;
    }
    const at::ScalarType dtype = index->scalar_type();
    if (!isPlainPhantom(*index) || index->device() != self.device() ||
        (dtype != at::kLong && dtype != at::kInt)) {
      return std::nullopt;
    }
    key.tensor(*index);
    any = true;
  }
  if (!any) return std::nullopt;
  return index_geometries.outputOf(key, [&]() -> std::optional<at::Tensor> {
    std::optional<at::Tensor> meta_out;
    try {
      meta_out = at::meta::index(metaLike(self), mapIndices(indices, metaLike));
    } catch (const c10::Error&) {
      return std::nullopt;  // the generic path raises the CPU's own error
    }
    if (!admittedByCpu(self, indices)) return std::nullopt;
    return meta_out;
  });
}

at::Tensor index(const at::Tensor& self, const Indices& indices) {
  const std::optional<OutputGeometry> geometry = nativeOutput(self, indices);
  if (!geometry) {
    torch::jit::Stack stack = boxArguments(self, indices);
    runGenericBoxed(index_counter.op(), "Tensor", &stack);
    return stack.back().toTensor();
  }
  index_counter.count();
  const c10::Device device = self.device();
  const c10::DeviceGuard guard(device);
  at::Tensor out = emptyOnCurrentDevice(geometry->sizes, geometry->strides, geometry->dtype);
  // refs: the output, self, then each defined index; `defined` says which
  // positions of the list hold one.
  c10::SmallVector<DeviceTensorRef, 6> refs;
  std::vector<bool> defined;
  refs.emplace_back(out);
  refs.emplace_back(self);
  for (const std::optional<at::Tensor>& index : indices) {
    defined.push_back(index.has_value() && index->defined());
    if (defined.back()) refs.emplace_back(*index);
  }
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  launchAsync(stream, index_counter.op(),
              [refs = std::move(refs), defined = std::move(defined),
               aliases = NodeAliases::forStream(stream)] {
    c10::SmallVector<const DeviceTensorRef*, 6> pointers;
    for (const DeviceTensorRef& ref : refs) pointers.push_back(&ref);
    aliases.run(pointers, [&](c10::ArrayRef<at::Tensor> cpu) {
      Indices cpu_indices;
      cpu_indices.reserve(defined.size());
      size_t next = 2;
      for (const bool has : defined) {
        if (has) {
          cpu_indices.push_back(cpu[next++]);
        } else {
          cpu_indices.push_back(std::nullopt);
        }
      }
      at::Tensor result = cpu[0];
      // As the CPU's autograd kernel calls the CPU kernel.
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      at::cpu::index_out(result, cpu[1], cpu_indices);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index.Tensor", TORCH_FN(index));
}

}  // namespace phantom
