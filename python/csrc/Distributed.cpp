// torch_phantom._c10d: the Python face of pccl, phantom's c10d backend.
//
// A separate extension from _C, loaded only when a process group is made
// (python/torch_phantom/distributed.py registers the backend with a
// creator that imports this module), so `import torch` pays nothing for it.
//
// This is also where the collective library is chosen: a vendor builds
// their ccl::Communicator here instead of the Gloo staging one.
#include <phantom/distributed/ProcessGroupPhantom.h>
#include <phantom/gloo_staging/GlooStaging.h>

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

using phantom::distributed::ProcessGroupPhantom;

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "pccl, the c10d backend for phantom tensors (private; see "
            "torch_phantom.distributed)";

  py::class_<ProcessGroupPhantom, c10d::Backend,
             c10::intrusive_ptr<ProcessGroupPhantom>>(m, "ProcessGroupPhantom");

  m.def(
      "_new_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, const std::string& group_name,
         const c10::intrusive_ptr<c10d::Backend>& data,
         const c10::intrusive_ptr<c10d::Backend>& control) {
        phantom::gloo_staging::GlooStagingConfig config;
        config.data = data;
        config.control = control;
        config.store = store;
        config.rank = rank;
        config.size = size;
        config.timeout = timeout;
        config.group_name = group_name;
        return c10::make_intrusive<ProcessGroupPhantom>(
            rank, size, timeout, group_name,
            phantom::gloo_staging::makeGlooStagingCommunicator(std::move(config)));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("group_name"), py::arg("data"), py::arg("control"),
      py::call_guard<py::gil_scoped_release>());
}
