// The Python face of the device allocator's state and memory history
// (torch_phantom/memory.py: memory_snapshot, _record_memory_history,
// _snapshot, _attach_out_of_memory_observer).
//
// A snapshot is built as torch.cuda.memory._snapshot() builds CUDA's, so
// that PyTorch's memory_viz reads it: "segments" (each with its blocks in
// address order, tiling the segment) and "device_traces" (one list of
// trace entries per device). The runtime keeps stacks as unsymbolized
// CapturedTracebacks; they are symbolized here, all at once (frames shared
// between stacks are resolved once), into lists of {filename, line, name}.
//
// Stacks of Python frames need torch's Python unwinder, which this module
// registers when it loads.
#include "MemoryHistory.h"

#include <phantom/AllocatorHistory.h>
#include <phantom/DeviceAllocator.h>
#include <phantom/DeviceWork.h>

#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <unordered_map>

namespace py = pybind11;

// From torch/csrc/profiler/python/combined_traceback.h (libtorch_python),
// which the wheel ships without the nlohmann/json.hpp it includes.
namespace torch {
std::vector<pybind11::object> py_symbolize(
    std::vector<CapturedTraceback*>& to_symbolize);
void freeDeadCapturedTracebackFrames();
void installCapturedTracebackPython();
}  // namespace torch

namespace phantom::python {
namespace {

using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::TraceEntry;

const char* actionName(TraceEntry::Action action) {
  switch (action) {
    case TraceEntry::ALLOC:
      return "alloc";
    case TraceEntry::FREE_REQUESTED:
      return "free_requested";
    case TraceEntry::FREE_COMPLETED:
      return "free_completed";
    case TraceEntry::SEGMENT_ALLOC:
      return "segment_alloc";
    case TraceEntry::SEGMENT_FREE:
      return "segment_free";
    case TraceEntry::SEGMENT_MAP:
      return "segment_map";
    case TraceEntry::SEGMENT_UNMAP:
      return "segment_unmap";
    case TraceEntry::SNAPSHOT:
      return "snapshot";
    case TraceEntry::OOM:
      return "oom";
  }
  return "unknown";
}

// Symbolizes every stack of a snapshot in one call and hands out each
// one's frames (an empty list for none).
class Frames {
 public:
  void add(const std::shared_ptr<c10::GatheredContext>& context) {
    auto* traceback = dynamic_cast<torch::CapturedTraceback*>(context.get());
    if (traceback != nullptr && index_.emplace(traceback, pending_.size()).second) {
      pending_.push_back(traceback);
    }
  }

  void symbolize() { symbolized_ = torch::py_symbolize(pending_); }

  py::object of(const std::shared_ptr<c10::GatheredContext>& context) const {
    auto* traceback = dynamic_cast<torch::CapturedTraceback*>(context.get());
    auto it = index_.find(traceback);
    return it == index_.end() ? py::list() : symbolized_[it->second];
  }

 private:
  std::unordered_map<torch::CapturedTraceback*, size_t> index_;
  std::vector<torch::CapturedTraceback*> pending_;
  std::vector<py::object> symbolized_;
};

py::list segmentsToPython(const std::vector<SegmentInfo>& segments,
                          const Frames& frames) {
  py::list result;
  for (const auto& segment : segments) {
    py::dict info;
    info["device"] = segment.device;
    info["address"] = segment.address;
    info["total_size"] = segment.total_size;
    info["allocated_size"] = segment.allocated_size;
    info["active_size"] = segment.active_size;
    info["requested_size"] = segment.requested_size;
    info["stream"] = reinterpret_cast<int64_t>(segment.stream);
    info["segment_type"] = segment.is_large ? "large" : "small";
    info["segment_pool_id"] = py::make_tuple(segment.owner_private_pool_id.first,
                                             segment.owner_private_pool_id.second);
    info["is_expandable"] = false;
    info["frames"] = frames.of(segment.context_when_allocated);
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
      entry["frames"] = frames.of(block.context_when_allocated);
      blocks.append(entry);
      address += block.size;
    }
    info["blocks"] = blocks;
    result.append(info);
  }
  return result;
}

py::dict snapshot() {
  auto& allocator = deviceAllocator();
  std::vector<SegmentInfo> segments;
  std::vector<std::vector<TraceEntry>> traces;
  {
    py::gil_scoped_release no_gil;  // the allocator's locks, never with the GIL
    segments = allocator.snapshot();
    traces = allocator.traces();
  }
  Frames frames;
  for (const auto& segment : segments) {
    frames.add(segment.context_when_allocated);
    for (const auto& block : segment.blocks) {
      frames.add(block.context_when_allocated);
    }
  }
  for (const auto& trace : traces) {
    for (const auto& entry : trace) {
      frames.add(entry.context_);
    }
  }
  frames.symbolize();
  torch::freeDeadCapturedTracebackFrames();

  py::list device_traces;
  for (const auto& trace : traces) {
    py::list entries;
    for (const auto& entry : trace) {
      py::dict item;
      item["action"] = actionName(entry.action_);
      if (entry.action_ == TraceEntry::OOM) {
        item["device_free"] = entry.addr_;
      } else {
        item["addr"] = entry.addr_;
      }
      item["size"] = entry.size_;
      item["stream"] = reinterpret_cast<int64_t>(entry.stream_);
      item["time_us"] = static_cast<int64_t>(entry.time_.t_ / 1000);
      item["frames"] = frames.of(entry.context_);
      entries.append(item);
    }
    device_traces.append(entries);
  }
  py::dict result;
  result["segments"] = segmentsToPython(segments, frames);
  result["device_traces"] = device_traces;
  const auto& settings = allocator.settings();
  py::dict allocator_settings;
  allocator_settings["max_split_size"] =
      settings.max_split_size == SIZE_MAX
          ? int64_t{-1}
          : static_cast<int64_t>(settings.max_split_size);
  allocator_settings["garbage_collection_threshold"] =
      settings.garbage_collection_threshold;
  allocator_settings["record_memory_history"] = settings.record_memory_history;
  result["allocator_settings"] = allocator_settings;
  return result;
}

void recordHistory(bool enabled, bool trace, int context, bool cpp_frames,
                   size_t max_entries, bool clear, uint32_t skip_actions) {
  HistoryOptions options;
  options.enabled = enabled;
  options.trace = trace;
  options.context = static_cast<RecordContext>(context);
  options.cpp_frames = cpp_frames;
  options.max_entries = max_entries;
  options.clear = clear;
  options.skip_actions = skip_actions;
  py::gil_scoped_release no_gil;
  deviceAllocator().recordHistory(options);
}

void attachObserver(py::object observer) {
  // Observers live as long as the process (as on CUDA): never freed, so
  // never decref'd without the GIL.
  auto* held = new py::object(std::move(observer));
  attachOutOfMemoryObserver([held](c10::DeviceIndex device, size_t requested,
                                   size_t allowed, size_t free) {
    // Device work on a stream worker must not wait for the GIL: a host
    // thread holding it may be waiting for that stream.
    if (inDeviceWork()) {
      return;
    }
    py::gil_scoped_acquire gil;
    try {
      (*held)(device, requested, allowed, free);
    } catch (py::error_already_set& error) {
      // The out-of-memory error is what the caller must see.
      error.discard_as_unraisable("out-of-memory observer");
    }
  });
}

}  // namespace

void initMemoryHistory(py::module& m) {
  // Python frames in stacks; costs nothing until history records
  // (PHANTOM_ALLOC_CONF=record_memory_history:N records from start-up).
  torch::installCapturedTracebackPython();
  m.def("_memory_snapshot", [] {
    const py::dict full = snapshot();
    return py::object(full["segments"]);
  });
  m.def("_memory_snapshot_full", &snapshot);
  m.def("_record_memory_history", &recordHistory, py::arg("enabled"),
        py::arg("trace"), py::arg("context"), py::arg("cpp_frames"),
        py::arg("max_entries"), py::arg("clear"), py::arg("skip_actions"));
  m.def("_attach_out_of_memory_observer", &attachObserver);
}

}  // namespace phantom::python
