// torch_phantom._C: the Python face of the runtime.
//
// Loading this module loads libphantom, whose static registrations give
// ATen the phantom device (backend name, guard, hooks, allocator, kernels).
// The functions here are the primitives python/torch_phantom builds the
// torch.phantom module from; they are private (leading underscore) and
// release the GIL wherever they may wait for the device.
#include <phantom/DeviceAllocator.h>
#include <phantom/Device.h>
#include <phantom/DeviceState.h>
#include <phantom/DriverLoader.h>
#include <phantom/FaultInjection.h>
#include <phantom/Generator.h>
#include <phantom/GpuTrace.h>
#include <phantom/Graph.h>
#include <phantom/HostAllocator.h>
#include <phantom/HostGuard.h>
#include <phantom/Ipc.h>
#include <phantom/KernelHostMemory.h>
#include <phantom/ops/GenericPath.h>
#include <phantom/ops/OpsReport.h>
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/hal.h>
#include <phantom/SyncDebug.h>

#include "Compile.h"
#include "MemoryHistory.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include <dlfcn.h>

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

// The caching allocator's statistics, nested as
// torch.cuda.memory_stats_as_nested_dict() nests them
// ({"allocated_bytes": {"all": {"current": ...}}}); memory.py flattens them.
py::dict memoryStats(c10::DeviceIndex device) {
  const auto stats = phantom::deviceAllocator().getDeviceStats(device);
  py::dict result;
  const char* pools[] = {"all", "small_pool", "large_pool"};
  const auto stat = [](const c10::CachingAllocator::Stat& s) {
    py::dict d;
    d["current"] = s.current;
    d["peak"] = s.peak;
    d["allocated"] = s.allocated;
    d["freed"] = s.freed;
    return d;
  };
  auto add_array = [&](const char* name, const c10::CachingAllocator::StatArray& array) {
    py::dict by_pool;
    for (size_t i = 0; i < array.size(); ++i) {
      by_pool[pools[i]] = stat(array[i]);
    }
    result[name] = by_pool;
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
  result["oversize_allocations"] = stat(stats.oversize_allocations);
  result["oversize_segments"] = stat(stats.oversize_segments);
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

py::dict deviceProperties(c10::DeviceIndex device) {
  const phantom::DeviceProperties props = phantom::deviceProperties(device);
  py::dict d;
  d["name"] = props.name;
  d["total_memory"] = props.total_memory;
  d["multi_processor_count"] = props.multi_processor_count;
  d["major"] = props.major;
  d["minor"] = props.minor;
  d["stream_priority_low"] = props.stream_priority_low;
  d["stream_priority_high"] = props.stream_priority_high;
  return d;
}

// What `python -m torch_phantom` reports about the driver, straight from the
// HAL: the ABI it was built for, the shared library it lives in, and each
// device's properties. A driver that failed to start has no devices here
// (_driver_error says why).
py::dict halInfo() {
  py::dict info;
  info["abi_version"] = ph_abi_version();
  info["runtime_abi_version"] = PH_HAL_ABI_VERSION;
  // The library the runtime loaded (PHANTOM_DRIVER), "" if none loaded.
  const phantom::driver::LoadedDriver& driver = phantom::driver::activeDriver();
  info["driver_library"] = driver.ok() ? driver.library : std::string();
  py::list devices;
  for (int d = 0; d < phantom::deviceCountNoThrow(); ++d) {
    devices.append(deviceProperties(static_cast<c10::DeviceIndex>(d)));
  }
  info["devices"] = devices;
  return info;
}

// Each measurement, or None where the driver does not take it.
py::dict deviceTelemetry(c10::DeviceIndex device) {
  const phantom::DeviceTelemetry t = phantom::deviceTelemetry(device);
  const auto value = [](const auto& optional) -> py::object {
    return optional ? py::cast(*optional) : py::none();
  };
  py::dict d;
  d["driver_reports"] = t.driver_reports;
  d["utilization"] = value(t.utilization_percent);
  d["memory_busy"] = value(t.memory_busy_percent);
  d["temperature"] = value(t.temperature_c);
  d["power_draw"] = value(t.power_draw_mw);
  d["clock_rate"] = value(t.clock_mhz);
  d["sample_period_us"] = t.sample_period_us;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Phantom device runtime (private; use torch.phantom)";
  phantom::python::initCompile(m);  // torch.compile's primitives
  phantom::python::initMemoryHistory(m);

  m.def("_device_count", [] { return phantom::deviceCountNoThrow(); });
  // Graphs (torch_phantom/graphs.py).
  m.def("_graph_pool_handle", [] {
    const c10::MempoolId_t id = phantom::newPrivatePoolId(/*user_created=*/true);
    return py::make_tuple(id.first, id.second);
  });
  m.def("_is_current_stream_capturing", [] {
    return phantom::isStreamCapturing(
        phantom::getCurrentPhantomStream().unwrap());
  });
  m.def("_graph_pool_reserved_bytes",
        [](c10::CaptureId_t first, c10::CaptureId_t second) {
          return phantom::privatePoolReservedBytes({first, second});
        });
  // Memory pools (torch_phantom/mempool.py).
  m.def("_mempool_create", [] {
    const c10::MempoolId_t id = phantom::memPoolCreate();
    return py::make_tuple(id.first, id.second);
  });
  m.def("_mempool_release", [](c10::CaptureId_t first, c10::CaptureId_t second) {
    phantom::privatePoolRelease({first, second});
  });
  m.def("_mempool_use_count",
        [](c10::CaptureId_t first, c10::CaptureId_t second) {
          return phantom::privatePoolUseCount({first, second});
        });
  m.def("_mempool_begin_allocate",
        [](c10::DeviceIndex device, c10::CaptureId_t first,
           c10::CaptureId_t second) {
          phantom::beginAllocateToPool(device, {first, second});
        });
  m.def("_mempool_end_allocate",
        [](c10::DeviceIndex device, c10::CaptureId_t first,
           c10::CaptureId_t second) {
          phantom::endAllocateToPool(device, {first, second});
        });
  m.def("_driver_error", [] { return phantom::driverStartupError(); });
  m.def("_hal_info", &halInfo);
  m.def("_get_device", [] { return phantom::currentDevice(); });
  m.def("_set_device", [](c10::DeviceIndex d) { phantom::setCurrentDevice(d); });
  m.def("_exchange_device",
        [](c10::DeviceIndex d) { return phantom::exchangeDevice(d); });
  m.def("_check_device", [](c10::DeviceIndex d) { phantom::checkDeviceIndex(d); });
  // Ends PyTorch's GPU trace hooks for phantom at interpreter exit
  // (phantom/GpuTrace.h).
  m.def("_stop_gpu_trace", [] { phantom::gpu_trace::stopTracing(); });
  // A trace hook runs with the caller's pending Python exception set aside
  // (phantom/GpuTrace.h, setHookShield).
  phantom::gpu_trace::setHookShield([](void (*call)(const void*), const void* arg) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* type = nullptr;
    PyObject* value = nullptr;
    PyObject* traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    try {
      call(arg);
    } catch (...) {
      PyErr_Restore(type, value, traceback);
      PyGILState_Release(gil);
      throw;
    }
    PyErr_Restore(type, value, traceback);
    PyGILState_Release(gil);
  });
  // The race detector's query observer (phantom/GpuTrace.h): called as
  // observer(method, handle, True) when a query through the device guard
  // answers "finished"; None removes it.
  m.def("_set_query_observer", [](py::object observer) {
    static PyObject* current = nullptr;  // a strong reference, or null
    phantom::gpu_trace::setQueryObserver(nullptr);
    Py_XDECREF(current);
    current = nullptr;
    if (observer.is_none()) {
      return;
    }
    current = observer.release().ptr();
    phantom::gpu_trace::setQueryObserver([](bool is_event, uintptr_t handle) {
      PyObject* callback = current;
      if (callback == nullptr || phantom::gpu_trace::tracingStopped()) {
        return;
      }
      phantom::gpu_trace::runHook([&] {
        PyObject* result = PyObject_CallFunction(
            callback, "sKO", is_event ? "sync_event" : "sync_stream",
            static_cast<unsigned long long>(handle), Py_True);
        if (result == nullptr) {
          throw py::error_already_set();
        }
        Py_DECREF(result);
      });
    });
  });
  // The race detector's record-stream observer (phantom/GpuTrace.h):
  // called as observer(address, stream_handle) when C++ records a stream
  // on a block through the device guard; None removes it.
  m.def("_set_record_stream_observer", [](py::object observer) {
    static PyObject* current = nullptr;  // a strong reference, or null
    phantom::gpu_trace::setRecordStreamObserver(nullptr);
    Py_XDECREF(current);
    current = nullptr;
    if (observer.is_none()) {
      return;
    }
    current = observer.release().ptr();
    phantom::gpu_trace::setRecordStreamObserver([](const void* data, uintptr_t stream) {
      PyObject* callback = current;
      if (callback == nullptr || phantom::gpu_trace::tracingStopped()) {
        return;
      }
      phantom::gpu_trace::runHook([&] {
        PyObject* result = PyObject_CallFunction(
            callback, "KK", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(data)),
            static_cast<unsigned long long>(stream));
        if (result == nullptr) {
          throw py::error_already_set();
        }
        Py_DECREF(result);
      });
    });
  });
  // The race detector's work-stream observer (phantom/GpuTrace.h): called
  // as observer(after_handle, device, stream_id, stream_handle) when the op
  // being dispatched queues its work on another stream (pccl's
  // collectives); None removes it.
  m.def("_set_work_stream_observer", [](py::object observer) {
    static PyObject* current = nullptr;  // a strong reference, or null
    phantom::gpu_trace::setWorkStreamObserver(nullptr);
    Py_XDECREF(current);
    current = nullptr;
    if (observer.is_none()) {
      return;
    }
    current = observer.release().ptr();
    phantom::gpu_trace::setWorkStreamObserver(
        [](uintptr_t after, c10::DeviceIndex device, int64_t stream_id, uintptr_t handle) {
          PyObject* callback = current;
          if (callback == nullptr || phantom::gpu_trace::tracingStopped()) {
            return;
          }
          phantom::gpu_trace::runHook([&] {
            PyObject* result = PyObject_CallFunction(
                callback, "KiLK", static_cast<unsigned long long>(after),
                static_cast<int>(device), static_cast<long long>(stream_id),
                static_cast<unsigned long long>(handle));
            if (result == nullptr) {
              throw py::error_already_set();
            }
            Py_DECREF(result);
          });
        });
  });
  // torch.phantom._gpu_trace's device-synchronize callbacks that take the
  // device index (phantom/GpuTrace.h, DeviceSyncObserver): called as
  // observer(device); None removes it.
  m.def("_set_device_sync_observer", [](py::object observer) {
    static PyObject* current = nullptr;  // a strong reference, or null
    phantom::gpu_trace::setDeviceSyncObserver(nullptr);
    Py_XDECREF(current);
    current = nullptr;
    if (observer.is_none()) {
      return;
    }
    current = observer.release().ptr();
    phantom::gpu_trace::setDeviceSyncObserver([](c10::DeviceIndex device) {
      PyObject* callback = current;
      if (callback == nullptr || phantom::gpu_trace::tracingStopped()) {
        return;
      }
      phantom::gpu_trace::runHook([&] {
        PyObject* result = PyObject_CallFunction(callback, "i", static_cast<int>(device));
        if (result == nullptr) {
          throw py::error_already_set();
        }
        Py_DECREF(result);
      });
    });
  });
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
  // A driver stream handle (ph_stream_t, as an int) as (stream_id,
  // device_index): one of the runtime's streams, or an external one.
  m.def("_stream_from_handle", [](uintptr_t handle, c10::DeviceIndex device) {
    const phantom::PhantomStream stream = phantom::streamFromHandle(
        reinterpret_cast<ph_stream_t>(handle), device);
    return py::make_tuple(stream.id(), stream.device_index());
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
  m.def("_set_memory_fraction", [](double fraction, c10::DeviceIndex d) {
    phantom::deviceAllocator().setMemoryFraction(fraction, d);
  });
  m.def("_get_memory_fraction", [](c10::DeviceIndex d) {
    return phantom::deviceAllocator().memoryFraction(d);
  });
  m.def("_caching_allocator_enable", [](bool enabled) {
    phantom::deviceAllocator().setCachingEnabled(enabled);
  });
  m.def("_caching_allocator_is_enabled",
        [] { return phantom::deviceAllocator().cachingEnabled(); });
  // caching_allocator_alloc: memory for work on the stream (device, id).
  m.def("_caching_allocator_raw_alloc",
        [](size_t size, c10::DeviceIndex device, c10::StreamId stream) {
          phantomStream(device, stream);  // checks the stream exists
          return reinterpret_cast<uintptr_t>(
              phantom::deviceAllocator().rawAlloc(size, device, stream));
        },
        py::call_guard<py::gil_scoped_release>());
  m.def("_caching_allocator_raw_delete",
        [](uintptr_t ptr) {
          phantom::deviceAllocator().rawDelete(reinterpret_cast<void*>(ptr));
        },
        py::call_guard<py::gil_scoped_release>());

  // Device information and state (device_module.py, device_state.py).
  m.def("_device_properties", &deviceProperties);
  m.def("_device_telemetry", &deviceTelemetry);
  m.def("_device_memory_used",
        [](c10::DeviceIndex d) { return phantom::deviceMemoryUsed(d); });

  // torch.phantom.set_sync_debug_mode (phantom/SyncDebug.h).
  m.def("_set_sync_debug_mode", [](int mode) {
    phantom::setSyncDebugMode(static_cast<phantom::SyncDebugMode>(mode));
  });
  m.def("_get_sync_debug_mode",
        [] { return static_cast<int>(phantom::syncDebugMode()); });

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

  // Guards of non_blocking copies' destinations (phantom/HostGuard.h; the
  // race detector).
  m.def("_host_guard_available", [](c10::DeviceIndex device) {
    return phantom::host_guard::available(device);
  });
  m.def("_host_guard_protect", [](const at::Tensor& tensor) -> uint64_t {
    // Only a destination the runtime writes with one asynchronous copy
    // (ops/Copy.cpp): others are written on the host after a wait.
    if (!tensor.is_non_overlapping_and_dense() || tensor.is_conj() ||
        tensor.is_neg() || !tensor.device().is_cpu()) {
      return 0;
    }
    const c10::Storage& storage = tensor.storage();
    const size_t offset = static_cast<size_t>(tensor.storage_offset()) *
                          tensor.element_size();
    return phantom::host_guard::protect(storage, offset, tensor.nbytes(),
                                        phantom::ownsPinnedBlock(storage));
  });
  m.def("_host_guard_release",
        [](uint64_t id) { return phantom::host_guard::release(id); });
  m.def("_host_guard_take_violations",
        [] { return phantom::host_guard::takeViolations(); });
  m.def("_host_guard_active_count",
        [] { return phantom::host_guard::activeCount(); });

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
      entry["copied"] = row.copied_calls;
      entry["sync_reason"] = row.sync_reason;
      rows.append(entry);
    }
    return rows;
  });
  m.def("_reset_ops_report", [] { phantom::resetOpsReport(); });
  // Whether the driver offers the kernel view; without it ops take the
  // copying CPU fallback (ops/CopyingFallback.cpp).
  m.def("_has_kernel_view", [] { return phantom::kernelViewAvailable(); });

  // Fault injection (torch_phantom/faults.py).
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

  // Interprocess sharing (torch_phantom/multiprocessing.py, phantom/Ipc.h).
  // The tuple is the one torch's UntypedStorage._share_cuda_ returns.
  m.def("_share_storage", [](py::handle object) {
    TORCH_CHECK(THPStorage_Check(object.ptr()),
                "expected a torch.UntypedStorage, got ",
                Py_TYPE(object.ptr())->tp_name);
    c10::Storage storage = THPStorage_Unpack(object.ptr());
    phantom::SharedStorage shared;
    {
      py::gil_scoped_release no_gil;  // may wait for the stream
      shared = phantom::shareStorage(storage.unsafeGetStorageImpl());
    }
    return py::make_tuple(
        shared.device, py::bytes(shared.memory_handle), shared.storage_bytes,
        shared.offset_bytes, py::bytes(shared.ref_counter_handle),
        shared.ref_counter_offset, py::bytes(shared.event_handle),
        shared.event_sync_required);
  });
  m.def("_new_shared_storage",
        [](c10::DeviceIndex device, py::bytes handle, size_t storage_bytes,
           size_t offset_bytes, py::bytes ref_counter_handle,
           int64_t ref_counter_offset, py::bytes event_handle,
           bool event_sync_required) {
          phantom::SharedStorage shared;
          shared.device = device;
          shared.memory_handle = handle;
          shared.storage_bytes = storage_bytes;
          shared.offset_bytes = offset_bytes;
          shared.ref_counter_handle = ref_counter_handle;
          shared.ref_counter_offset = ref_counter_offset;
          shared.event_handle = event_handle;
          shared.event_sync_required = event_sync_required;
          c10::intrusive_ptr<c10::StorageImpl> storage;
          {
            py::gil_scoped_release no_gil;
            storage = phantom::newSharedStorage(shared);
          }
          return py::reinterpret_steal<py::object>(
              THPStorage_Wrap(c10::Storage(std::move(storage))));
        });
  m.def("_release_ipc_counter", [](py::bytes handle, int64_t offset) {
    phantom::releaseIpcCounter(handle, offset);
  });
  m.def("_ipc_collect", [] {
    py::gil_scoped_release no_gil;
    return phantom::ipcCollect();
  });
  m.def("_ipc_blocks_in_limbo", [] { return phantom::ipcBlocksInLimbo(); });
  py::class_<phantom::IpcEvent>(m, "_IpcEvent")
      .def(py::init<c10::DeviceIndex>())
      .def(py::init([](c10::DeviceIndex device, py::bytes handle) {
        return std::make_unique<phantom::IpcEvent>(device, handle);
      }))
      .def_property_readonly("device", &phantom::IpcEvent::device)
      .def("handle",
           [](const phantom::IpcEvent& event) { return py::bytes(event.handle()); })
      .def("record",
           [](phantom::IpcEvent& event, c10::DeviceIndex device,
              c10::StreamId id) { event.record(phantomStream(device, id)); })
      .def("wait",
           [](phantom::IpcEvent& event, c10::DeviceIndex device,
              c10::StreamId id) { event.wait(phantomStream(device, id)); })
      .def("query", &phantom::IpcEvent::query,
           py::call_guard<py::gil_scoped_release>())
      .def("synchronize", &phantom::IpcEvent::synchronize,
           py::call_guard<py::gil_scoped_release>());

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
}
