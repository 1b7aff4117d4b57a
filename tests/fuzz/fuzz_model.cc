// The fuzzer's checks and model helpers (fuzz_model.h): Violation and
// Expect, the host task every launch uses, picking objects from the model
// (live, destroyed, null or made-up handles) and the stream ordering that
// says when a buffer's shadow may be compared.
#include "fuzz_model.h"

namespace hal_fuzz {

void Violation(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fprintf(stderr, "\nHAL FUZZER: invariant violated: ");
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  std::abort();
}

// Checks `got` is in `allowed`, and that an error carries a message.
void Expect(const char* call, ph_status_t got,
            std::initializer_list<ph_status_t> allowed) {
  for (ph_status_t status : allowed) {
    if (got != status) continue;
    if (got != PH_SUCCESS && got != PH_NOT_READY &&
        ph_last_error_message()[0] == '\0') {
      Violation("%s returned %s with an empty ph_last_error_message()", call,
                ph_status_name(got));
    }
    return;
  }
  std::string names;
  for (ph_status_t status : allowed) {
    names += std::string(names.empty() ? "" : ", ") + ph_status_name(status);
  }
  Violation("%s returned %s (%s); allowed here: %s", call, ph_status_name(got),
            ph_last_error_message(), names.c_str());
}

ph_status_t TaskRun(void* user_data, char* error, size_t error_size) {
  auto* probe = static_cast<TaskProbe*>(user_data);
  if (probe->releases.load() != 0) Violation("a host task ran after its release");
  if (probe->runs.fetch_add(1) != 0) Violation("a host task ran twice");
  // Waiting for itself is refused, never a deadlock. (A concurrent destroy
  // of the stream by the host may already have retired the handle.)
  Expect("ph_stream_synchronize from the stream's own work",
         ph_stream_synchronize(probe->own),
         {PH_ERROR_INVALID_ARGUMENT, PH_ERROR_INVALID_HANDLE});
  Expect("ph_stream_destroy from the stream's own work",
         ph_stream_destroy(probe->own),
         {PH_ERROR_INVALID_ARGUMENT, PH_ERROR_INVALID_HANDLE});
  Expect("ph_device_synchronize from work on that device",
         ph_device_synchronize(probe->device), {PH_ERROR_INVALID_ARGUMENT});
  if (probe->fill_size > 0 && probe->result == PH_SUCCESS) {
    void* view = nullptr;
    Expect("ph_kernel_address inside work",
           ph_kernel_address(probe->fill_ptr, &view), {PH_SUCCESS});
    if (view == nullptr) Violation("ph_kernel_address gave NULL");
    std::memset(view, probe->fill_byte, probe->fill_size);
  }
  if (probe->result != PH_SUCCESS) {
    std::snprintf(error, error_size, "the fuzzer's task failed on purpose");
  }
  return probe->result;
}

void TaskRelease(void* user_data) {
  static_cast<TaskProbe*>(user_data)->releases.fetch_add(1);
}

// The status a stream records for a failing task (device/fake/stream.cc:
// a task answering a non-error status is a device error).
ph_status_t AsStickyStatus(ph_status_t status) {
  switch (status) {
    case PH_ERROR_INVALID_ARGUMENT:
    case PH_ERROR_OUT_OF_MEMORY:
    case PH_ERROR_DEVICE:
    case PH_ERROR_UNIMPLEMENTED:
      return status;
    default:
      return PH_ERROR_DEVICE;
  }
}


std::atomic<size_t> g_used[kDevices];
bool g_trace = false;

// True if `address` lies in a live buffer of this program.
bool InLive(const std::vector<BufferRef>& buffers, const void* address) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(address);
  for (const auto& buffer : buffers) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(buffer->ptr);
    if (value >= start && value < start + (buffer->size ? buffer->size : 1)) {
      return true;
    }
  }
  return false;
}

/* ---- Picking ------------------------------------------------------------ */

BufferRef Program::PickBuffer(Input& in, BufferKind kind) {
  std::vector<BufferRef*> matching;
  for (auto& buffer : buffers_) {
    if (buffer->kind == kind) matching.push_back(&buffer);
  }
  const size_t pick = in.U16();  // read even when empty: stable encoding
  if (matching.empty()) return nullptr;
  return *matching[pick % matching.size()];
}

BufferRef Program::PickAnyBuffer(Input& in) {
  const size_t pick = in.U16();
  if (buffers_.empty()) return nullptr;
  return buffers_[pick % buffers_.size()];
}

StreamRef Program::PickStream(Input& in) {
  const size_t pick = in.U16();
  if (streams_.empty()) return nullptr;
  return streams_[pick % streams_.size()];
}

// A live stream most of the time; otherwise destroyed, made-up, null or an
// event's handle. *live is set only for a live stream of this program.
ph_stream_t Program::PickStreamHandle(Input& in, StreamRef* live) {
  *live = nullptr;
  const uint8_t mode = in.U8() % 10;
  if (mode == 1) return reinterpret_cast<ph_stream_t>(in.U64() | kMadeUpBit);
  const size_t pick = in.U16();
  switch (mode) {
    case 0:
      if (dead_streams_.empty()) return nullptr;
      return dead_streams_[pick % dead_streams_.size()];
    case 2:
      return nullptr;
    case 3:
      if (events_.empty()) return nullptr;
      return reinterpret_cast<ph_stream_t>(events_[pick % events_.size()]->handle);
    default:
      if (streams_.empty()) return nullptr;
      *live = streams_[pick % streams_.size()];
      return (*live)->handle;
  }
}

ph_event_t Program::PickEventHandle(Input& in, EventModel** live) {
  *live = nullptr;
  const uint8_t mode = in.U8() % 10;
  if (mode == 1) return reinterpret_cast<ph_event_t>(in.U64() | kMadeUpBit);
  const size_t pick = in.U16();
  switch (mode) {
    case 0:
      if (dead_events_.empty()) return nullptr;
      return dead_events_[pick % dead_events_.size()];
    case 2:
      return nullptr;
    case 3:
      if (streams_.empty()) return nullptr;
      return reinterpret_cast<ph_event_t>(streams_[pick % streams_.size()]->handle);
    default:
      if (events_.empty()) return nullptr;
      *live = events_[pick % events_.size()].get();
      return (*live)->handle;
  }
}

int Program::PickDevice(Input& in, bool* valid) {
  const uint8_t choice = in.U8();
  *valid = true;
  switch (choice % 8) {
    case 6: *valid = false; return -1 - (choice >> 3);
    case 7: *valid = false; return choice & 8 ? INT_MAX : kDevices;
    default: return choice % kDevices;
  }
}

/* ---- Ordering ----------------------------------------------------------- */

void Program::SyncStream(const StreamRef& stream) {
  const ph_status_t status = ph_stream_synchronize(stream->handle);
  Expect("ph_stream_synchronize", status, {stream->doom});
  StreamSynchronized(stream);
}

// After a synchronize of `stream` returned: its work has all finished.
void Program::StreamSynchronized(const StreamRef& stream) {
  for (auto& buffer : buffers_) {
    if (buffer->pending == stream) buffer->pending = nullptr;
  }
  for (auto& event : events_) {
    if (event->recorded_on != stream) continue;
    // hal.h: synchronize waits for all queued work, and the record is work
    // queued on the stream, so the event has been reached.
    const ph_status_t status = ph_event_query(event->handle);
    if (status != event->doom) {
      Violation("ph_event_query after ph_stream_synchronize of the stream "
                "that recorded the event returned %s, not %s",
                ph_status_name(status), ph_status_name(event->doom));
    }
    event->reached = true;
  }
}

void Program::Settle(Buffer& buffer, const StreamRef& on) {
  if (buffer.pending && buffer.pending != on) SyncStream(buffer.pending);
  buffer.pending = on;
}

}  // namespace hal_fuzz
