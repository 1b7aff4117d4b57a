// Direct loops: queued kernels that write device memory through the kernel
// view as plain C++ loops, without CPU aliases, the dispatcher or a
// TensorIterator. They serve the small float and double ops a model makes
// most of (add, mul, div, relu in Elementwise.cpp; dropout's products in
// Dropout.cpp), where that machinery costs more than the arithmetic.
//
// A direct loop must give the CPU kernel's bits: it makes the same IEEE
// operations in the same order, one element at a time, so vectorising it
// changes nothing (ops/CMakeLists.txt asks GCC for that). It takes only
// tensors up to one thread's grain (at::internal::GRAIN_SIZE elements),
// where the CPU kernel would not go parallel either.
#pragma once

#include <phantom/Exception.h>
#include <phantom/hal.h>

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace phantom {

// Where a contiguous operand's first element is, in the kernel view: the
// address a queued kernel reads and writes (device memory's own address
// is not one the host may touch).
template <typename T>
T* kernelPointer(void* storage_data, int64_t storage_offset) {
  void* base = nullptr;
  PHANTOM_CHECK(ph_kernel_address(storage_data, &base));
  return static_cast<T*>(base) + storage_offset;
}

// True for a contiguous float or double tensor of 1 to GRAIN_SIZE
// elements: the output a direct loop can write.
inline bool fitsDirectOutput(const at::Tensor& out) {
  const c10::ScalarType dtype = out.scalar_type();
  return (dtype == c10::kFloat || dtype == c10::kDouble) && out.numel() > 0 &&
         out.numel() <= at::internal::GRAIN_SIZE && out.is_contiguous();
}

}  // namespace phantom
