// _copy_from understands lazily conjugated and negated tensors itself (the
// copy kernels run the CPU's copy_, which resolves both bits). ATen's
// Conjugate and Negative fallbacks would otherwise materialise such an
// argument first, by cloning it, which is a copy, which is _copy_from
// again: an endless recursion. Let _copy_from fall through both keys.
#include <torch/library.h>

TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}
