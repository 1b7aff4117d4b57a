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
// out-of-memory paths reachable.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "phantom/hal.h"

namespace {

constexpr int kDevices = 2;
constexpr size_t kCapacity = size_t{64} << 20;  // PHANTOM_DEVICE_MEMORY
constexpr const char* kCapacityText = "64MiB";
// The fake driver reserves device sizes rounded up to 512 bytes
// (device/fake/range_allocator.h). A vendor running this fuzzer against
// their driver changes this one constant.
constexpr size_t kGranule = 512;
constexpr size_t kWindow = 4096;  // bytes of each buffer copied and shadowed
constexpr size_t kMaxDeviceBuffers = 24;
constexpr size_t kMaxHostBuffers = 6;
constexpr size_t kMaxStreams = 6;
constexpr size_t kMaxEvents = 8;
constexpr uint64_t kMadeUpBit = uint64_t{1} << 63;

size_t Rounded(size_t size) {
  return (size + kGranule - 1) / kGranule * kGranule;
}

[[noreturn]] void Violation(const char* format, ...)
    __attribute__((format(printf, 1, 2)));
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

// The byte program. Reads past the end give zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return U16() | (static_cast<uint32_t>(U16()) << 16); }
  uint64_t U64() { return U32() | (static_cast<uint64_t>(U32()) << 32); }
  size_t Below(size_t n) { return n == 0 ? 0 : U16() % n; }
  // Splits off the next `n` bytes as a program of their own.
  Input Take(size_t n) {
    const size_t start = pos_ < size_ ? pos_ : size_;
    const size_t count = n < size_ - start ? n : size_ - start;
    pos_ = start + count;
    return Input(data_ + start, count);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/* ---- The model ---------------------------------------------------------- */

struct StreamModel {
  ph_stream_t handle = nullptr;
  int device = 0;
  // The status the stream becomes sticky with: that of the first failing
  // task queued on it, or of the failure carried by the first event it
  // waited on after one (PH_SUCCESS while neither was).
  ph_status_t doom = PH_SUCCESS;
  uint64_t records = 0;  // event records queued on it, for ordering
};
using StreamRef = std::shared_ptr<StreamModel>;

struct EventModel {
  ph_event_t handle = nullptr;
  unsigned flags = 0;
  StreamRef recorded_on;   // stream of the latest record, if any
  uint64_t record_seq = 0; // its position among that stream's records
  bool reached = false;    // latest record known to be reached
  // The failure the latest record carries: its stream's doom when recorded.
  ph_status_t doom = PH_SUCCESS;
};

enum class BufferKind { kDevice, kPinned, kPageable };

struct Buffer {
  BufferKind kind = BufferKind::kDevice;
  uint8_t* ptr = nullptr;  // device pointers are never dereferenced
  size_t size = 0;
  int device = -1;
  size_t window = 0;  // min(size, kWindow)
  std::vector<uint8_t> shadow, known;  // of the window
  StreamRef pending;  // stream with queued work touching the buffer
  std::unique_ptr<uint8_t[]> heap;  // pageable storage (exact size for ASan)
};
using BufferRef = std::shared_ptr<Buffer>;

// What a host task saw. Owned by the model until the end of the input.
struct TaskProbe {
  std::atomic<int> runs{0};
  std::atomic<int> releases{0};
  ph_status_t result = PH_SUCCESS;  // what run returns
  ph_stream_t own = nullptr;        // the stream it was queued on
  int device = 0;
  uint8_t* fill_ptr = nullptr;  // device memory written through the kernel
  size_t fill_size = 0;         // view when non-zero
  uint8_t fill_byte = 0;
  bool may_skip = false;  // queued behind a failing task
  bool accepted = false;  // ph_launch_host_func returned PH_SUCCESS
};

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

// Device memory the whole process has live, by device; updated by both
// threads, compared with ph_mem_get_info only when one thread runs.
std::atomic<size_t> g_used[kDevices];

class Program {
 public:
  // `concurrent`: another thread may be calling the HAL at the same time.
  explicit Program(bool worker) : worker_(worker), concurrent_(worker) {}

  void Run(Input& in);       // the main program (may start a worker)
  void Teardown();           // destroy and free everything, then check

 private:
  void Step(Input& in);

  // Objects
  BufferRef PickBuffer(Input& in, BufferKind kind);
  BufferRef PickAnyBuffer(Input& in);
  StreamRef PickStream(Input& in);
  ph_stream_t PickStreamHandle(Input& in, StreamRef* live);
  ph_event_t PickEventHandle(Input& in, EventModel** live);
  int PickDevice(Input& in, bool* valid);

  // Ordering: before queued or immediate work touches `buffer` (on `on`,
  // or synchronously when `on` is null), wait for other streams' work.
  void Settle(Buffer& buffer, const StreamRef& on);
  void SyncStream(const StreamRef& stream);
  void StreamSynchronized(const StreamRef& stream);

  // Ops
  void Malloc(Input& in);
  void Free(Input& in);
  void HostMalloc(Input& in);
  void HostFree(Input& in);
  void PageableAlloc(Input& in);
  void HostWrite(Input& in);
  void Copy(Input& in, bool async);
  void Memset(Input& in);
  void CheckBuffer(Input& in);
  void StreamCreate(Input& in);
  void StreamDestroy(Input& in);
  void StreamQuery(Input& in);
  void StreamSync(Input& in);
  void StreamWaitEvent(Input& in);
  void EventCreate(Input& in);
  void EventDestroy(Input& in);
  void EventRecord(Input& in);
  void EventQuery(Input& in);
  void EventSync(Input& in);
  void EventElapsed(Input& in);
  void Launch(Input& in);
  void RunNow(const StreamRef& stream, ph_stream_t handle,
              const ph_host_task_t& task, std::unique_ptr<TaskProbe> probe,
              const BufferRef& target);
  void SetDevice(Input& in);
  void DeviceSync(Input& in);
  void MemInfo(Input& in);
  void Attributes(Input& in);
  void KernelAddressFromHost(Input& in);
  void StartWorker(Input& in);
  void JoinWorker();

  void CheckMemory(int device);
  void ForgetBuffer(const BufferRef& buffer);
  void FreeBuffer(const BufferRef& buffer);
  void CheckBufferData(Buffer& buffer);
  void Adopt(Program& other);

  const bool worker_;
  bool concurrent_;
  std::vector<BufferRef> buffers_;
  std::vector<uint8_t*> freed_device_;  // stale device pointers
  std::vector<uint8_t*> freed_pinned_;
  std::vector<StreamRef> streams_;
  std::vector<ph_stream_t> dead_streams_;
  std::vector<std::unique_ptr<EventModel>> events_;
  std::vector<ph_event_t> dead_events_;
  std::vector<std::unique_ptr<TaskProbe>> probes_;
  // The main program's handles, for a worker's read-only calls.
  std::vector<ph_stream_t> foreign_streams_;
  std::vector<ph_event_t> foreign_events_;
  int current_device_ = -1;
  std::unique_ptr<Program> worker_program_;
  std::thread worker_thread_;
};

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

/* ---- Memory ------------------------------------------------------------- */

void Program::CheckMemory(int device) {
  size_t free_bytes = 0, total = 0;
  Expect("ph_mem_get_info", ph_mem_get_info(device, &free_bytes, &total),
         {PH_SUCCESS});
  if (total != kCapacity) {
    Violation("ph_mem_get_info(%d): total %zu, expected the capacity %zu",
              device, total, kCapacity);
  }
  if (free_bytes > total) {
    Violation("ph_mem_get_info(%d): free %zu exceeds total %zu", device,
              free_bytes, total);
  }
  if (concurrent_) return;
  const size_t expected = kCapacity - g_used[device].load();
  if (free_bytes != expected) {
    Violation("ph_mem_get_info(%d): free %zu, but the live allocations "
              "leave %zu",
              device, free_bytes, expected);
  }
}

void Program::Malloc(Input& in) {
  bool valid = true;
  const int device = PickDevice(in, &valid);
  const uint8_t mode = in.U8();
  size_t size = 0;
  const size_t used = valid ? g_used[device].load() : 0;
  switch (mode % 10) {
    case 0: size = 0; break;
    case 1: size = 1 + mode / 16; break;
    case 2: case 3: size = 1 + in.U16() % (2 * kWindow); break;
    case 4: size = 1 + in.U32() % (size_t{1} << 20); break;
    case 5: size = 1 + in.U32() % kCapacity; break;
    case 6: size = kCapacity - (mode & 0x10 ? 0 : mode >> 5); break;
    case 7: size = kCapacity - used + (mode >> 5); break;  // all that is free
    case 8: size = SIZE_MAX - in.U8(); break;
    default: size = kCapacity + 1 + in.U32(); break;
  }
  if (buffers_.size() >= kMaxDeviceBuffers && size != 0) size = SIZE_MAX;
  void* ptr = reinterpret_cast<void*>(0x1);
  const ph_status_t status = ph_malloc(device, size, &ptr);
  if (!valid) {
    Expect("ph_malloc on a bad device", status, {PH_ERROR_INVALID_DEVICE});
  } else if (size == 0) {
    Expect("ph_malloc(0)", status, {PH_SUCCESS});
  } else if (size > kCapacity ||
             (!concurrent_ && Rounded(size) > kCapacity - used)) {
    Expect("ph_malloc of more than is free", status, {PH_ERROR_OUT_OF_MEMORY});
  } else {
    // A fragmented address range may refuse a request that fits in the
    // free byte count; hal.h allows that.
    Expect("ph_malloc", status, {PH_SUCCESS, PH_ERROR_OUT_OF_MEMORY});
  }
  if (status != PH_SUCCESS || size == 0) {
    if (ptr != nullptr) Violation("ph_malloc left *out_ptr non-NULL (%s)",
                                  ph_status_name(status));
    return;
  }
  if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 256 != 0) {
    Violation("ph_malloc(%zu) gave %p: NULL or not 256-byte aligned", size,
              ptr);
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& other : buffers_) {
    if (other->kind != BufferKind::kDevice) continue;
    const uintptr_t other_start = reinterpret_cast<uintptr_t>(other->ptr);
    if (start < other_start + other->size && other_start < start + size) {
      Violation("ph_malloc(%zu) gave %p, overlapping the live allocation "
                "%p of %zu bytes",
                size, ptr, other->ptr, other->size);
    }
  }
  g_used[device] += Rounded(size);
  auto buffer = std::make_shared<Buffer>();
  buffer->kind = BufferKind::kDevice;
  buffer->ptr = static_cast<uint8_t*>(ptr);
  buffer->size = size;
  buffer->device = device;
  buffer->window = size < kWindow ? size : kWindow;
  buffer->shadow.assign(buffer->window, 0);
  buffer->known.assign(buffer->window, 0);  // contents unspecified
  buffers_.push_back(buffer);
  // Remove the new pointer from the stale list if the address was reused.
  for (auto it = freed_device_.begin(); it != freed_device_.end();) {
    const uintptr_t stale = reinterpret_cast<uintptr_t>(*it);
    it = stale >= start && stale < start + size ? freed_device_.erase(it)
                                                : it + 1;
  }
  CheckMemory(device);
}

void Program::ForgetBuffer(const BufferRef& buffer) {
  for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
    if (*it == buffer) {
      buffers_.erase(it);
      return;
    }
  }
}

// Frees a live buffer of any kind, after the work using it has finished.
void Program::FreeBuffer(const BufferRef& buffer) {
  if (buffer->pending) SyncStream(buffer->pending);
  switch (buffer->kind) {
    case BufferKind::kDevice:
      Expect("ph_free", ph_free(buffer->ptr), {PH_SUCCESS});
      g_used[buffer->device] -= Rounded(buffer->size);
      freed_device_.push_back(buffer->ptr);
      if (freed_device_.size() > 16) freed_device_.erase(freed_device_.begin());
      CheckMemory(buffer->device);
      break;
    case BufferKind::kPinned:
      Expect("ph_host_free", ph_host_free(buffer->ptr), {PH_SUCCESS});
      freed_pinned_.push_back(buffer->ptr);
      if (freed_pinned_.size() > 16) freed_pinned_.erase(freed_pinned_.begin());
      break;
    case BufferKind::kPageable:
      buffer->heap.reset();
      break;
  }
  ForgetBuffer(buffer);
}

// True if `address` lies in a live buffer of this program.
static bool InLive(const std::vector<BufferRef>& buffers, const void* address) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(address);
  for (const auto& buffer : buffers) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(buffer->ptr);
    if (value >= start && value < start + (buffer->size ? buffer->size : 1)) {
      return true;
    }
  }
  return false;
}

void Program::Free(Input& in) {
  const uint8_t mode = in.U8() % 6;
  // Frees that do not name a live allocation of ours run only while no
  // other thread could own the address.
  if (mode >= 2 && concurrent_) return;
  switch (mode) {
    case 0: case 1: {
      BufferRef buffer = PickBuffer(in, BufferKind::kDevice);
      if (buffer) FreeBuffer(buffer);
      return;
    }
    case 2:
      Expect("ph_free(NULL)", ph_free(nullptr), {PH_SUCCESS});
      return;
    case 3: {  // freed before
      if (freed_device_.empty()) return;
      uint8_t* stale = freed_device_[in.Below(freed_device_.size())];
      if (InLive(buffers_, stale)) return;
      Expect("ph_free of a freed pointer", ph_free(stale),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    case 4: {  // inside a live allocation
      BufferRef buffer = PickBuffer(in, BufferKind::kDevice);
      if (!buffer || buffer->size < 2) return;
      uint8_t* inside = buffer->ptr + 1 + in.Below(buffer->size - 1);
      Expect("ph_free of an interior pointer", ph_free(inside),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    default: {  // made up, or host memory
      void* address = reinterpret_cast<void*>(in.U64());
      if (in.U8() & 1) {
        BufferRef host = PickAnyBuffer(in);
        if (!host || host->kind == BufferKind::kDevice) return;
        address = host->ptr;
      } else if (address == nullptr || InLive(buffers_, address)) {
        return;
      }
      Expect("ph_free of a made-up or host pointer", ph_free(address),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
  }
}

void Program::HostMalloc(Input& in) {
  const uint8_t mode = in.U8();
  size_t size = 0;
  switch (mode % 6) {
    case 0: size = 0; break;
    case 1: size = SIZE_MAX - mode; break;
    default: size = 1 + in.U16() % (2 * kWindow); break;
  }
  size_t host_count = 0;
  for (const auto& buffer : buffers_) {
    host_count += buffer->kind != BufferKind::kDevice;
  }
  if (host_count >= kMaxHostBuffers && size != 0) size = SIZE_MAX;
  void* ptr = reinterpret_cast<void*>(0x1);
  const ph_status_t status = ph_host_malloc(size, &ptr);
  if (size == 0) {
    Expect("ph_host_malloc(0)", status, {PH_SUCCESS});
  } else if (size > SIZE_MAX / 2) {
    Expect("ph_host_malloc of an impossible size", status,
           {PH_ERROR_OUT_OF_MEMORY});
  } else {
    Expect("ph_host_malloc", status, {PH_SUCCESS, PH_ERROR_OUT_OF_MEMORY});
  }
  if (status != PH_SUCCESS || size == 0) {
    if (ptr != nullptr) Violation("ph_host_malloc left *out_ptr non-NULL");
    return;
  }
  if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 4096 != 0) {
    Violation("ph_host_malloc(%zu) gave %p: NULL or not page-aligned", size,
              ptr);
  }
  auto buffer = std::make_shared<Buffer>();
  buffer->kind = BufferKind::kPinned;
  buffer->ptr = static_cast<uint8_t*>(ptr);
  buffer->size = size;
  buffer->window = size < kWindow ? size : kWindow;
  // Pinned memory is ours to write: give it known contents.
  std::memset(ptr, mode, size);
  buffer->shadow.assign(buffer->window, mode);
  buffer->known.assign(buffer->window, 1);
  buffers_.push_back(buffer);
  for (auto it = freed_pinned_.begin(); it != freed_pinned_.end();) {
    it = *it == ptr ? freed_pinned_.erase(it) : it + 1;
  }
}

void Program::HostFree(Input& in) {
  const uint8_t mode = in.U8() % 5;
  if (mode >= 2 && concurrent_) return;
  switch (mode) {
    case 0: case 1: {
      BufferRef buffer = PickBuffer(in, BufferKind::kPinned);
      if (buffer) FreeBuffer(buffer);
      return;
    }
    case 2:
      Expect("ph_host_free(NULL)", ph_host_free(nullptr), {PH_SUCCESS});
      return;
    case 3: {
      if (freed_pinned_.empty()) return;
      uint8_t* stale = freed_pinned_[in.Below(freed_pinned_.size())];
      if (InLive(buffers_, stale)) return;
      Expect("ph_host_free of a freed block", ph_host_free(stale),
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    default: {  // device, pageable or interior pointer
      BufferRef buffer = PickAnyBuffer(in);
      if (!buffer) return;
      uint8_t* address = buffer->ptr;
      if (buffer->kind == BufferKind::kPinned) {
        if (buffer->size < 2) return;
        address += 1 + in.Below(buffer->size - 1);
      }
      Expect("ph_host_free of memory that is no pinned block",
             ph_host_free(address), {PH_ERROR_INVALID_HANDLE});
      return;
    }
  }
}

void Program::PageableAlloc(Input& in) {
  const uint8_t mode = in.U8();
  if (mode & 1) {
    BufferRef buffer = PickBuffer(in, BufferKind::kPageable);
    if (buffer) FreeBuffer(buffer);
    return;
  }
  size_t host_count = 0;
  for (const auto& buffer : buffers_) {
    host_count += buffer->kind != BufferKind::kDevice;
  }
  if (host_count >= kMaxHostBuffers) return;
  const size_t size = 1 + in.U16() % (2 * kWindow);
  auto buffer = std::make_shared<Buffer>();
  buffer->kind = BufferKind::kPageable;
  buffer->heap.reset(new uint8_t[size]);
  buffer->ptr = buffer->heap.get();
  buffer->size = size;
  buffer->window = size < kWindow ? size : kWindow;
  std::memset(buffer->ptr, mode, size);
  buffer->shadow.assign(buffer->window, mode);
  buffer->known.assign(buffer->window, 1);
  buffers_.push_back(buffer);
}

void Program::HostWrite(Input& in) {
  BufferRef buffer = PickAnyBuffer(in);
  if (!buffer || buffer->kind == BufferKind::kDevice) return;
  Settle(*buffer, nullptr);
  const size_t offset = in.Below(buffer->window);
  const size_t length = in.Below(buffer->window - offset + 1);
  const uint8_t seed = in.U8();
  for (size_t i = 0; i < length; ++i) {
    const uint8_t value = static_cast<uint8_t>(seed + i * 7);
    buffer->ptr[offset + i] = value;
    buffer->shadow[offset + i] = value;
    buffer->known[offset + i] = 1;
  }
}

void Program::CheckBufferData(Buffer& buffer) {
  Settle(buffer, nullptr);
  std::vector<uint8_t> actual(buffer.window);
  if (buffer.kind == BufferKind::kDevice) {
    if (buffer.window == 0) return;
    Expect("ph_memcpy device to host (read-back)",
           ph_memcpy(actual.data(), buffer.ptr, buffer.window,
                     PH_MEMCPY_DEVICE_TO_HOST),
           {PH_SUCCESS});
  } else {
    std::memcpy(actual.data(), buffer.ptr, buffer.window);
  }
  for (size_t i = 0; i < buffer.window; ++i) {
    if (buffer.known[i] && actual[i] != buffer.shadow[i]) {
      Violation("byte %zu of %s buffer %p (%zu bytes) reads 0x%02x, but "
                "0x%02x was written",
                i,
                buffer.kind == BufferKind::kDevice   ? "device"
                : buffer.kind == BufferKind::kPinned ? "pinned"
                                                     : "pageable",
                static_cast<void*>(buffer.ptr), buffer.size, actual[i],
                buffer.shadow[i]);
    }
  }
}

void Program::CheckBuffer(Input& in) {
  BufferRef buffer = PickAnyBuffer(in);
  if (buffer) CheckBufferData(*buffer);
}

static bool IsDeviceKind(BufferKind kind) { return kind == BufferKind::kDevice; }

// Copies (and fills) only ever touch the window of a buffer, except for the
// deliberately out-of-range requests against device and pinned buffers,
// which the driver must refuse before touching anything.
void Program::Copy(Input& in, bool async) {
  BufferRef dst = PickAnyBuffer(in);
  BufferRef src = PickAnyBuffer(in);
  StreamRef stream;
  ph_stream_t handle = nullptr;
  if (async) {
    handle = PickStreamHandle(in, &stream);
  }
  const uint8_t mode = in.U8();
  if (!dst || !src) return;
  const bool dst_device = IsDeviceKind(dst->kind);
  const bool src_device = IsDeviceKind(src->kind);
  ph_memcpy_kind_t kind = src_device ? (dst_device ? PH_MEMCPY_DEVICE_TO_DEVICE
                                  : PH_MEMCPY_DEVICE_TO_HOST)
                    : (dst_device ? PH_MEMCPY_HOST_TO_DEVICE
                                  : PH_MEMCPY_HOST_TO_HOST);
  size_t dst_offset = in.Below(dst->window + 1);
  size_t src_offset = in.Below(src->window + 1);
  const size_t room = std::min(dst->window - dst_offset, src->window - src_offset);
  size_t length = in.Below(room + 1);
  bool refused = false;  // the driver must answer INVALID_ARGUMENT
  uint8_t* dst_ptr = dst->ptr + dst_offset;
  const uint8_t* src_ptr = src->ptr + src_offset;
  switch (mode % 12) {
    case 0:  // wrong kind
      if (length == 0) break;
      kind = static_cast<ph_memcpy_kind_t>((kind + 1 + mode / 16 % 3) % 4);
      refused = true;
      break;
    case 1:  // no such kind
      // (Values outside 0..PH_MEMCPY_KIND_MAX_ENUM are not values of the
      // enum at all; a C caller passing one would be undefined behaviour.)
      kind = mode & 0x20 ? PH_MEMCPY_KIND_MAX_ENUM
                         : static_cast<ph_memcpy_kind_t>(4 + mode / 64);
      refused = length > 0;
      break;
    case 2: {  // past the end of a device or pinned destination
      if (dst->kind == BufferKind::kPageable) break;
      dst_offset = dst->size - 1 - in.Below(dst->size < 64 ? dst->size : 64);
      dst_ptr = dst->ptr + dst_offset;
      length = dst->size - dst_offset + 1 + in.Below(64);
      if (length > src->window - src_offset) {
        // The source would be read past its window: use a device or pinned
        // source only (the driver checks those first or refuses anyway).
        if (src->kind == BufferKind::kPageable) return;
      }
      refused = true;
      break;
    }
    case 3:  // null pointer
      if (length == 0) break;
      if (mode & 0x10) dst_ptr = nullptr; else src_ptr = nullptr;
      refused = true;
      break;
    case 4: {  // a freed device pointer
      if (concurrent_ || freed_device_.empty() || length == 0) break;
      uint8_t* stale = freed_device_[in.Below(freed_device_.size())];
      if (InLive(buffers_, stale)) break;
      if (dst_device) dst_ptr = stale; else if (src_device) src_ptr = stale;
      else break;
      refused = true;
      break;
    }
    default:
      break;
  }
  // Overlapping copies within one buffer are not promised by hal.h.
  if (!refused && dst == src && length > 0 &&
      dst_offset < src_offset + length && src_offset < dst_offset + length) {
    return;
  }
  if (async && stream && !refused) {
    // Ordering for the valid copy; refused ones touch nothing.
    Settle(*src, stream);
    Settle(*dst, stream);
  } else if (!async && !refused) {
    Settle(*src, nullptr);
    Settle(*dst, nullptr);
  }
  const bool pageable = src->kind == BufferKind::kPageable ||
                        dst->kind == BufferKind::kPageable;
  ph_status_t status;
  if (!async) {
    status = ph_memcpy(dst_ptr, src_ptr, length, kind);
    Expect("ph_memcpy", status,
           {refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS});
  } else {
    status = ph_memcpy_async(dst_ptr, src_ptr, length, kind, handle);
    if (!stream) {
      Expect("ph_memcpy_async on a bad stream handle", status,
             {PH_ERROR_INVALID_HANDLE});
      return;
    }
    if (stream->doom != PH_SUCCESS) {
      // Refused because the stream already failed, or for the argument.
      Expect("ph_memcpy_async on a failing stream", status,
             {stream->doom, refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS});
    } else {
      Expect("ph_memcpy_async", status,
             {refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS});
    }
  }
  if (status != PH_SUCCESS || refused || length == 0) return;
  // A queued copy behind a failing task may be skipped, unless it was a
  // pageable copy, which returns only after it ran.
  const bool maybe_skipped =
      async && stream->doom != PH_SUCCESS && !pageable;
  for (size_t i = 0; i < length; ++i) {
    dst->shadow[dst_offset + i] = src->shadow[src_offset + i];
    dst->known[dst_offset + i] =
        maybe_skipped ? 0 : src->known[src_offset + i];
  }
}

void Program::Memset(Input& in) {
  BufferRef dst = PickAnyBuffer(in);
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const uint8_t mode = in.U8();
  const int value = static_cast<int>(in.U32());
  if (!dst) return;
  size_t offset = in.Below(dst->window + 1);
  size_t length = in.Below(dst->window - offset + 1);
  uint8_t* ptr = dst->ptr + offset;
  bool refused = dst->kind != BufferKind::kDevice && length > 0;
  if (mode % 4 == 0 && dst->kind == BufferKind::kDevice) {  // past the end
    offset = dst->size - 1 - in.Below(dst->size < 64 ? dst->size : 64);
    ptr = dst->ptr + offset;
    length = dst->size - offset + 1 + in.Below(64);
    refused = true;
  } else if (mode % 4 == 1 && length > 0) {
    ptr = nullptr;
    refused = true;
  }
  if (stream && !refused) Settle(*dst, stream);
  const ph_status_t status = ph_memset_async(ptr, value, length, handle);
  const ph_status_t expected =
      refused ? PH_ERROR_INVALID_ARGUMENT : PH_SUCCESS;
  if (!stream) {
    Expect("ph_memset_async on a bad stream handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_memset_async", status, {expected, stream->doom});
  if (status != PH_SUCCESS || refused) return;
  for (size_t i = 0; i < length; ++i) {
    dst->shadow[offset + i] = static_cast<uint8_t>(value & 0xff);
    dst->known[offset + i] = stream->doom == PH_SUCCESS;
  }
}

/* ---- Streams and events ------------------------------------------------- */

void Program::StreamCreate(Input& in) {
  bool valid = true;
  const int device = PickDevice(in, &valid);
  const int priority = static_cast<int>(in.U32());
  if (streams_.size() >= kMaxStreams) return;
  ph_stream_t handle = reinterpret_cast<ph_stream_t>(0x1);
  const ph_status_t status = ph_stream_create(device, priority, &handle);
  if (!valid) {
    Expect("ph_stream_create on a bad device", status,
           {PH_ERROR_INVALID_DEVICE});
    if (handle != nullptr) Violation("ph_stream_create left a handle");
    return;
  }
  Expect("ph_stream_create", status, {PH_SUCCESS});
  int got_device = -1, got_priority = 99;
  Expect("ph_stream_get_device", ph_stream_get_device(handle, &got_device),
         {PH_SUCCESS});
  Expect("ph_stream_get_priority",
         ph_stream_get_priority(handle, &got_priority), {PH_SUCCESS});
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  Expect("ph_device_get_properties", ph_device_get_properties(device, &props),
         {PH_SUCCESS});
  const int high = props.stream_priority_high, low = props.stream_priority_low;
  const int clamped = priority < high ? high : priority > low ? low : priority;
  if (got_device != device || got_priority != clamped) {
    Violation("stream created on device %d with priority %d reports device "
              "%d, priority %d (expected %d)",
              device, priority, got_device, got_priority, clamped);
  }
  auto stream = std::make_shared<StreamModel>();
  stream->handle = handle;
  stream->device = device;
  streams_.push_back(stream);
}

void Program::StreamDestroy(Input& in) {
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const ph_status_t status = ph_stream_destroy(handle);
  if (!stream) {
    Expect("ph_stream_destroy of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_stream_destroy", status, {PH_SUCCESS});
  // Destroy waited for the queued work.
  for (auto& buffer : buffers_) {
    if (buffer->pending == stream) buffer->pending = nullptr;
  }
  for (auto it = streams_.begin(); it != streams_.end(); ++it) {
    if (*it == stream) {
      streams_.erase(it);
      break;
    }
  }
  dead_streams_.push_back(handle);
  Expect("ph_stream_query of a destroyed stream", ph_stream_query(handle),
         {PH_ERROR_INVALID_HANDLE});
}

void Program::StreamQuery(Input& in) {
  if (worker_ && in.U8() % 4 == 0 && !foreign_streams_.empty()) {
    // Another thread's stream, which it may destroy at any time.
    const ph_status_t status = ph_stream_query(
        foreign_streams_[in.Below(foreign_streams_.size())]);
    Expect("ph_stream_query of the other thread's stream", status,
           {PH_SUCCESS, PH_NOT_READY, PH_ERROR_INVALID_HANDLE,
            PH_ERROR_INVALID_ARGUMENT, PH_ERROR_OUT_OF_MEMORY,
            PH_ERROR_DEVICE, PH_ERROR_UNIMPLEMENTED});
    return;
  }
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const ph_status_t status = ph_stream_query(handle);
  if (!stream) {
    Expect("ph_stream_query of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  if (stream->doom == PH_SUCCESS) {
    Expect("ph_stream_query", status, {PH_SUCCESS, PH_NOT_READY});
  } else {
    Expect("ph_stream_query of a failing stream", status,
           {PH_NOT_READY, stream->doom});
  }
  int device = -1;
  Expect("ph_stream_get_device", ph_stream_get_device(handle, &device),
         {PH_SUCCESS});
  if (device != stream->device) Violation("ph_stream_get_device changed");
}

void Program::StreamSync(Input& in) {
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  if (!stream) {
    Expect("ph_stream_synchronize of a bad handle",
           ph_stream_synchronize(handle), {PH_ERROR_INVALID_HANDLE});
    int device = 7;
    Expect("ph_stream_get_device of a bad handle",
           ph_stream_get_device(handle, &device), {PH_ERROR_INVALID_HANDLE});
    if (device != 0) Violation("ph_stream_get_device did not clear *out");
    return;
  }
  SyncStream(stream);
}

void Program::StreamWaitEvent(Input& in) {
  StreamRef stream;
  const ph_stream_t stream_handle = PickStreamHandle(in, &stream);
  EventModel* event = nullptr;
  ph_event_t event_handle = PickEventHandle(in, &event);
  if (worker_ && in.U8() % 3 == 0 && !foreign_events_.empty()) {
    // The other thread's event may carry a failure this model cannot know,
    // so the wait goes on a scratch stream, destroyed (with whatever it
    // inherited) once the wait has completed.
    ph_stream_t scratch = nullptr;
    Expect("ph_stream_create", ph_stream_create(0, 0, &scratch), {PH_SUCCESS});
    Expect("ph_stream_wait_event on the other thread's event",
           ph_stream_wait_event(
               scratch, foreign_events_[in.Below(foreign_events_.size())]),
           {PH_SUCCESS, PH_ERROR_INVALID_HANDLE});
    Expect("ph_stream_destroy", ph_stream_destroy(scratch), {PH_SUCCESS});
    return;
  }
  const ph_status_t status = ph_stream_wait_event(stream_handle, event_handle);
  if (!stream || !event) {
    Expect("ph_stream_wait_event with a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_stream_wait_event", status, {PH_SUCCESS});
  // hal.h: the work queued after the wait fails with what the record
  // carries.
  if (event->recorded_on && stream->doom == PH_SUCCESS) {
    stream->doom = event->doom;
  }
}

void Program::EventCreate(Input& in) {
  const uint8_t mode = in.U8();
  unsigned flags = mode % 3 == 0 ? PH_EVENT_DISABLE_TIMING : PH_EVENT_DEFAULT;
  const bool bad = mode % 7 == 6;
  if (bad) flags = 2u << (mode % 30);
  if (events_.size() >= kMaxEvents && !bad) return;
  ph_event_t handle = reinterpret_cast<ph_event_t>(0x1);
  const ph_status_t status = ph_event_create(flags, &handle);
  if (bad) {
    Expect("ph_event_create with unknown flags", status,
           {PH_ERROR_INVALID_ARGUMENT});
    if (handle != nullptr) Violation("ph_event_create left a handle");
    return;
  }
  Expect("ph_event_create", status, {PH_SUCCESS});
  auto event = std::make_unique<EventModel>();
  event->handle = handle;
  event->flags = flags;
  event->reached = true;  // never recorded: queries say reached
  events_.push_back(std::move(event));
}

void Program::EventDestroy(Input& in) {
  EventModel* event = nullptr;
  const ph_event_t handle = PickEventHandle(in, &event);
  const ph_status_t status = ph_event_destroy(handle);
  if (!event) {
    Expect("ph_event_destroy of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_event_destroy", status, {PH_SUCCESS});
  dead_events_.push_back(handle);
  for (auto it = events_.begin(); it != events_.end(); ++it) {
    if (it->get() == event) {
      events_.erase(it);
      break;
    }
  }
}

void Program::EventRecord(Input& in) {
  EventModel* event = nullptr;
  const ph_event_t event_handle = PickEventHandle(in, &event);
  StreamRef stream;
  const ph_stream_t stream_handle = PickStreamHandle(in, &stream);
  const ph_status_t status = ph_event_record(event_handle, stream_handle);
  if (!event || !stream) {
    Expect("ph_event_record with a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_event_record", status, {PH_SUCCESS});
  event->recorded_on = stream;
  event->record_seq = ++stream->records;
  event->reached = false;
  event->doom = stream->doom;
}

void Program::EventQuery(Input& in) {
  if (worker_ && in.U8() % 4 == 0 && !foreign_events_.empty()) {
    Expect("ph_event_query of the other thread's event",
           ph_event_query(foreign_events_[in.Below(foreign_events_.size())]),
           {PH_SUCCESS, PH_NOT_READY, PH_ERROR_INVALID_HANDLE,
            PH_ERROR_INVALID_ARGUMENT, PH_ERROR_OUT_OF_MEMORY,
            PH_ERROR_DEVICE, PH_ERROR_UNIMPLEMENTED});
    return;
  }
  EventModel* event = nullptr;
  const ph_event_t handle = PickEventHandle(in, &event);
  const ph_status_t status = ph_event_query(handle);
  if (!event) {
    Expect("ph_event_query of a bad handle", status, {PH_ERROR_INVALID_HANDLE});
  } else if (event->reached) {
    Expect("ph_event_query of a reached event", status, {event->doom});
  } else {
    Expect("ph_event_query", status, {event->doom, PH_NOT_READY});
    if (status == event->doom) event->reached = true;
  }
}

void Program::EventSync(Input& in) {
  EventModel* event = nullptr;
  const ph_event_t handle = PickEventHandle(in, &event);
  const ph_status_t status = ph_event_synchronize(handle);
  if (!event) {
    Expect("ph_event_synchronize of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  // Exactly the failure before the record, not one queued after it.
  Expect("ph_event_synchronize", status, {event->doom});
  event->reached = true;
  Expect("ph_event_query after ph_event_synchronize",
         ph_event_query(handle), {event->doom});
}

void Program::EventElapsed(Input& in) {
  EventModel* start = nullptr;
  EventModel* end = nullptr;
  const ph_event_t start_handle = PickEventHandle(in, &start);
  const ph_event_t end_handle = PickEventHandle(in, &end);
  float ms = -12345.0f;
  const ph_status_t status =
      ph_event_elapsed_time(start_handle, end_handle, &ms);
  if (!start || !end) {
    Expect("ph_event_elapsed_time with a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
  } else if (((start->flags | end->flags) & PH_EVENT_DISABLE_TIMING) != 0 ||
             !start->recorded_on || !end->recorded_on) {
    Expect("ph_event_elapsed_time without timing or records", status,
           {PH_ERROR_INVALID_ARGUMENT});
  } else if (start->reached && end->reached) {
    Expect("ph_event_elapsed_time of reached events", status, {PH_SUCCESS});
  } else {
    Expect("ph_event_elapsed_time", status, {PH_SUCCESS, PH_NOT_READY});
  }
  if (status != PH_SUCCESS) {
    if (ms != 0.0f) Violation("ph_event_elapsed_time did not clear *out_ms");
    return;
  }
  if (start->recorded_on == end->recorded_on &&
      start->record_seq <= end->record_seq && ms < 0.0f) {
    Violation("ph_event_elapsed_time of two records in stream order gave "
              "%f ms",
              ms);
  }
}

void Program::Launch(Input& in) {
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const uint8_t mode = in.U8();
  auto probe = std::make_unique<TaskProbe>();
  probe->own = handle;
  probe->device = stream ? stream->device : 0;
  static const ph_status_t kFailures[] = {
      PH_ERROR_DEVICE, PH_ERROR_INVALID_ARGUMENT, PH_ERROR_OUT_OF_MEMORY,
      PH_ERROR_UNIMPLEMENTED, PH_NOT_READY, static_cast<ph_status_t>(42)};
  if (mode % 8 == 0) probe->result = kFailures[(mode >> 3) % 6];
  BufferRef target;
  if (mode % 8 >= 4 && stream) {
    // Write a device buffer through the kernel view.
    target = PickBuffer(in, BufferKind::kDevice);
    if (target && target->window > 0) {
      const size_t offset = in.Below(target->window);
      probe->fill_ptr = target->ptr + offset;
      probe->fill_size = 1 + in.Below(target->window - offset);
      probe->fill_byte = in.U8();
      Settle(*target, stream);
    } else {
      target = nullptr;
    }
  }
  const bool null_run = mode == 0xff;
  ph_host_task_t task{"fuzz task", null_run ? nullptr : TaskRun, TaskRelease,
                      probe.get()};
  if (mode & 0x40) task.name = nullptr;
  probe->may_skip = stream && stream->doom != PH_SUCCESS;
  // Some tasks are run and waited for (ph_run_host_func) instead of queued.
  if ((mode & 0x20) && !null_run && stream) {
    RunNow(stream, handle, task, std::move(probe), target);
    return;
  }
  const ph_status_t status = ph_launch_host_func(handle, &task);
  if (null_run) {
    Expect("ph_launch_host_func with a NULL run", status,
           {PH_ERROR_INVALID_ARGUMENT});
  } else if (!stream) {
    Expect("ph_launch_host_func on a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
  } else {
    Expect("ph_launch_host_func", status, {PH_SUCCESS, stream->doom});
  }
  if (status != PH_SUCCESS) {
    if (probe->releases.load() != 1 || probe->runs.load() != 0) {
      Violation("ph_launch_host_func returned %s but the task ran %d times "
                "and was released %d times (expected 0 and 1)",
                ph_status_name(status), probe->runs.load(),
                probe->releases.load());
    }
  } else {
    probe->accepted = true;
    if (probe->result != PH_SUCCESS && stream->doom == PH_SUCCESS) {
      stream->doom = AsStickyStatus(probe->result);
    }
    if (target) {
      for (size_t i = 0; i < probe->fill_size; ++i) {
        const size_t at = probe->fill_ptr - target->ptr + i;
        target->shadow[at] = probe->fill_byte;
        target->known[at] = !probe->may_skip && probe->result == PH_SUCCESS;
      }
    }
  }
  probes_.push_back(std::move(probe));
}

// ph_run_host_func: the task has run (or been refused) and been released
// by the time the call returns, in stream order.
void Program::RunNow(const StreamRef& stream, ph_stream_t handle,
                     const ph_host_task_t& task,
                     std::unique_ptr<TaskProbe> probe, const BufferRef& target) {
  const ph_status_t doom_before = stream->doom;
  const ph_status_t status = ph_run_host_func(handle, &task);
  const ph_status_t own_failure = AsStickyStatus(probe->result);
  if (doom_before != PH_SUCCESS) {
    Expect("ph_run_host_func on a failed stream", status, {doom_before});
  } else if (probe->result != PH_SUCCESS) {
    Expect("ph_run_host_func of a failing task", status, {own_failure});
  } else {
    Expect("ph_run_host_func", status, {PH_SUCCESS});
  }
  const int expected_runs = doom_before == PH_SUCCESS ? 1 : 0;
  if (probe->runs.load() != expected_runs || probe->releases.load() != 1) {
    Violation("ph_run_host_func returned %s but the task ran %d times and "
              "was released %d times (expected %d and 1)",
              ph_status_name(status), probe->runs.load(),
              probe->releases.load(), expected_runs);
  }
  if (doom_before == PH_SUCCESS && probe->result != PH_SUCCESS) {
    stream->doom = own_failure;
  }
  if (target) {
    const bool wrote = doom_before == PH_SUCCESS && probe->result == PH_SUCCESS;
    for (size_t i = 0; i < probe->fill_size; ++i) {
      const size_t at = probe->fill_ptr - target->ptr + i;
      if (wrote) {
        target->shadow[at] = probe->fill_byte;
        target->known[at] = true;
      }
    }
  }
  probes_.push_back(std::move(probe));
}

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
  if (count != kDevices) Violation("ph_device_count changed to %d", count);
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

// PHANTOM_FUZZ_TRACE=1 prints each op as it runs (to follow a reproducer).
bool g_trace = false;

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

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("PHANTOM_DEVICE_COUNT", "2", 1);
  setenv("PHANTOM_DEVICE_MEMORY", kCapacityText, 1);
  g_trace = std::getenv("PHANTOM_FUZZ_TRACE") != nullptr;
  int count = 0;
  if (ph_device_count(&count) != PH_SUCCESS || count != kDevices) {
    std::fprintf(stderr, "hal_fuzzer: the driver did not start with %d "
                 "devices: %s\n", kDevices, ph_last_error_message());
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
