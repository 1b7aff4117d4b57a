// Every tensor a kernel is given lies inside its storage: checked on the
// host, before work is queued.
//
// A phantom tensor is a view: storage, offset, sizes, strides. Nothing in
// PyTorch keeps the view inside its storage once both exist: shrinking the
// storage under a view (x.untyped_storage().resize_(0)) leaves a view that
// reaches past the end, and on the CPU an op on it reads freed memory or
// segfaults. A discrete device would report an illegal address; phantom
// refuses the call instead, with the bytes the view needs and what the
// storage has, before anything reaches the device (where a kernel would
// have dereferenced a null kernel address and killed the process).
//
// The check sits where every piece of queued work takes its tensors: the
// DeviceTensorRef of queued kernels (native kernels, fills, copy kernels,
// the generic path's queued half), the generic path's device check (both
// halves, before the trial run), copies (_copy_from) and item(). It is a
// few integer operations per tensor on the fast path; the message is
// built out of line.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>

#include <cstdint>

namespace phantom {

// Raises: `tensor` needs bytes [begin, end) of its storage, which is too
// small. `where` (may be null) names the op.
[[noreturn]] C10_NOINLINE void raiseOutsideStorage(const at::Tensor& tensor,
                                                   int64_t begin, int64_t end,
                                                   const char* where);

// Raises unless every element of the phantom tensor `tensor` lies inside
// its storage. Undefined and empty tensors need no bytes.
inline void checkInsideStorage(const at::Tensor& tensor,
                               const char* where = nullptr) {
  if (!tensor.defined()) {
    return;
  }
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (C10_UNLIKELY(!impl->has_storage())) {
    return;  // not a strided tensor over memory
  }
  const c10::IntArrayRef sizes = impl->sizes();
  const c10::IntArrayRef strides = impl->strides();
  // Element offsets of the lowest and highest elements the view reaches.
  int64_t low = impl->storage_offset();
  int64_t high = low;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      return;  // no elements: no bytes needed
    }
    // sizes * strides fits: torch computes the same sums for its own
    // storage-size checks (as_strided, set_), and sizes are bounded by
    // the numel of an allocated tensor.
    const int64_t reach = (sizes[i] - 1) * strides[i];
    if (reach >= 0) {
      high += reach;
    } else {
      low += reach;
    }
  }
  const int64_t item = static_cast<int64_t>(impl->itemsize());
  const int64_t nbytes = static_cast<int64_t>(impl->storage().nbytes());
  if (C10_UNLIKELY(low < 0 || (high + 1) * item > nbytes)) {
    raiseOutsideStorage(tensor, low * item, (high + 1) * item, where);
  }
}

}  // namespace phantom
