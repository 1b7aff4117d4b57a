// torch_phantom._C: the Python face of the runtime.
//
// Loading this module loads libphantom, whose static registrations give
// ATen the phantom device (backend name, guard, hooks, allocator, kernels).
// The functions here are the primitives python/torch_phantom builds the
// torch.phantom module from; they are private (leading underscore) and
// release the GIL wherever they may wait for the device.
#include <phantom/DeviceAllocator.h>
#include <phantom/Device.h>
#include <phantom/Generator.h>

#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

py::dict memoryStats(c10::DeviceIndex device) {
  const auto stats = phantom::deviceAllocator().getDeviceStats(device);
  py::dict result;
  const char* pools[] = {"all", "small_pool", "large_pool"};
  auto add_array = [&](const char* name, const c10::CachingAllocator::StatArray& array) {
    for (size_t i = 0; i < array.size(); ++i) {
      const std::string prefix = std::string(name) + "." + pools[i] + ".";
      result[py::str(prefix + "current")] = array[i].current;
      result[py::str(prefix + "peak")] = array[i].peak;
      result[py::str(prefix + "allocated")] = array[i].allocated;
      result[py::str(prefix + "freed")] = array[i].freed;
    }
  };
  add_array("allocation", stats.allocation);
  add_array("segment", stats.segment);
  add_array("active", stats.active);
  add_array("inactive_split", stats.inactive_split);
  add_array("allocated_bytes", stats.allocated_bytes);
  add_array("reserved_bytes", stats.reserved_bytes);
  add_array("active_bytes", stats.active_bytes);
  add_array("inactive_split_bytes", stats.inactive_split_bytes);
  add_array("requested_bytes", stats.requested_bytes);
  result["num_alloc_retries"] = stats.num_alloc_retries;
  result["num_ooms"] = stats.num_ooms;
  result["num_sync_all_streams"] = stats.num_sync_all_streams;
  result["num_device_alloc"] = stats.num_device_alloc;
  result["num_device_free"] = stats.num_device_free;
  result["oversize_allocations.current"] = stats.oversize_allocations.current;
  result["oversize_allocations.peak"] = stats.oversize_allocations.peak;
  result["oversize_segments.current"] = stats.oversize_segments.current;
  result["oversize_segments.peak"] = stats.oversize_segments.peak;
  result["max_split_size"] = stats.max_split_size;
  return result;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Phantom device runtime (private; use torch.phantom)";

  m.def("_device_count", [] { return phantom::deviceCountNoThrow(); });
  m.def("_driver_error", [] { return phantom::driverStartupError(); });
  m.def("_get_device", [] { return phantom::currentDevice(); });
  m.def("_set_device", [](c10::DeviceIndex d) { phantom::setCurrentDevice(d); });
  m.def("_exchange_device",
        [](c10::DeviceIndex d) { return phantom::exchangeDevice(d); });
  m.def("_check_device", [](c10::DeviceIndex d) { phantom::checkDeviceIndex(d); });
  m.def("_synchronize", [](c10::DeviceIndex d) {
    py::gil_scoped_release no_gil;
    phantom::synchronizeDevice(d);
  });

  m.def("_default_generator", [](c10::DeviceIndex d) {
    return py::reinterpret_borrow<py::object>(
        THPGenerator_initDefaultGenerator(phantom::defaultGenerator(d)));
  });

  m.def("_memory_stats", &memoryStats);
  m.def("_reset_peak_memory_stats", [](c10::DeviceIndex d) {
    phantom::deviceAllocator().resetPeakStats(d);
  });
  m.def("_reset_accumulated_memory_stats", [](c10::DeviceIndex d) {
    phantom::deviceAllocator().resetAccumulatedStats(d);
  });
  m.def("_empty_cache", [] {
    py::gil_scoped_release no_gil;
    phantom::deviceAllocator().emptyCache();
  });
  m.def("_mem_get_info", [](c10::DeviceIndex d) {
    return phantom::deviceAllocator().getMemoryInfo(d);
  });

  m.def("_register_fork_handler", [] {
    torch::utils::register_fork_handler_for_device_init(
        c10::DeviceType::PrivateUse1);
  });
  m.def("_is_in_bad_fork", [] {
    return torch::utils::is_device_in_bad_fork(c10::DeviceType::PrivateUse1);
  });
}
