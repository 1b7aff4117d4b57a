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
using phantom::gloo_staging::GlooStagingConfig;
using phantom::gloo_staging::MakeCpuBackends;

namespace {

// The Python function that makes a group's two Gloo backends
// (torch_phantom.distributed._make_gloo_backends). Kept for the life of
// the process on purpose: a communicator may be destroyed, or split,
// after the interpreter has begun to shut down, when a py::object could
// no longer be released.
py::object* gloo_factory = nullptr;

MakeCpuBackends makeCpuBackends() {
  TORCH_CHECK(gloo_factory != nullptr,
              "torch_phantom._c10d: _set_gloo_factory() was not called");
  return [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
            std::chrono::milliseconds timeout) {
    py::gil_scoped_acquire gil;
    py::tuple backends = (*gloo_factory)(store, rank, size, timeout);
    return std::make_pair(backends[0].cast<c10::intrusive_ptr<c10d::Backend>>(),
                          backends[1].cast<c10::intrusive_ptr<c10d::Backend>>());
  };
}

}  // namespace

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "pccl, the c10d backend for phantom tensors (private; see "
            "torch_phantom.distributed)";

  auto group =
      py::class_<ProcessGroupPhantom, c10d::Backend,
                 c10::intrusive_ptr<ProcessGroupPhantom>>(m, "ProcessGroupPhantom")
          // torch.distributed.split_group deep-copies a parent's options.
          .def_property_readonly("options", &ProcessGroupPhantom::options);
  using PcclOptions = ProcessGroupPhantom::PcclOptions;
  py::class_<PcclOptions, c10d::Backend::Options, c10::intrusive_ptr<PcclOptions>>(
      group, "Options")
      .def("__copy__", [](const PcclOptions& self) {
        return c10::make_intrusive<PcclOptions>(self);
      })
      .def("__deepcopy__", [](const PcclOptions& self, const py::dict&) {
        return c10::make_intrusive<PcclOptions>(self);
      });

  // Which data path pccl's jobs took (tests/python/test_distributed_*).
  m.def("_data_path_counts", [] {
    const auto counts = phantom::gloo_staging::dataPathCounts();
    py::dict out;
    out["zero_copy"] = counts.zero_copy;
    out["staged"] = counts.staged;
    out["small"] = counts.small;
    return out;
  });

  m.def("_set_gloo_factory", [](py::function factory) {
    if (gloo_factory == nullptr) {
      gloo_factory = new py::object(std::move(factory));
    } else {
      *gloo_factory = std::move(factory);
    }
  });

  m.def(
      "_new_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, const std::string& group_name) {
        GlooStagingConfig config;
        config.make_backends = makeCpuBackends();
        std::tie(config.data, config.control) =
            config.make_backends(store, rank, size, timeout);
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
      py::arg("group_name"), py::call_guard<py::gil_scoped_release>());
}
