// libFuzzer target: random programs of HAL calls, checked against a model.
//
// The fuzz input is a byte program. Each step reads an opcode byte and the
// argument bytes it needs (an exhausted input reads as zeros) and issues
// one call of phantom/hal.h: ph_malloc of any size (0, tiny, the whole
// capacity, more than exists), ph_free of live, freed, interior and made-up
// pointers, ph_host_malloc/free, sync and async copies and fills between
// device, pinned and pageable buffers, stream and event calls with live,
// destroyed, null and wrong-kind handles, host tasks (which also call the
// HAL from inside a stream's worker), set_device with good and bad indices,
// and a sub-program run at the same time by a second thread.
//
// The fuzzer keeps a model of what it created, and after every call checks
// the driver against hal.h:
//  - the status is one the header documents for that call and situation
//    (an exact one wherever the model can know it), and every error leaves
//    a non-empty ph_last_error_message();
//  - memory bookkeeping: ph_mem_get_info's free bytes equal the capacity
//    minus the model's live allocations, a success never over-commits, an
//    allocation larger than what is free fails with PH_ERROR_OUT_OF_MEMORY,
//    live allocations never overlap and are 256-byte aligned;
//  - data: every buffer has a host shadow of its first kWindow bytes, and
//    a read-back (after synchronizing the stream that last touched it)
//    must match every byte the model knows;
//  - streams: a stream made sticky by a failing task, or by a wait on an
//    event recorded after such a failure (hal.h's error model), reports
//    exactly that status on synchronize; an event reports exactly the
//    failure of the work before its record once reached; an event recorded
//    on a stream is reached once that stream has been synchronized;
//    ph_event_elapsed_time of two reached records on one stream is >= 0;
//  - host tasks: every task given to ph_launch_host_func (or run and
//    waited for with ph_run_host_func) is released exactly
//    once, runs at most once and before its release, and runs unless its
//    stream was already failing;
//  - at the end of each input everything is destroyed and freed, and every
//    device's free memory is back to its capacity.
// A violation prints what was expected and calls abort(), which libFuzzer
// reports as a crash with the reproducer's path.
//
// The fuzzer itself only issues memory ranges that are valid for the host:
// the driver cannot check raw pageable pointers, so out-of-range requests
// are made only against device and pinned memory, which the driver tracks.
// Handles, on the other hand, may be anything. Calls that could hit an
// object of the other thread (freeing a stale or made-up pointer) are made
// only while no second thread runs. Made-up handles have the top bit set:
// the fake's handles come from a counter and never do, so a made-up handle
// can never name a live object by accident.
//
// The driver reads PHANTOM_DEVICE_MEMORY once, at its first call, so
// LLVMFuzzerInitialize sets a small capacity (64 MiB, two devices) to make
//
// The code: fuzz_model.h (the model and the checks), fuzz_memory.cc,
// fuzz_streams.cc, and here the device calls, the second thread, the
// interpreter, teardown and libFuzzer's entry points.
#include "fuzz_model.h"

namespace hal_fuzz {

/* ---- Devices ------------------------------------------------------------ */

void Program::SetDevice(Input& in) {
  bool valid = true;
  const int device = PickDevice(in, &valid);
  const ph_status_t status = ph_set_device(device);
  Expect("ph_set_device", status,
         {valid ? PH_SUCCESS : PH_ERROR_INVALID_DEVICE});
  if (valid) current_device_ = device;
  int current = -1;
  Expect("ph_get_device", ph_get_device(&current), {PH_SUCCESS});
  if (current_device_ >= 0 && current != current_device_) {
    Violation("ph_get_device gave %d after ph_set_device(%d)", current,
              current_device_);
  }
  int count = 0;
  Expect("ph_device_count", ph_device_count(&count), {PH_SUCCESS});
  if (count != hal_fuzz::kDevices) Violation("ph_device_count changed to %d", count);
}

void Program::DeviceSync(Input& in) {
  bool valid = true;
  const int device = PickDevice(in, &valid);
  const ph_status_t status = ph_device_synchronize(device);
  if (!valid) {
    Expect("ph_device_synchronize of a bad device", status,
           {PH_ERROR_INVALID_DEVICE});
    return;
  }
  if (concurrent_) {
    // The other thread's streams may have failed with any task status.
    Expect("ph_device_synchronize", status,
           {PH_SUCCESS, PH_ERROR_DEVICE, PH_ERROR_INVALID_ARGUMENT,
            PH_ERROR_OUT_OF_MEMORY, PH_ERROR_UNIMPLEMENTED});
  } else {
    std::vector<ph_status_t> allowed;
    for (const auto& stream : streams_) {
      if (stream->device == device && stream->doom != PH_SUCCESS) {
        allowed.push_back(stream->doom);
      }
    }
    if (allowed.empty()) {
      Expect("ph_device_synchronize", status, {PH_SUCCESS});
    } else if (std::find(allowed.begin(), allowed.end(), status) ==
               allowed.end()) {
      Violation("ph_device_synchronize(%d) returned %s, not the sticky "
                "error of one of its failing streams",
                device, ph_status_name(status));
    }
  }
  for (const auto& stream : std::vector<StreamRef>(streams_)) {
    if (stream->device == device) StreamSynchronized(stream);
  }
}

void Program::MemInfo(Input& in) {
  bool valid = true;
  const int device = PickDevice(in, &valid);
  if (valid) {
    CheckMemory(device);
    return;
  }
  size_t free_bytes = 1, total = 1;
  Expect("ph_mem_get_info of a bad device",
         ph_mem_get_info(device, &free_bytes, &total),
         {PH_ERROR_INVALID_DEVICE});
  if (free_bytes != 0 || total != 0) Violation("ph_mem_get_info left values");
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  Expect("ph_device_get_properties of a bad device",
         ph_device_get_properties(device, &props), {PH_ERROR_INVALID_DEVICE});
}

void Program::Attributes(Input& in) {
  const uint8_t mode = in.U8();
  ph_pointer_attributes_t attr;
  if (mode % 4 == 0) {  // a freed device pointer, when nobody reused it
    if (concurrent_ || freed_device_.empty()) return;
    uint8_t* stale = freed_device_[in.Below(freed_device_.size())];
    if (InLive(buffers_, stale)) return;
    Expect("ph_pointer_get_attributes",
           ph_pointer_get_attributes(stale, &attr), {PH_SUCCESS});
    if (attr.type != PH_MEMORY_DEVICE || attr.base != nullptr ||
        attr.size != 0) {
      Violation("attributes of freed device pointer %p: type %d base %p "
                "size %zu (expected device memory outside any allocation)",
                static_cast<void*>(stale), attr.type, attr.base, attr.size);
    }
    return;
  }
  BufferRef buffer = PickAnyBuffer(in);
  if (!buffer) {
    Expect("ph_pointer_get_attributes(NULL)",
           ph_pointer_get_attributes(nullptr, &attr), {PH_SUCCESS});
    if (attr.type != PH_MEMORY_UNREGISTERED) Violation("NULL is registered");
    return;
  }
  const size_t offset = in.Below(buffer->size);
  Expect("ph_pointer_get_attributes",
         ph_pointer_get_attributes(buffer->ptr + offset, &attr), {PH_SUCCESS});
  ph_memory_type_t type = PH_MEMORY_UNREGISTERED;
  int device = -1;
  void* base = nullptr;
  size_t size = 0;
  if (buffer->kind == BufferKind::kDevice) {
    type = PH_MEMORY_DEVICE;
    device = buffer->device;
  }
  if (buffer->kind != BufferKind::kPageable) {
    if (buffer->kind == BufferKind::kPinned) type = PH_MEMORY_HOST_PINNED;
    base = buffer->ptr;
    size = buffer->size;
  }
  if (attr.type != type || attr.device != device || attr.base != base ||
      attr.size != size) {
    Violation("attributes of %p (+%zu in a %zu-byte buffer): type %d device "
              "%d base %p size %zu; expected type %d device %d base %p size "
              "%zu",
              static_cast<void*>(buffer->ptr), offset, buffer->size, attr.type,
              attr.device, attr.base, attr.size, type, device, base, size);
  }
}

void Program::KernelAddressFromHost(Input& in) {
  BufferRef buffer = PickAnyBuffer(in);
  void* view = reinterpret_cast<void*>(0x1);
  Expect("ph_kernel_address from host code",
         ph_kernel_address(buffer ? buffer->ptr : nullptr, &view),
         {PH_ERROR_INVALID_ARGUMENT});
  if (view != nullptr) Violation("ph_kernel_address left *out_ptr");
}

/* ---- Threads ------------------------------------------------------------ */

void Program::StartWorker(Input& in) {
  const size_t length = in.U8();
  Input program = in.Take(length);
  if (worker_) return;
  JoinWorker();
  worker_program_ = std::make_unique<Program>(/*worker=*/true);
  for (const auto& stream : streams_) {
    worker_program_->foreign_streams_.push_back(stream->handle);
  }
  for (const auto& event : events_) {
    worker_program_->foreign_events_.push_back(event->handle);
  }
  concurrent_ = true;
  Program* worker = worker_program_.get();
  worker_thread_ = std::thread([worker, program]() mutable {
    while (!program.done()) worker->Step(program);
  });
}

// Takes over what `other` created, so either thread's objects may be used
// and freed by the other from now on.
void Program::Adopt(Program& other) {
  for (auto& buffer : other.buffers_) buffers_.push_back(std::move(buffer));
  for (auto& stream : other.streams_) streams_.push_back(std::move(stream));
  for (auto& event : other.events_) events_.push_back(std::move(event));
  for (auto& probe : other.probes_) probes_.push_back(std::move(probe));
  dead_streams_.insert(dead_streams_.end(), other.dead_streams_.begin(),
                       other.dead_streams_.end());
  dead_events_.insert(dead_events_.end(), other.dead_events_.begin(),
                      other.dead_events_.end());
  // Pointers the worker freed may since have been reused by either
  // thread: keep only those that no live buffer covers.
  for (uint8_t* stale : other.freed_device_) {
    if (!InLive(buffers_, stale)) freed_device_.push_back(stale);
  }
  for (auto it = freed_device_.begin(); it != freed_device_.end();) {
    it = InLive(buffers_, *it) ? freed_device_.erase(it) : it + 1;
  }
  for (auto it = freed_pinned_.begin(); it != freed_pinned_.end();) {
    it = InLive(buffers_, *it) ? freed_pinned_.erase(it) : it + 1;
  }
}

void Program::JoinWorker() {
  if (!worker_thread_.joinable()) return;
  worker_thread_.join();
  Adopt(*worker_program_);
  worker_program_.reset();
  concurrent_ = false;
  for (int device = 0; device < kDevices; ++device) CheckMemory(device);
}

/* ---- The interpreter ---------------------------------------------------- */

void Program::Step(Input& in) {
  static const char* const kNames[32] = {
      "malloc", "malloc", "free", "host_malloc", "host_free", "pageable",
      "host_write", "memcpy", "memcpy_async", "memcpy_async", "memset_async",
      "check", "stream_create", "stream_destroy", "stream_query",
      "stream_sync", "stream_wait_event", "event_create", "event_destroy",
      "event_record", "event_query", "event_sync", "event_elapsed", "launch",
      "launch", "set_device", "device_sync", "mem_info", "attributes",
      "kernel_address_from_host", "start_worker", "join_worker"};
  const uint8_t op = in.U8() % 32;
  if (g_trace) std::fprintf(stderr, "%s%s\n", worker_ ? "  [worker] " : "", kNames[op]);
  switch (op) {
    case 0: case 1: Malloc(in); break;
    case 2: Free(in); break;
    case 3: HostMalloc(in); break;
    case 4: HostFree(in); break;
    case 5: PageableAlloc(in); break;
    case 6: HostWrite(in); break;
    case 7: Copy(in, /*async=*/false); break;
    case 8: case 9: Copy(in, /*async=*/true); break;
    case 10: Memset(in); break;
    case 11: CheckBuffer(in); break;
    case 12: StreamCreate(in); break;
    case 13: StreamDestroy(in); break;
    case 14: StreamQuery(in); break;
    case 15: StreamSync(in); break;
    case 16: StreamWaitEvent(in); break;
    case 17: EventCreate(in); break;
    case 18: EventDestroy(in); break;
    case 19: EventRecord(in); break;
    case 20: EventQuery(in); break;
    case 21: EventSync(in); break;
    case 22: EventElapsed(in); break;
    case 23: case 24: Launch(in); break;
    case 25: SetDevice(in); break;
    case 26: DeviceSync(in); break;
    case 27: MemInfo(in); break;
    case 28: Attributes(in); break;
    case 29: KernelAddressFromHost(in); break;
    case 30: StartWorker(in); break;
    default:
      if (!worker_) JoinWorker();
      break;
  }
}

void Program::Run(Input& in) {
  int device = -1;
  Expect("ph_get_device", ph_get_device(&device), {PH_SUCCESS});
  current_device_ = device;
  while (!in.done()) Step(in);
  JoinWorker();
}

void Program::Teardown() {
  // Every stream reports exactly its sticky error, then all its events are
  // reached; destroy succeeds.
  for (const auto& stream : std::vector<StreamRef>(streams_)) {
    SyncStream(stream);
  }
  for (const auto& buffer : std::vector<BufferRef>(buffers_)) {
    CheckBufferData(*buffer);
  }
  for (const auto& stream : streams_) {
    Expect("ph_stream_destroy", ph_stream_destroy(stream->handle),
           {PH_SUCCESS});
    dead_streams_.push_back(stream->handle);
  }
  streams_.clear();
  for (const auto& event : events_) {
    Expect("ph_event_destroy", ph_event_destroy(event->handle), {PH_SUCCESS});
  }
  events_.clear();
  for (const auto& buffer : std::vector<BufferRef>(buffers_)) {
    FreeBuffer(buffer);
  }
  for (ph_stream_t handle : dead_streams_) {
    Expect("ph_stream_query of a destroyed stream", ph_stream_query(handle),
           {PH_ERROR_INVALID_HANDLE});
  }
  for (int device = 0; device < kDevices; ++device) {
    Expect("ph_device_synchronize with no streams",
           ph_device_synchronize(device), {PH_SUCCESS});
    if (g_used[device].load() != 0) Violation("model bookkeeping is off");
    CheckMemory(device);
  }
  // Every task was released exactly once, after at most one run; a task
  // not queued behind a failing one ran.
  for (const auto& probe : probes_) {
    const int runs = probe->runs.load(), releases = probe->releases.load();
    if (releases != 1 || runs > 1 ||
        (probe->accepted && !probe->may_skip && runs != 1)) {
      Violation("host task: %d runs and %d releases (accepted %d, queued "
                "behind a failing task %d)",
                runs, releases, probe->accepted, probe->may_skip);
    }
  }
}

}  // namespace hal_fuzz

using hal_fuzz::Input;
using hal_fuzz::Program;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("PHANTOM_DEVICE_COUNT", "2", 1);
  setenv("PHANTOM_DEVICE_MEMORY", hal_fuzz::kCapacityText, 1);
  hal_fuzz::g_trace = std::getenv("PHANTOM_FUZZ_TRACE") != nullptr;
  int count = 0;
  if (ph_device_count(&count) != PH_SUCCESS || count != hal_fuzz::kDevices) {
    std::fprintf(stderr, "hal_fuzzer: the driver did not start with %d "
                 "devices: %s\n", hal_fuzz::kDevices, ph_last_error_message());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Program program(/*worker=*/false);
  program.Run(in);
  program.Teardown();
  return 0;
}
