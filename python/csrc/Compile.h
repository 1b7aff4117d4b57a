// torch.compile's runtime primitives in torch_phantom._C (Compile.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace phantom::python {

// Adds _CompiledKernel, _compiled_kernel, _empty_strided_phantom,
// _raw_stream and _device_properties to the module.
void initCompile(pybind11::module& m);

}  // namespace phantom::python
