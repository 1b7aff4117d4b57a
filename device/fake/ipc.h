// Interprocess sharing of device memory and events (hal.h's optional
// "Interprocess sharing" section) in the fake driver.
//
// Memory. An exported allocation lives in its device's memory file (a
// memfd; device_memory.h explains how its pages get there). The handle
// names that file by the exporter's process id and descriptor number, with
// the file's identity (inode and device numbers) to catch a reused id, plus
// the allocation's offset, size and device index. The importer opens
// /proc/<pid>/fd/<fd>, which Linux allows between processes of one user
// (no descriptor passing needed, so the handle stays plain bytes, as a
// CUDA IPC handle is), checks the identity and maps the allocation into
// its own device's view. Once mapped, the bytes outlive the exporter: the
// mapping holds the file. An exporter that has exited is found at open
// ("process N has exited"), as is one that closed its file.
//
// Events. An interprocess event's state lives in a slot of a small shared
// memory file (one per process, grown by pools of slots) so that both
// processes can record it and see its records: the generation of the
// latest record, and for recent generations whether they were reached and
// whether the work before them failed (kEventRing of them, by generation
// modulo the ring: a wait for a generation whose cell a newer reached
// generation took counts as reached). A record queues a marker that
// publishes its generation when the stream reaches it; a query reads the
// slot; a synchronize and a stream wait poll it (spinning briefly, then
// sleeping up to kEventPollMax between looks, so a cross-process wait
// costs up to that much latency). The exporter's destroy retires the slot
// (its incarnation number changes) and importers then see the event as
// reached. A waiter also stops, with PH_ERROR_DEVICE, when the process that
// made the latest record has exited before reaching it: a crashed producer
// must not hang its consumers.
//
// The test-only switch PHANTOM_FAKE_NO_IPC=1 (config.h) makes every call
// here answer PH_ERROR_UNIMPLEMENTED, as a driver without the capability.
#ifndef PHANTOM_FAKE_IPC_H_
#define PHANTOM_FAKE_IPC_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "phantom/hal.h"
#include "stream.h"

namespace phantom::fake {

// PH_SUCCESS if the driver offers sharing, else PH_ERROR_UNIMPLEMENTED
// with a sentence naming `function` and the switch.
ph_status_t CheckIpcOffered(const char* function);

// ph_ipc_get_mem_handle / ph_ipc_open_mem_handle / ph_ipc_close_mem_handle
// after the started-driver and null-argument checks.
ph_status_t ExportMemory(const void* device_ptr, ph_ipc_mem_handle_t* out);
ph_status_t OpenMemory(const ph_ipc_mem_handle_t& handle, void** out_ptr);
ph_status_t CloseMemory(void* device_ptr);

// Opens descriptor `fd` of process `pid` (/proc/<pid>/fd/<fd>) and checks
// that it is the file (`inode`, `dev`) the handle names. Returns the new
// descriptor, or -1 with *status set and a sentence naming `function`.
int OpenExporterFile(const char* function, int pid, int fd, uint64_t inode,
                     uint64_t dev, ph_status_t* status);

constexpr int kEventRing = 13;
constexpr std::chrono::microseconds kEventPollMax{500};

// One interprocess event's state, in shared memory (128 bytes).
struct SharedEventSlot {
  std::atomic<uint64_t> incarnation;    // odd while an event owns the slot
  std::atomic<uint64_t> last_recorded;  // latest record's generation; 0: none
  std::atomic<int64_t> recorder_pid;    // the process that made that record
  // Per generation % kEventRing: the highest reached generation there,
  // with kEventFailedBit set if the work before it failed.
  std::atomic<uint64_t> reached[kEventRing];
};
static_assert(sizeof(SharedEventSlot) == 128, "slots are 128 bytes");
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");
constexpr uint64_t kEventFailedBit = uint64_t{1} << 63;

// A process's hold on an interprocess event: the slot it created (the
// exporter) or one it mapped from a handle (an importer). Owned by the
// fake's Event and by the work queued on it.
class SharedEvent {
 public:
  // A new event in this process's slot pool.
  static ph_status_t Create(std::shared_ptr<SharedEvent>* out);
  // The event a handle from another process names.
  static ph_status_t Open(const ph_ipc_event_handle_t& handle,
                          std::shared_ptr<SharedEvent>* out);
  ~SharedEvent();
  SharedEvent(const SharedEvent&) = delete;
  SharedEvent& operator=(const SharedEvent&) = delete;

  void Handle(ph_ipc_event_handle_t* out) const { *out = handle_; }

  // hal.h's event calls for this event.
  ph_status_t Record(const std::shared_ptr<SharedEvent>& self,
                     const std::shared_ptr<Stream>& stream);
  ph_status_t Query();
  ph_status_t Synchronize();
  ph_status_t QueueWait(const std::shared_ptr<SharedEvent>& self,
                        Stream& stream);

 private:
  struct Mapping;
  SharedEvent() = default;

  // Whether the exporter has destroyed the event (the slot moved on).
  bool Retired() const;
  // PH_SUCCESS (reached), PH_NOT_READY or PH_ERROR_DEVICE (message set)
  // for `generation`.
  ph_status_t StateOf(uint64_t generation) const;
  // Blocks until `generation` is reached (or the event retired).
  void WaitFor(uint64_t generation) const;
  ph_status_t FailedSentence(ph_status_t status) const;

  SharedEventSlot* slot_ = nullptr;
  uint64_t incarnation_ = 0;
  bool owner_ = false;  // created here: destroying retires the slot
  int slot_index_ = -1;  // in the owner's pool
  std::shared_ptr<Mapping> mapping_;  // an importer's mapped page
  ph_ipc_event_handle_t handle_{};
  // The latest record made in this process, to refuse a synchronize from
  // the very stream that would reach it.
  std::mutex mutex_;
  uint64_t local_generation_ = 0;
  const Stream* local_stream_ = nullptr;
};

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_IPC_H_
