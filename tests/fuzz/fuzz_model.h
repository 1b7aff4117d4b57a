// The HAL fuzzer's model (hal_fuzzer.cc says what the fuzzer checks): the
// byte program it reads, what it believes the driver holds (streams,
// events, buffers with their host shadows, host tasks), the checks every
// call's status goes through, and the Program interpreter's declaration.
//
// Design. One Program per thread of the fuzz input; its operations are
// split by concept: fuzz_model.cc (checks, picking objects, ordering),
// fuzz_memory.cc (allocations, copies, fills, read-backs), fuzz_streams.cc
// (streams, events, host tasks) and hal_fuzzer.cc (devices, the worker
// thread, the interpreter, teardown and libFuzzer's entry points). Only
// phantom/hal.h is included; the fake's private headers never are.
#ifndef PHANTOM_TESTS_FUZZ_FUZZ_MODEL_H_
#define PHANTOM_TESTS_FUZZ_FUZZ_MODEL_H_

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

namespace hal_fuzz {

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

inline size_t Rounded(size_t size) {
  return (size + kGranule - 1) / kGranule * kGranule;
}

// Reports a broken promise of hal.h and aborts (libFuzzer's crash).
[[noreturn]] void Violation(const char* format, ...)
    __attribute__((format(printf, 1, 2)));

// Checks `got` is in `allowed`, and that an error carries a message.
void Expect(const char* call, ph_status_t got,
            std::initializer_list<ph_status_t> allowed);

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

ph_status_t TaskRun(void* user_data, char* error, size_t error_size);
void TaskRelease(void* user_data);

// The status a stream records for a failing task (device/fake/stream.cc:
// a task answering a non-error status is a device error).
ph_status_t AsStickyStatus(ph_status_t status);

// Whether `address` lies in one of `buffers`.
bool InLive(const std::vector<BufferRef>& buffers, const void* address);

// Device memory the whole process has live, by device; updated by both
// threads, compared with ph_mem_get_info only when one thread runs.
extern std::atomic<size_t> g_used[kDevices];

// PHANTOM_FUZZ_TRACE=1 prints each op as it runs (to follow a reproducer).
extern bool g_trace;

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

}  // namespace hal_fuzz

#endif  // PHANTOM_TESTS_FUZZ_FUZZ_MODEL_H_
