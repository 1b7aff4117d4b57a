// Interprocess events of the fake driver; see ipc.h for the model.
//
// Slots come from pools: a pool is one memfd of kSlotsPerPool slots mapped
// shared in the exporting process for its whole life (an importer maps
// only the page that holds its slot). A slot is reused after its event is
// destroyed; its incarnation number (odd while in use) tells importers of
// the old event that it is gone.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"
#include "ipc.h"
#include "spin_wait.h"

namespace phantom::fake {
namespace {

constexpr int kSlotsPerPool = 512;
constexpr size_t kPoolBytes = kSlotsPerPool * sizeof(SharedEventSlot);

struct EventHandleBytes {
  char magic[8];
  int32_t pid;  // the exporting process
  int32_t fd;   // its descriptor of the pool file
  uint64_t inode;
  uint64_t dev;
  uint32_t slot;  // index in the pool file
  uint32_t unused;
  uint64_t incarnation;
  uint32_t checksum;
};
static_assert(sizeof(EventHandleBytes) <= PH_IPC_HANDLE_SIZE,
              "the handle fits in ph_ipc_event_handle_t");
constexpr char kEventMagic[8] = {'p', 'h', 'e', 'v', 't', '0', '0', '1'};

uint32_t Checksum(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t hash = 2166136261u;
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 16777619u;
  return hash;
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

struct Pool {
  int fd = -1;
  uint64_t inode = 0;
  uint64_t dev = 0;
  SharedEventSlot* slots = nullptr;
  std::vector<int> free;  // slot indices
};

// This process's slot pools. Leaked: queued work may use a slot at exit.
class Pools {
 public:
  static Pools& Get() {
    static auto* pools = new Pools();
    return *pools;
  }

  // A free slot; *out_pool is its pool (stable: pools are never removed).
  ph_status_t Take(const Pool** out_pool, int* out_slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& pool : pools_) {
      if (!pool->free.empty()) {
        *out_pool = pool.get();
        *out_slot = pool->free.back();
        pool->free.pop_back();
        return PH_SUCCESS;
      }
    }
    auto pool = std::make_unique<Pool>();
    const ph_status_t status = Create(pool.get());
    if (status != PH_SUCCESS) return status;
    for (int i = kSlotsPerPool - 1; i > 0; --i) pool->free.push_back(i);
    *out_pool = pool.get();
    *out_slot = 0;
    pools_.push_back(std::move(pool));
    return PH_SUCCESS;
  }

  void Give(const SharedEventSlot* slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& pool : pools_) {
      if (slot >= pool->slots && slot < pool->slots + kSlotsPerPool) {
        pool->free.push_back(static_cast<int>(slot - pool->slots));
        return;
      }
    }
  }

 private:
  static ph_status_t Create(Pool* pool) {
    auto fail = [](const char* step) {
      return Fail(PH_ERROR_OUT_OF_MEMORY,
                  std::string("ph_event_create: could not make shared memory "
                              "for interprocess events (") +
                      step + ": " + std::strerror(errno) + ")");
    };
    const int fd = memfd_create("phantom-events", MFD_CLOEXEC);
    if (fd < 0) return fail("memfd_create");
    struct stat info = {};
    void* mapped = MAP_FAILED;
    if (ftruncate(fd, kPoolBytes) != 0 || fstat(fd, &info) != 0 ||
        (mapped = mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0)) == MAP_FAILED) {
      const ph_status_t status = fail("mapping it");
      close(fd);
      return status;
    }
    (void)madvise(mapped, kPoolBytes, MADV_DONTFORK);
    pool->fd = fd;
    pool->inode = static_cast<uint64_t>(info.st_ino);
    pool->dev = static_cast<uint64_t>(info.st_dev);
    pool->slots = static_cast<SharedEventSlot*>(mapped);  // zeroed by the OS
    return PH_SUCCESS;
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Pool>> pools_;
};

// Whether process `pid` has exited (a zombie counts as exited).
bool ProcessGone(int64_t pid) {
  if (pid <= 0 || pid == getpid()) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat",
                static_cast<long long>(pid));
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) return true;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof line, file) != nullptr;
  std::fclose(file);
  const char* close_paren = read ? std::strrchr(line, ')') : nullptr;
  if (close_paren == nullptr || close_paren[1] == '\0') return false;
  const char state = close_paren[2];
  return state == 'Z' || state == 'X';
}

void Publish(SharedEventSlot* slot, uint64_t generation, bool failed) {
  std::atomic<uint64_t>& cell = slot->reached[generation % kEventRing];
  const uint64_t value = generation | (failed ? kEventFailedBit : 0);
  uint64_t current = cell.load(std::memory_order_acquire);
  while ((current & ~kEventFailedBit) < generation &&
         !cell.compare_exchange_weak(current, value,
                                     std::memory_order_acq_rel)) {
  }
}

}  // namespace

struct SharedEvent::Mapping {
  void* base = MAP_FAILED;
  size_t length = 0;
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, length);
  }
};

ph_status_t SharedEvent::Create(std::shared_ptr<SharedEvent>* out) {
  const Pool* pool = nullptr;
  int index = 0;
  const ph_status_t status = Pools::Get().Take(&pool, &index);
  if (status != PH_SUCCESS) return status;
  std::shared_ptr<SharedEvent> event(new SharedEvent());
  SharedEventSlot* slot = &pool->slots[index];
  slot->last_recorded.store(0, std::memory_order_relaxed);
  slot->recorder_pid.store(0, std::memory_order_relaxed);
  for (auto& cell : slot->reached) cell.store(0, std::memory_order_relaxed);
  // Odd: in use. Importers of the slot's previous event see it change.
  const uint64_t incarnation =
      slot->incarnation.fetch_add(1, std::memory_order_acq_rel) + 1;
  event->slot_ = slot;
  event->incarnation_ = incarnation;
  event->owner_ = true;
  event->slot_index_ = index;
  EventHandleBytes bytes{};
  std::memcpy(bytes.magic, kEventMagic, sizeof bytes.magic);
  bytes.pid = static_cast<int32_t>(getpid());
  bytes.fd = pool->fd;
  bytes.inode = pool->inode;
  bytes.dev = pool->dev;
  bytes.slot = static_cast<uint32_t>(index);
  bytes.incarnation = incarnation;
  bytes.checksum = Checksum(&bytes, offsetof(EventHandleBytes, checksum));
  std::memcpy(event->handle_.reserved, &bytes, sizeof bytes);
  *out = std::move(event);
  return PH_SUCCESS;
}

ph_status_t SharedEvent::Open(const ph_ipc_event_handle_t& handle,
                              std::shared_ptr<SharedEvent>* out) {
  EventHandleBytes bytes;
  std::memcpy(&bytes, handle.reserved, sizeof bytes);
  if (std::memcmp(bytes.magic, kEventMagic, sizeof bytes.magic) != 0 ||
      bytes.checksum != Checksum(&bytes, offsetof(EventHandleBytes, checksum)) ||
      bytes.slot >= static_cast<uint32_t>(kSlotsPerPool)) {
    return Fail(PH_ERROR_INVALID_HANDLE,
                "ph_ipc_open_event_handle: these bytes are not a phantom "
                "event handle (ph_ipc_get_event_handle makes one)");
  }
  if (bytes.pid == static_cast<int32_t>(getpid())) {
    return Fail(PH_ERROR_INVALID_ARGUMENT,
                "ph_ipc_open_event_handle: this process exported the handle; "
                "use the event it was made from");
  }
  ph_status_t status = PH_SUCCESS;
  const int fd = OpenExporterFile("ph_ipc_open_event_handle", bytes.pid,
                                  bytes.fd, bytes.inode, bytes.dev, &status);
  if (fd < 0) return status;
  const size_t page = PageSize();
  const size_t at = bytes.slot * sizeof(SharedEventSlot);
  auto mapping = std::make_shared<Mapping>();
  mapping->length = page;
  mapping->base = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(at / page * page));
  const int map_error = errno;
  close(fd);
  if (mapping->base == MAP_FAILED) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                std::string("ph_ipc_open_event_handle: could not map the "
                            "event's shared memory (mmap: ") +
                    std::strerror(map_error) + ")");
  }
  (void)madvise(mapping->base, page, MADV_DONTFORK);
  std::shared_ptr<SharedEvent> event(new SharedEvent());
  event->slot_ = reinterpret_cast<SharedEventSlot*>(
      static_cast<char*>(mapping->base) + at % page);
  event->incarnation_ = bytes.incarnation;
  event->mapping_ = std::move(mapping);
  event->handle_ = handle;
  *out = std::move(event);
  return PH_SUCCESS;
}

SharedEvent::~SharedEvent() {
  if (!owner_) return;
  // Even: retired. Then the slot may serve a new event.
  slot_->incarnation.fetch_add(1, std::memory_order_acq_rel);
  Pools::Get().Give(slot_);
}

bool SharedEvent::Retired() const {
  return slot_->incarnation.load(std::memory_order_acquire) != incarnation_;
}

ph_status_t SharedEvent::FailedSentence(ph_status_t status) const {
  return Fail(status,
              "work recorded before an interprocess event failed on its "
              "device (in the process that recorded the event; that "
              "process's stream reports the error itself)");
}

ph_status_t SharedEvent::StateOf(uint64_t generation) const {
  if (Retired()) return PH_SUCCESS;
  const uint64_t value =
      slot_->reached[generation % kEventRing].load(std::memory_order_acquire);
  if ((value & ~kEventFailedBit) < generation) return PH_NOT_READY;
  if ((value & kEventFailedBit) != 0) return FailedSentence(PH_ERROR_DEVICE);
  return PH_SUCCESS;
}

void SharedEvent::WaitFor(uint64_t generation) const {
  auto reached = [&] {
    if (Retired()) return true;
    const uint64_t value = slot_->reached[generation % kEventRing].load(
        std::memory_order_acquire);
    return (value & ~kEventFailedBit) >= generation;
  };
  if (SpinUntil(reached)) return;
  auto pause = std::chrono::microseconds(10);
  while (!reached()) {
    std::this_thread::sleep_for(pause);
    if (pause < kEventPollMax) pause *= 2;
    if (pause >= kEventPollMax &&
        ProcessGone(slot_->recorder_pid.load(std::memory_order_acquire)) &&
        !reached()) {
      // The recording process died before its marker ran: nothing will
      // ever reach this generation. Publish it as failed.
      Publish(slot_, generation, true);
      return;
    }
  }
}

ph_status_t SharedEvent::Record(const std::shared_ptr<SharedEvent>& self,
                                const std::shared_ptr<Stream>& stream) {
  if (Retired()) {
    return Fail(PH_ERROR_INVALID_HANDLE,
                "ph_event_record: the process that exported this interprocess "
                "event has destroyed it");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t generation =
      slot_->last_recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
  slot_->recorder_pid.store(getpid(), std::memory_order_release);
  Task task;
  task.kind = TaskKind::kEventMarker;
  task.name = "ph_event_record";
  task.runs_when_sticky = true;
  task.run = [](char*, size_t) { return PH_SUCCESS; };
  // The marker runs even behind failed work (stream.h); the stream hands
  // on_complete the state of the work before it, which is what the
  // generation publishes.
  task.on_complete = [self, generation](ph_status_t failure,
                                        const std::string&) {
    Publish(self->slot_, generation, failure != PH_SUCCESS);
  };
  uint64_t position = 0;
  const ph_status_t status = stream->Enqueue(std::move(task), false, &position);
  if (status != PH_SUCCESS) {
    // Never to be reached: fail it rather than leave waiters hanging.
    Publish(slot_, generation, true);
    return status;
  }
  local_generation_ = generation;
  local_stream_ = stream.get();
  return PH_SUCCESS;
}

ph_status_t SharedEvent::Query() {
  if (Retired()) return PH_SUCCESS;
  const uint64_t generation =
      slot_->last_recorded.load(std::memory_order_acquire);
  if (generation == 0) return PH_SUCCESS;
  return StateOf(generation);
}

ph_status_t SharedEvent::Synchronize() {
  if (Retired()) return PH_SUCCESS;
  const uint64_t generation =
      slot_->last_recorded.load(std::memory_order_acquire);
  if (generation == 0) return PH_SUCCESS;
  if (StateOf(generation) == PH_NOT_READY) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (local_generation_ == generation && local_stream_ != nullptr &&
        local_stream_ == CurrentStream()) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_event_synchronize was called from work running on the "
                  "stream that recorded the event, which would wait for "
                  "itself forever");
    }
  }
  WaitFor(generation);
  return StateOf(generation);
}

ph_status_t SharedEvent::QueueWait(const std::shared_ptr<SharedEvent>& self,
                                   Stream& stream) {
  if (Retired()) return PH_SUCCESS;
  const uint64_t generation =
      slot_->last_recorded.load(std::memory_order_acquire);
  if (generation == 0) return PH_SUCCESS;  // never recorded: no wait
  Task task;
  task.kind = TaskKind::kEventWait;
  task.name = "ph_stream_wait_event";
  // Work after the wait depends on the work before the record, in
  // whichever process recorded it: if that failed, this stream fails with
  // it, here (hal.h's error model). Only the failure crosses the process
  // boundary, not its message.
  task.wait = [self, generation](std::string* message, std::string* origin) {
    self->WaitFor(generation);
    const ph_status_t state = self->StateOf(generation);
    if (state == PH_SUCCESS) return PH_SUCCESS;
    *message = LastErrorMessage();
    *origin = *message;
    return state;
  };
  uint64_t position = 0;
  return stream.Enqueue(std::move(task), false, &position);
}

}  // namespace phantom::fake
