// The generic path for sparse layouts (SparseGenericPath.cpp). Internal to
// ops/.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace phantom {

// The boxed fallback for SparsePrivateUse1 and SparseCsrPrivateUse1: runs
// `op`'s CPU kernel (SparseCPU, SparseCsrCPU, or CPU for the dense
// arguments) over CPU aliases of the device memory of every argument,
// sparse or dense, and waits for it. Also registered for PrivateUse1 for
// the dense-to-sparse conversions (SparseLayouts.cpp), whose results are
// sparse while their arguments are dense.
void sparseFallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                    torch::jit::Stack* stack);

}  // namespace phantom
