// Bindings of the allocator's snapshot and memory history (MemoryHistory.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace phantom::python {

void initMemoryHistory(pybind11::module& m);

}  // namespace phantom::python
