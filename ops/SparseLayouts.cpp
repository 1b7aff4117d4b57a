// Sparse layouts on phantom: the kernels that make, take apart and resize
// sparse tensors, and where every other sparse op goes.
//
// A phantom sparse tensor is ATen's own SparseTensorImpl (COO) or
// SparseCsrTensorImpl (CSR, CSC, BSR, BSC) with the SparsePrivateUse1 or
// SparseCsrPrivateUse1 key, whose members (indices and values; compressed
// indices, plain indices and values) are dense phantom tensors. ATen writes
// the kernels that only build such a tensor or hand out its members once
// for every device: construction from members, empty tensors, the
// accessors (_indices, values, crow_indices, _nnz, ...), resizing, clone,
// zero_ and copy_. CUDA registers those same functions for its sparse keys,
// and so does this file for phantom's. They touch no data on the host:
// what they compute (clone, copy_) runs through dense ops on the members,
// which take phantom's dense paths and are queued like any dense op.
//
// Every other op with a sparse phantom argument (coalesce, to_dense,
// sparse-dense matmul, sums, softmax, elementwise, sparse_mask, ...) takes
// the sparse generic path (SparseGenericPath.cpp): the CPU's kernel over
// aliases of the members' device memory, waited for. So do the dense ops
// whose results are sparse (to_sparse, to_sparse_csr and the other
// conversions of a dense tensor): they are registered here for the dense
// key, where the dense generic path would take their sparse results for
// dense ones.
#include <phantom/ops/SparseGenericPath.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <ATen/ops/zeros_native.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <memory>
#include <string>

namespace phantom {
namespace {

// As the code generator does for CUDA's registrations of these kernels: the
// current device is the one of the first phantom tensor or device argument
// while the kernel runs, so that what it makes (a sparse tensor's default
// members, a clone) is made there.
inline void guardDevice(c10::OptionalDeviceGuard& guard, const at::Tensor& t) {
  if (!guard.current_device() && t.defined() &&
      t.device().type() == c10::DeviceType::PrivateUse1) {
    guard.reset_device(t.device());
  }
}
inline void guardDevice(c10::OptionalDeviceGuard& guard,
                        const std::optional<at::Device>& device) {
  if (!guard.current_device() && device.has_value() &&
      device->type() == c10::DeviceType::PrivateUse1) {
    guard.reset_device(*device);
  }
}
template <typename T>
inline void guardDevice(c10::OptionalDeviceGuard&, const T&) {}

template <auto kernel, typename Signature>
struct Guarded;
template <auto kernel, typename R, typename... Args>
struct Guarded<kernel, R(Args...)> {
  static R call(Args... args) {
    c10::OptionalDeviceGuard guard;
    (guardDevice(guard, args), ...);
    return kernel(std::forward<Args>(args)...);
  }
};
#define GUARDED(kernel) \
  TORCH_FN((Guarded<&kernel, std::remove_pointer_t<decltype(&kernel)>>::call))

at::Tensor emptySparseCompressed(c10::SymIntArrayRef size,
                                 std::optional<at::ScalarType> dtype,
                                 std::optional<at::Layout> layout,
                                 std::optional<at::Device> device,
                                 std::optional<bool> pin_memory,
                                 std::optional<at::MemoryFormat> memory_format) {
  return at::native::empty_sparse_compressed(C10_AS_INTARRAYREF_SLOW(size),
                                             dtype, layout, device, pin_memory,
                                             memory_format);
}

const at::Tensor& resizeSparseCompressed(
    const at::Tensor& self, c10::SymIntArrayRef size,
    std::optional<at::MemoryFormat> memory_format) {
  return at::native::resize_sparse_csr_(self, C10_AS_INTARRAYREF_SLOW(size),
                                        memory_format);
}

at::Tensor& zerosSparseOut(c10::SymIntArrayRef size, at::Tensor& out) {
  return at::native::zeros_sparse_out(C10_AS_INTARRAYREF_SLOW(size), out);
}

}  // namespace

// COO: ATen's device-generic kernels, as registered for SparseCUDA.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims",
         GUARDED(at::native::new_with_dims_sparse));
  m.impl("_sparse_coo_tensor_with_dims_and_tensors",
         GUARDED(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("empty.memory_format", GUARDED(at::native::empty_sparse_symint));
  m.impl("empty_like", GUARDED(at::native::empty_like_sparse_coo));
  m.impl("_indices", GUARDED(at::native::_indices_sparse));
  m.impl("_values", GUARDED(at::native::_values_sparse));
  m.impl("indices", GUARDED(at::native::indices_sparse));
  m.impl("values", GUARDED(at::native::values_sparse));
  m.impl("_nnz", GUARDED(at::native::_nnz_sparse));
  m.impl("sparse_dim", GUARDED(at::native::sparse_dim_sparse));
  m.impl("_dimI", GUARDED(at::native::sparse_dim_sparse));
  m.impl("dense_dim", GUARDED(at::native::dense_dim_sparse));
  m.impl("_dimV", GUARDED(at::native::dense_dim_sparse));
  m.impl("is_coalesced", GUARDED(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", GUARDED(at::native::_coalesced_sparse_));
  m.impl("sparse_resize_", GUARDED(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_",
         GUARDED(at::native::sparse_resize_and_clear_));
  m.impl("resize_as_sparse_", GUARDED(at::native::resize_as_sparse_));
  m.impl("zeros.out", GUARDED(zerosSparseOut));
  m.impl("zero_", GUARDED(at::native::zero_sparse_));
  m.impl("clone", GUARDED(at::native::clone_sparse));
  m.impl("copy_", GUARDED(at::native::copy_sparse_wrapper_));
  m.impl("copy_sparse_to_sparse_", GUARDED(at::native::copy_sparse_));
}

// Compressed layouts (CSR, CSC, BSR, BSC): as registered for SparseCsrCUDA.
// (_sparse_compressed_tensor_unsafe, which makes one from its members, is
// a composite of ATen's, the same on every device.)
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("empty.memory_format", GUARDED(emptySparseCompressed));
  m.impl("empty_like", GUARDED(at::native::empty_like_sparse_csr));
  m.impl("resize_", GUARDED(resizeSparseCompressed));
  m.impl("crow_indices", GUARDED(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", GUARDED(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", GUARDED(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", GUARDED(at::native::row_indices_sparse_csr));
  m.impl("values", GUARDED(at::native::values_sparse_csr));
  m.impl("_nnz", GUARDED(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", GUARDED(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", GUARDED(at::native::dense_dim_sparse_csr));
  m.impl("resize_as_sparse_",
         GUARDED(at::native::resize_as_sparse_compressed_));
  m.impl("zero_", GUARDED(at::native::zero_sparse_csr_));
  m.impl("clone", GUARDED(at::native::clone_sparse_compressed));
  m.impl("copy_", GUARDED(at::native::copy_sparse_compressed_));
}

// Dense arguments, sparse results: the sparse generic path maps them.
// (_embedding_bag_backward's sparse=True result is sparse too: Embedding.cpp
// gives it ATen's device-generic kernel, as on CUDA.)
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name :
       {"_to_sparse", "_to_sparse.sparse_dim", "_to_sparse_csr",
        "_to_sparse_csc", "_to_sparse_bsr", "_to_sparse_bsc"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
  }
}

namespace {

// Every other op with a sparse kernel of the CPU's own goes to the sparse
// generic path by a registration of its own, not by the fallback alone: a
// composite kernel counts as a kernel for every backend's sparse keys and
// would win over the fallback. Structured ops (addmm, mul, sum, ...) have
// one for their functional and in-place forms, which allocates the result
// on phantom and calls the out= form, so the CPU's own functional kernel
// (which picks the result's layout) would never run. Registered once, at
// load, after the registrations above (same file: static initialisers run
// in order), for every aten op that has a SparseCPU (SparseCsrCPU) kernel
// and no phantom one.
class CpuSparseKernelRoutes {
 public:
  CpuSparseKernelRoutes() {
    route(c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1);
    route(c10::DispatchKey::SparseCsrCPU,
          c10::DispatchKey::SparseCsrPrivateUse1);
  }

 private:
  void route(c10::DispatchKey cpu, c10::DispatchKey phantom) {
    auto library = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", phantom, __FILE__, __LINE__);
    c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
      if (!op || !op->hasKernelForDispatchKey(cpu) ||
          op->hasKernelForDispatchKey(phantom)) {
        continue;
      }
      std::string qualified = name.name.substr(6);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      library->impl(qualified.c_str(),
                    torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
    }
    libraries_.push_back(std::move(library));
  }

  std::vector<std::unique_ptr<torch::Library>> libraries_;
};

const CpuSparseKernelRoutes cpu_sparse_kernel_routes;

}  // namespace
}  // namespace phantom
