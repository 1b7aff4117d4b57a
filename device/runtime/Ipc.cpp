// See phantom/Ipc.h for the design.
#include <phantom/Device.h>
#include <phantom/Exception.h>
#include <phantom/Ipc.h>
#include <phantom/Stream.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace phantom {
namespace {

// "<Name> tensors cannot be sent ...": the backend's name, capitalised.
std::string sendCpuInstead() {
  std::string name = c10::get_privateuse1_backend();
  if (!name.empty()) name[0] = static_cast<char>(std::toupper(name[0]));
  return name +
         " tensors cannot be sent to another process with this driver: it "
         "cannot share device memory between processes";
}

// --- Reference-counter files ---------------------------------------------------

constexpr size_t kCounterFileBytes = sizeof(int64_t) * kIpcRefCounterSlots;

// kIpcRefCounterSlots counters in shared memory: a memfd, named for other
// processes as "<pid>:<fd>:<inode>:<dev>", which they open through
// /proc/<pid>/fd (the process must be alive then, as it must for the
// memory itself). Being anonymous, it leaves nothing behind when the
// process ends, even killed. Unmapped (and closed, for the creator) when the
// last holder lets go.
class CounterFile {
 public:
  // A new file, or null with *error set.
  static std::shared_ptr<CounterFile> create(std::string* error) {
    const int fd = memfd_create("phantom-ipc-counters", MFD_CLOEXEC);
    if (fd < 0) {
      *error = std::string("memfd_create: ") + std::strerror(errno);
      return nullptr;
    }
    struct stat info = {};
    if (ftruncate(fd, kCounterFileBytes) != 0 || fstat(fd, &info) != 0) {
      *error = std::string("ftruncate: ") + std::strerror(errno);
      close(fd);
      return nullptr;
    }
    auto file = map(fd, error);
    if (!file) {
      close(fd);
      return nullptr;
    }
    file->fd_ = fd;
    file->name_ = std::to_string(getpid()) + ":" + std::to_string(fd) + ":" +
                  std::to_string(info.st_ino) + ":" + std::to_string(info.st_dev);
    return file;
  }

  // Another process's file, by name; null if it cannot be reached (that
  // process has exited) or the name is not one.
  static std::shared_ptr<CounterFile> open(const std::string& name) {
    long long pid = 0, fd = 0;
    unsigned long long inode = 0, dev = 0;
    if (std::sscanf(name.c_str(), "%lld:%lld:%llu:%llu", &pid, &fd, &inode,
                    &dev) != 4) {
      return nullptr;
    }
    const std::string path =
        "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    const int opened = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (opened < 0) return nullptr;
    struct stat info = {};
    std::string error;
    std::shared_ptr<CounterFile> file;
    if (fstat(opened, &info) == 0 &&
        static_cast<unsigned long long>(info.st_ino) == inode &&
        static_cast<unsigned long long>(info.st_dev) == dev &&
        static_cast<size_t>(info.st_size) >= kCounterFileBytes) {
      file = map(opened, &error);
    }
    close(opened);  // the mapping keeps the file
    if (file) file->name_ = name;
    return file;
  }

  ~CounterFile() {
    munmap(counters_, kCounterFileBytes);
    if (fd_ >= 0) close(fd_);
  }

  const std::string& name() const { return name_; }
  int64_t* slot(int64_t index) const { return counters_ + index; }

 private:
  static std::shared_ptr<CounterFile> map(int fd, std::string* error) {
    void* mapped = mmap(nullptr, kCounterFileBytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      *error = std::string("mmap: ") + std::strerror(errno);
      return nullptr;
    }
    std::shared_ptr<CounterFile> file(new CounterFile());
    file->counters_ = static_cast<int64_t*>(mapped);
    return file;
  }

  CounterFile() = default;
  int64_t* counters_ = nullptr;
  int fd_ = -1;  // the creator's descriptor (others keep only the mapping)
  std::string name_;
};

// The sender's use of a counter file: slots are handed out in order and
// never reused; the file goes once every slot was handed out and returned.
struct RefCounterFile {
  std::shared_ptr<CounterFile> file;
  int64_t next = 0;    // the next slot never handed out
  int64_t in_use = 0;  // handed out and not yet returned

  const std::string& name() const { return file->name(); }
  int64_t* slot(int64_t index) const { return file->slot(index); }
};

// A send: the DataPtr it wraps, its counter slot and its event.
struct SentBlock {
  c10::DataPtr wrapped;
  std::shared_ptr<RefCounterFile> file;
  int64_t slot = 0;
  c10::DeviceIndex device = 0;
  ph_event_t event = nullptr;  // interprocess event recorded at the send

  int64_t counter() const {
    return __atomic_load_n(file->slot(slot), __ATOMIC_ACQUIRE);
  }
  ~SentBlock();
};

class Limbo {
 public:
  void add(std::unique_ptr<SentBlock> block) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.push_back(std::move(block));
  }

  // Frees the blocks whose receivers are done; true if any was freed.
  bool collect() {
    std::vector<std::unique_ptr<SentBlock>> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<std::unique_ptr<SentBlock>> kept;
      for (auto& block : blocks_) {
        (block->counter() > 0 ? kept : done).push_back(std::move(block));
      }
      blocks_ = std::move(kept);
    }
    // Freed outside the lock: freeing a block may free the block it wraps,
    // which comes back here.
    const bool freed = !done.empty();
    done.clear();
    return freed;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return blocks_.size();
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<SentBlock>> blocks_;
};

struct SenderState {
  std::mutex mutex;  // guards the files
  std::shared_ptr<RefCounterFile> current;  // has slots left, or null
  Limbo limbo;
};

SenderState& sender() {
  // Leaked: sent blocks may be freed by static destructors at exit.
  static auto* state = new SenderState();
  return *state;
}

// A slot set to 1, in the current file (made if needed).
std::pair<std::shared_ptr<RefCounterFile>, int64_t> takeCounterSlot() {
  SenderState& state = sender();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.current) {
    std::string error;
    auto file = std::make_shared<RefCounterFile>();
    file->file = CounterFile::create(&error);
    TORCH_CHECK(file->file, "cannot send a ", c10::get_privateuse1_backend(),
                " tensor: no shared memory for its reference counter (", error,
                ")");
    state.current = std::move(file);
  }
  std::shared_ptr<RefCounterFile> file = state.current;
  const int64_t slot = file->next++;
  file->in_use += 1;
  __atomic_store_n(file->slot(slot), int64_t{1}, __ATOMIC_RELEASE);
  if (file->next == kIpcRefCounterSlots) state.current.reset();
  return {std::move(file), slot};
}

void returnCounterSlot(const std::shared_ptr<RefCounterFile>& file) {
  std::lock_guard<std::mutex> lock(sender().mutex);
  file->in_use -= 1;  // the file goes with its last SentBlock
}

SentBlock::~SentBlock() {
  if (event != nullptr) (void)ph_event_destroy(event);
  returnCounterSlot(file);
  // `wrapped` frees the memory (or the previous send's block) next.
}

void deleteSentBlock(void* context) {
  std::unique_ptr<SentBlock> block(static_cast<SentBlock*>(context));
  if (block->counter() > 0) {
    sender().limbo.add(std::move(block));
  }
  block.reset();
  sender().limbo.collect();
}

// The ph_ipc_get_mem_handle status as the user's error.
[[noreturn]] void throwCannotExport(ph_status_t status) {
  const std::string driver = ph_last_error_message();
  if (status == PH_ERROR_UNIMPLEMENTED) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, sendCpuInstead(), " (", driver,
        "). Send tensor.cpu() instead, and move it back with .to('",
        c10::get_privateuse1_backend(), "') in the receiving process.");
  }
  throwHalError(status, "ph_ipc_get_mem_handle", __FILE__, __LINE__);
}

// --- The receiver's side ------------------------------------------------------

// One opened segment, closed when its last storage goes.
struct OpenedSegment {
  void* base = nullptr;
  ~OpenedSegment() {
    if (ph_ipc_close_mem_handle(base) != PH_SUCCESS) {
      std::fprintf(stderr, "phantom: closing shared memory %p failed: %s\n",
                   base, ph_last_error_message());
    }
  }
};

struct ReceiverState {
  std::mutex mutex;  // guards both maps
  std::map<std::string, std::weak_ptr<OpenedSegment>> segments;
  std::map<std::string, std::weak_ptr<CounterFile>> counter_files;
};

ReceiverState& receiver() {
  static auto* state = new ReceiverState();  // leaked, as sender()
  return *state;
}

std::shared_ptr<OpenedSegment> openSegment(const std::string& handle) {
  ReceiverState& state = receiver();
  std::lock_guard<std::mutex> lock(state.mutex);
  auto& entry = state.segments[handle];
  if (auto open = entry.lock()) return open;
  ph_ipc_mem_handle_t bytes{};
  std::memcpy(bytes.reserved, handle.data(), sizeof bytes.reserved);
  void* base = nullptr;
  PHANTOM_CHECK(ph_ipc_open_mem_handle(&bytes, &base));
  auto open = std::make_shared<OpenedSegment>();
  open->base = base;
  entry = open;
  return open;
}

// The sender's counter file, mapped here (null if it is gone: the sender
// exited, and nobody is left to tell).
std::shared_ptr<CounterFile> openCounterFile(const std::string& name) {
  ReceiverState& state = receiver();
  std::lock_guard<std::mutex> lock(state.mutex);
  auto& entry = state.counter_files[name];
  if (auto open = entry.lock()) return open;
  auto file = CounterFile::open(name);
  entry = file;
  return file;
}

void decrementCounter(const std::shared_ptr<CounterFile>& file, int64_t slot) {
  if (file && slot >= 0 && slot < kIpcRefCounterSlots) {
    __atomic_fetch_sub(file->slot(slot), int64_t{1}, __ATOMIC_ACQ_REL);
  }
}

// What a received storage holds, released in stream order (see Ipc.h).
struct ReceivedBlock {
  std::shared_ptr<OpenedSegment> segment;
  std::shared_ptr<CounterFile> counter_file;
  int64_t slot = -1;
  c10::DeviceIndex device = 0;

  ~ReceivedBlock() { decrementCounter(counter_file, slot); }
};

void deleteReceivedBlock(void* context) {
  auto* block = static_cast<ReceivedBlock*>(context);
  // After the work this thread queued on the device so far: a host task
  // whose release (after it runs, or instead of it on a failed or
  // destroyed stream) lets go of the memory.
  ph_host_task_t task{};
  task.name = "release memory received from another process";
  task.run = [](void*, char*, size_t) { return PH_SUCCESS; };
  task.release = [](void* data) { delete static_cast<ReceivedBlock*>(data); };
  task.user_data = block;
  try {
    const PhantomStream stream = getCurrentPhantomStream(block->device);
    (void)ph_launch_host_func(stream.handle(), &task);  // releases on error
  } catch (...) {
    delete block;  // no stream to order it on (exiting): release now
  }
}

}  // namespace

// --- Sending ----------------------------------------------------------------

SharedStorage shareStorage(c10::StorageImpl* storage) {
  TORCH_CHECK(!storage->received_cuda(),
              "cannot send a ", c10::get_privateuse1_backend(),
              " tensor that this process received from another process; send "
              "a clone() of it instead (as with CUDA tensors)");
  const c10::Device device = storage->device();
  SharedStorage shared;
  shared.device = device.index();
  shared.storage_bytes = storage->nbytes();
  void* data = storage->mutable_data();
  if (data == nullptr) return shared;  // an empty storage: nothing to map

  c10::DeviceGuard guard(device);
  ph_pointer_attributes_t attributes{};
  PHANTOM_CHECK(ph_pointer_get_attributes(data, &attributes));
  TORCH_CHECK(attributes.type == PH_MEMORY_DEVICE && attributes.base != nullptr,
              "cannot send this ", c10::get_privateuse1_backend(),
              " storage: its data pointer is not device memory of a live "
              "allocation");
  ph_ipc_mem_handle_t handle{};
  const ph_status_t exported = ph_ipc_get_mem_handle(data, &handle);
  if (exported != PH_SUCCESS) throwCannotExport(exported);
  shared.memory_handle.assign(reinterpret_cast<const char*>(handle.reserved),
                              sizeof handle.reserved);
  shared.offset_bytes = static_cast<size_t>(static_cast<char*>(data) -
                                            static_cast<char*>(attributes.base));

  // The receiver must see the work queued so far on this thread's stream.
  const PhantomStream stream = getCurrentPhantomStream(device.index());
  ph_event_t event = nullptr;
  const ph_status_t created =
      ph_event_create(PH_EVENT_INTERPROCESS | PH_EVENT_DISABLE_TIMING, &event);
  if (created == PH_SUCCESS) {
    ph_ipc_event_handle_t event_handle{};
    const ph_status_t recorded = ph_event_record(event, stream.handle());
    const ph_status_t got =
        recorded == PH_SUCCESS ? ph_ipc_get_event_handle(event, &event_handle)
                               : recorded;
    if (got != PH_SUCCESS) {
      (void)ph_event_destroy(event);
      PHANTOM_CHECK(got);
    }
    shared.event_handle.assign(
        reinterpret_cast<const char*>(event_handle.reserved),
        sizeof event_handle.reserved);
    shared.event_sync_required = true;
  } else if (created == PH_ERROR_UNIMPLEMENTED) {
    stream.synchronize();  // no interprocess events: finish the work now
    event = nullptr;
  } else {
    PHANTOM_CHECK(created);
  }

  std::pair<std::shared_ptr<RefCounterFile>, int64_t> counter;
  try {
    counter = takeCounterSlot();
  } catch (...) {
    if (event != nullptr) (void)ph_event_destroy(event);
    throw;
  }
  auto* block = new SentBlock();
  block->file = std::move(counter.first);
  block->slot = counter.second;
  block->device = device.index();
  block->event = event;
  shared.ref_counter_handle = block->file->name();
  shared.ref_counter_offset = block->slot;
  c10::DataPtr wrapper(data, block, &deleteSentBlock, device);
  block->wrapped = storage->set_data_ptr(std::move(wrapper));
  return shared;
}

const c10::DataPtr* ipcWrappedDataPtr(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &deleteSentBlock || ptr.get_context() == nullptr) {
    return nullptr;
  }
  return &static_cast<SentBlock*>(ptr.get_context())->wrapped;
}

bool ipcCollect() { return sender().limbo.collect(); }

size_t ipcBlocksInLimbo() { return sender().limbo.size(); }

// --- Receiving --------------------------------------------------------------

c10::intrusive_ptr<c10::StorageImpl> newSharedStorage(const SharedStorage& shared) {
  checkDeviceIndex(shared.device);
  const c10::Device device(c10::DeviceType::PrivateUse1, shared.device);
  c10::DeviceGuard guard(device);
  TORCH_CHECK(shared.memory_handle.size() == PH_IPC_HANDLE_SIZE,
              "a phantom memory handle has ", PH_IPC_HANDLE_SIZE,
              " bytes, got ", shared.memory_handle.size());
  if (shared.event_sync_required) {
    TORCH_CHECK(shared.event_handle.size() == PH_IPC_HANDLE_SIZE,
                "a phantom event handle has ", PH_IPC_HANDLE_SIZE,
                " bytes, got ", shared.event_handle.size());
    // Work on this storage queued from now on waits for the sender's work.
    ph_ipc_event_handle_t bytes{};
    std::memcpy(bytes.reserved, shared.event_handle.data(),
                sizeof bytes.reserved);
    ph_event_t event = nullptr;
    PHANTOM_CHECK(ph_ipc_open_event_handle(&bytes, &event));
    const PhantomStream stream = getCurrentPhantomStream(shared.device);
    const ph_status_t waited = ph_stream_wait_event(stream.handle(), event);
    (void)ph_event_destroy(event);  // the queued wait keeps what it needs
    stream.check(waited, stream.handle());
  }
  auto block = std::make_unique<ReceivedBlock>();
  block->segment = openSegment(shared.memory_handle);
  block->counter_file = openCounterFile(shared.ref_counter_handle);
  block->slot = shared.ref_counter_offset;
  block->device = shared.device;
  void* data = static_cast<char*>(block->segment->base) + shared.offset_bytes;
  c10::DataPtr ptr(data, block.release(), &deleteReceivedBlock, device);
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), shared.storage_bytes,
      std::move(ptr), /*allocator=*/nullptr, /*resizable=*/false);
  storage->set_received_cuda(true);
  return storage;
}

void releaseIpcCounter(const std::string& ref_counter_handle,
                       int64_t ref_counter_offset) {
  decrementCounter(openCounterFile(ref_counter_handle), ref_counter_offset);
}

// --- Interprocess events ------------------------------------------------------

IpcEvent::IpcEvent(c10::DeviceIndex device) : device_(device) {
  checkDeviceIndex(device);
  PHANTOM_CHECK(
      ph_event_create(PH_EVENT_INTERPROCESS | PH_EVENT_DISABLE_TIMING, &event_));
}

IpcEvent::IpcEvent(c10::DeviceIndex device, const std::string& handle)
    : device_(device) {
  checkDeviceIndex(device);
  TORCH_CHECK_VALUE(handle.size() == PH_IPC_HANDLE_SIZE,
                    "a phantom event handle has ", PH_IPC_HANDLE_SIZE,
                    " bytes (Event.ipc_handle() makes one), got ",
                    handle.size());
  ph_ipc_event_handle_t bytes{};
  std::memcpy(bytes.reserved, handle.data(), sizeof bytes.reserved);
  PHANTOM_CHECK(ph_ipc_open_event_handle(&bytes, &event_));
}

IpcEvent::~IpcEvent() {
  if (event_ != nullptr) (void)ph_event_destroy(event_);
}

std::string IpcEvent::handle() const {
  ph_ipc_event_handle_t bytes{};
  PHANTOM_CHECK(ph_ipc_get_event_handle(event_, &bytes));
  return std::string(reinterpret_cast<const char*>(bytes.reserved),
                     sizeof bytes.reserved);
}

void IpcEvent::record(const PhantomStream& stream) {
  TORCH_CHECK(stream.device_index() == device_,
              "Event device ",
              c10::Device(c10::DeviceType::PrivateUse1, device_),
              " does not match recording stream's device ", stream.device());
  const ph_stream_t handle = stream.handle();
  stream.check(ph_event_record(event_, handle), handle);
}

void IpcEvent::wait(const PhantomStream& stream) {
  const ph_stream_t handle = stream.handle();
  stream.check(ph_stream_wait_event(handle, event_), handle);
}

bool IpcEvent::query() {
  const ph_status_t status = ph_event_query(event_);
  if (status == PH_NOT_READY) return false;
  PHANTOM_CHECK(status);
  return true;
}

void IpcEvent::synchronize() { PHANTOM_CHECK(ph_event_synchronize(event_)); }

}  // namespace phantom
