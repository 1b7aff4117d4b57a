// torch_phantom._C: the Python face of the runtime.
//
// Loading this module loads libphantom, whose static registrations give
// ATen the phantom device (backend name, guard, hooks, allocator, kernels).
// The functions here are the primitives python/torch_phantom builds the
// torch.phantom module from; they are private (leading underscore) and
// release the GIL wherever they may wait for the device.
#include <phantom/DeviceAllocator.h>
#include <phantom/Device.h>
#include <phantom/FaultInjection.h>
#include <phantom/Generator.h>
#include <phantom/HostAllocator.h>
#include <phantom/KernelHostMemory.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>

#include "Compile.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <thread>

namespace py = pybind11;

namespace {

phantom::PhantomStream phantomStream(c10::DeviceIndex device,
                                     c10::StreamId id) {
  return phantom::PhantomStream(c10::Stream(
      c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
      id));
}

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

// Same keys as torch.cuda.host_memory_stats_as_nested_dict().
py::dict hostMemoryStats() {
  const at::HostStats stats = phantom::hostMemoryStats();
  const auto stat = [](const c10::CachingAllocator::Stat& s) {
    py::dict d;
    d["current"] = s.current;
    d["peak"] = s.peak;
    d["allocated"] = s.allocated;
    d["freed"] = s.freed;
    return d;
  };
  const auto duration = [](const c10::CachingAllocator::DurationStat& s) {
    py::dict d;
    d["total"] = s.total;
    d["max"] = s.max;
    d["min"] = s.min;
    d["count"] = s.count;
    d["avg"] = s.count == 0 ? 0 : s.total / s.count;
    return d;
  };
  py::dict result;
  result["num_host_alloc"] = stats.num_host_alloc;
  result["num_host_free"] = stats.num_host_free;
  result["allocations"] = stat(stats.allocations);
  result["allocated_bytes"] = stat(stats.allocated_bytes);
  result["active_requests"] = stat(stats.active_requests);
  result["active_bytes"] = stat(stats.active_bytes);
  result["host_alloc_time"] = duration(stats.host_alloc_time);
  result["host_free_time"] = duration(stats.host_free_time);
  return result;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Phantom device runtime (private; use torch.phantom)";
  phantom::python::initCompile(m);  // torch.compile's primitives

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

  // Streams (torch_phantom/streams.py). A stream is named by its
  // (device_index, stream_id) pair, as torch.Stream carries it.
  m.def("_stream_priority",
        [](c10::DeviceIndex device, c10::StreamId id) {
          return phantomStream(device, id).priority();
        });
  m.def("_stream_priority_range", [] {
    return py::make_tuple(phantom::kLowPriority, phantom::kHighPriority);
  });
  // torch.Event.elapsed_time accepts only an end event of exactly type
  // torch.Event (a Py_TYPE check), not torch.phantom.Event; this is the same
  // call through the device guard, on the events' ids (the driver handles
  // DeviceGuard.cpp stores). streams.py checks timing and recording first.
  m.def("_event_elapsed_time",
        [](uintptr_t start, uintptr_t end, c10::DeviceIndex device) {
          TORCH_CHECK(start != 0 && end != 0,
                      "elapsed_time needs both events to have been recorded");
          return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
              ->elapsedTime(reinterpret_cast<void*>(start),
                            reinterpret_cast<void*>(end), device);
        },
        py::call_guard<py::gil_scoped_release>());
  // Test-only: queues work that sleeps `ms` milliseconds on the stream, a
  // stand-in for a long kernel (tests/python/test_streams.py).
  m.def("_sleep_on_stream",
        [](c10::DeviceIndex device, c10::StreamId id, double ms) {
          TORCH_CHECK(ms >= 0, "sleep time must be non-negative, got ", ms);
          phantom::launchAsync(phantomStream(device, id), "sleep", [ms] {
            std::this_thread::sleep_for(
                std::chrono::duration<double, std::milli>(ms));
          });
        },
        py::call_guard<py::gil_scoped_release>());

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

  // First use of the device: checks that the driver started and registers
  // the runtime's fork handler (phantom/Device.h).
  m.def("_init_runtime", [] { phantom::deviceCountOrThrow(); });
  m.def("_raise_bad_fork", [] { phantom::throwBadFork(); });
  m.def("_register_fork_handler", [] {
    torch::utils::register_fork_handler_for_device_init(
        c10::DeviceType::PrivateUse1);
  });
  // The runtime's own flag (set by its pthread_atfork handler, see
  // phantom/Device.h) or torch's, set by the handler above.
  m.def("_is_in_bad_fork", [] {
    return phantom::inBadFork() ||
           torch::utils::is_device_in_bad_fork(c10::DeviceType::PrivateUse1);
  });

  // Pinned host memory (torch_phantom/memory.py).
  m.def("_host_memory_stats", &hostMemoryStats);
  m.def("_host_empty_cache", [] {
    py::gil_scoped_release no_gil;
    phantom::emptyHostCache();
  });
  m.def("_reset_peak_host_memory_stats",
        [] { phantom::resetPeakHostMemoryStats(); });
  m.def("_reset_accumulated_host_memory_stats",
        [] { phantom::resetAccumulatedHostMemoryStats(); });

  // The CPU kernels' cached host workspace (phantom/KernelHostMemory.h).
  m.def("_kernel_host_memory_stats", [] {
    const phantom::KernelHostMemoryStats stats =
        phantom::kernelHostMemoryStats();
    py::dict d;
    d["cached_bytes"] = stats.cached_bytes;
    d["cached_blocks"] = stats.cached_blocks;
    d["live_bytes"] = stats.live_bytes;
    d["live_blocks"] = stats.live_blocks;
    d["reused"] = stats.reused;
    d["fresh"] = stats.fresh;
    d["lent"] = stats.lent;
    d["in_place"] = stats.in_place;
    return d;
  });

  // Which path each op took (torch_phantom.ops_report()).
  m.def("_ops_report", [] {
    py::list rows;
    for (const auto& row : phantom::opsReport()) {
      py::dict entry;
      entry["op"] = row.op;
      entry["native"] = row.native_calls;
      entry["async"] = row.async_calls;
      entry["sync"] = row.sync_calls;
      entry["sync_reason"] = row.sync_reason;
      rows.append(entry);
    }
    return rows;
  });
  m.def("_reset_ops_report", [] { phantom::resetOpsReport(); });

  // Fault injection (torch_phantom/faults.py).
  m.def("_faults_check_environment", [] { phantom::checkFaultEnvironment(); });
  m.def("_faults_fail_allocation",
        [](int64_t k) { phantom::failAllocation(k); });
  m.def("_faults_fail_kernel", [](int64_t k) { phantom::failKernel(k); });
  m.def("_faults_set_latency_us",
        [](int64_t us) { phantom::setFaultLatencyUs(us); });
  m.def("_faults_reset", [] { phantom::resetFaults(); });
  m.def("_faults_state", [] {
    py::dict state;
    state["allocation_count"] = phantom::faultAllocationCount();
    state["kernel_count"] = phantom::faultKernelCount();
    state["allocations_until_fault"] = phantom::allocationsUntilFault();
    state["kernels_until_fault"] = phantom::kernelsUntilFault();
    state["latency_us"] = phantom::faultLatencyUs();
    return state;
  });

  // Caching allocator (torch_phantom/memory.py).
  m.def("_check_allocator_settings", [] {
    const auto& settings = phantom::deviceAllocator().settings();
    py::dict result;
    result["max_split_size"] = settings.max_split_size == SIZE_MAX
                                   ? py::none()
                                   : py::cast(settings.max_split_size);
    result["garbage_collection_threshold"] = settings.garbage_collection_threshold;
    return result;
  });
  m.def("_memory_snapshot", [] {
    py::list segments;
    for (const auto& segment : phantom::deviceAllocator().snapshot()) {
      py::dict info;
      info["device"] = segment.device;
      info["address"] = segment.address;
      info["total_size"] = segment.total_size;
      info["allocated_size"] = segment.allocated_size;
      info["active_size"] = segment.active_size;
      info["requested_size"] = segment.requested_size;
      info["stream"] = reinterpret_cast<int64_t>(segment.stream);
      info["segment_type"] = segment.is_large ? "large" : "small";
      py::list blocks;
      size_t address = segment.address;
      for (const auto& block : segment.blocks) {
        py::dict entry;
        entry["address"] = address;
        entry["size"] = block.size;
        entry["requested_size"] = block.requested_size;
        entry["state"] = block.allocated ? "active_allocated"
                         : block.active ? "active_pending_free"
                                        : "inactive";
        blocks.append(entry);
        address += block.size;
      }
      info["blocks"] = blocks;
      segments.append(info);
    }
    return segments;
  });
}
