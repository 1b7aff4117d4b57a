// Stream workers, records and device memory of the server; see
// server_stream.h for the design.
#include "server_stream.h"

#include <unistd.h>

#include <cstdio>
#include <new>
#include <vector>

#include "wire.h"

namespace phantom::remote {
namespace {

// A task's status as a device error: anything that is not an error status
// of the HAL counts as PH_ERROR_DEVICE.
ph_status_t AsTaskError(int32_t status) {
  switch (status) {
    case PH_ERROR_INVALID_ARGUMENT:
    case PH_ERROR_INVALID_DEVICE:
    case PH_ERROR_INVALID_HANDLE:
    case PH_ERROR_OUT_OF_MEMORY:
    case PH_ERROR_DEVICE:
    case PH_ERROR_UNIMPLEMENTED:
    case PH_ERROR_NOT_INITIALIZED:
      return static_cast<ph_status_t>(status);
    default:
      return PH_ERROR_DEVICE;
  }
}

std::string Bytes(uint64_t bytes) {
  char text[64];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / double(1 << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f MiB", bytes / double(1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof text, "%.2f KiB", bytes / 1024.0);
  } else {
    std::snprintf(text, sizeof text, "%llu bytes",
                  static_cast<unsigned long long>(bytes));
  }
  return text;
}

constexpr uint64_t kAlignment = 256;

}  // namespace

/* ---- Records and events ------------------------------------------------ */

void Record::MarkReached(ph_status_t status, const std::string& failure_origin) {
  std::lock_guard<std::mutex> lock(mutex);
  failure = status;
  origin = failure_origin;
  reached = true;
  changed.notify_all();
}

void Record::WaitReached() {
  std::unique_lock<std::mutex> lock(mutex);
  changed.wait(lock, [this] { return reached; });
}

bool Record::Reached(ph_status_t* out_failure, std::string* out_origin) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!reached) return false;
  *out_failure = failure;
  *out_origin = origin;
  return true;
}

std::string InheritedByWait(const Record& record, const std::string& origin) {
  return "this stream waited for an event recorded on phantom device " +
         std::to_string(record.device) +
         " after work that failed, so its work queued after that wait was "
         "discarded (the failure is inherited through the event); the "
         "original error: " + origin;
}

std::string CarriedByEvent(const Record& record, const std::string& origin) {
  return "the event was recorded on phantom device " +
         std::to_string(record.device) +
         " after work that failed; the original error: " + origin;
}

void Done::Finish(ph_status_t result, const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex);
  status = result;
  message = text;
  finished = true;
  changed.notify_all();
}

ph_status_t Done::Wait(std::string* text) {
  std::unique_lock<std::mutex> lock(mutex);
  changed.wait(lock, [this] { return finished; });
  *text = message;
  return status;
}

/* ---- Streams ----------------------------------------------------------- */

Stream::Stream(uint64_t id, uint64_t session, int device, int priority)
    : id_(id), session_(session), device_(device), priority_(priority) {}

Stream::~Stream() {
  if (worker_.joinable()) Shutdown();
  if (callback_fd_ >= 0) ::close(callback_fd_);
}

void Stream::Start() { worker_ = std::thread([this] { Run(); }); }

void Stream::AttachCallback(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (callback_fd_ >= 0) ::close(callback_fd_);
  callback_fd_ = fd;
  changed_.notify_all();
}

ph_status_t Stream::Enqueue(Item item, bool refuse_when_sticky,
                            std::string* message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closing_) {
    *message = "the stream is null, destroyed or being destroyed";
    return PH_ERROR_INVALID_HANDLE;
  }
  if (refuse_when_sticky && sticky_ != PH_SUCCESS) {
    *message = sticky_message_;
    return sticky_;
  }
  if (item.kind == Item::Kind::kRecord) {
    item.record->stream = id_;
    item.record->device = device_;
  }
  queue_.push_back(std::move(item));
  ++queued_;
  changed_.notify_all();
  return PH_SUCCESS;
}

ph_status_t Stream::Query(std::string* message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (sticky_ != PH_SUCCESS) {
    *message = sticky_message_;
    return sticky_;
  }
  return completed_ == queued_ ? PH_SUCCESS : PH_NOT_READY;
}

ph_status_t Stream::Synchronize(std::string* message) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = queued_;
  changed_.wait(lock, [&] { return completed_ >= target; });
  *message = sticky_message_;
  return sticky_;
}

ph_status_t Stream::Sticky(std::string* message) {
  std::lock_guard<std::mutex> lock(mutex_);
  *message = sticky_message_;
  return sticky_;
}

void Stream::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    changed_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}

void Stream::SetSticky(ph_status_t status, std::string message,
                       std::string origin) {
  if (sticky_ != PH_SUCCESS) return;  // the first failure stays
  sticky_ = status;
  sticky_message_ = std::move(message);
  sticky_origin_ = std::move(origin);
}

void Stream::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return !queue_.empty() || closing_; });
    if (queue_.empty()) return;  // closing, and everything ran
    Item item = std::move(queue_.front());
    queue_.pop_front();
    Execute(item, lock);
    ++completed_;
    if (item.kind == Item::Kind::kRecord) {
      // Reached only once counted, so a query of the stream right after
      // the event is reached already says idle.
      item.record->MarkReached(sticky_, sticky_origin_);
    }
    // A waiting caller hears once the item is counted: a query right after
    // a blocking copy or ph_run_host_func says idle (or the task's error).
    if (item.done) item.done->Finish(sticky_, sticky_message_);
    changed_.notify_all();
  }
}

void Stream::Execute(Item& item, std::unique_lock<std::mutex>& lock) {
  const bool sticky = sticky_ != PH_SUCCESS;
  switch (item.kind) {
    case Item::Kind::kRecord:
      item.record->time = std::chrono::steady_clock::now();
      return;
    case Item::Kind::kBarrier:
      return;
    case Item::Kind::kWait: {
      if (sticky) return;
      lock.unlock();
      item.record->WaitReached();
      ph_status_t failure = PH_SUCCESS;
      std::string origin;
      item.record->Reached(&failure, &origin);
      lock.lock();
      if (failure != PH_SUCCESS) {
        SetSticky(failure, InheritedByWait(*item.record, origin), origin);
      }
      return;
    }
    case Item::Kind::kWork:
      if (!sticky) {
        lock.unlock();
        item.work();
        lock.lock();
      }
      return;
    case Item::Kind::kHost:
      RunHostTask(item, lock);
      return;
  }
}

void Stream::RunHostTask(Item& item, std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [this] { return callback_fd_ != -1 || closing_; });
  if (callback_fd_ < 0) return;  // the client never attached, or is gone
  const int fd = callback_fd_;
  const bool sticky = sticky_ != PH_SUCCESS;
  Message message;
  message.op = static_cast<uint32_t>(sticky ? Op::kReleaseTask : Op::kRunTask);
  message.a[0] = item.task;
  message.status = sticky_;
  const std::string why = sticky ? sticky_message_ : "";
  lock.unlock();
  Message reply;
  std::string text;
  const bool answered =
      SendMessage(fd, message, why) && ReceiveMessage(fd, &reply, &text);
  lock.lock();
  if (!answered) {
    // The client process is gone: nothing it queued can run any more.
    ::close(fd);
    callback_fd_ = -2;
    SetSticky(PH_ERROR_DEVICE,
              "the client process that queued this stream's host work is gone",
              "the client process that queued this stream's host work is gone");
    return;
  }
  if (!sticky && reply.status != PH_SUCCESS) {
    SetSticky(AsTaskError(reply.status), text, text);
  }
}

/* ---- Device memory ----------------------------------------------------- */

void DeviceMemory::Configure(int device, uint64_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  device_ = device;
  capacity_ = capacity;
  free_.clear();
  free_[0] = capacity;
}

ph_status_t DeviceMemory::Allocate(uint64_t session, uint64_t size,
                                   uint64_t* out_offset, std::string* message) {
  const uint64_t aligned =
      size > UINT64_MAX - kAlignment ? 0 : (size + kAlignment - 1) & ~(kAlignment - 1);
  std::lock_guard<std::mutex> lock(mutex_);
  auto fit = free_.end();
  if (aligned != 0) {
    for (auto range = free_.begin(); range != free_.end(); ++range) {
      if (range->second >= aligned) {
        fit = range;
        break;
      }
    }
  }
  if (fit == free_.end()) {
    *message = "phantom device " + std::to_string(device_) +
               " is out of memory: tried to allocate " + Bytes(size) + " (" +
               std::to_string(size) + " bytes), " + Bytes(capacity_ - used_) +
               " of " + Bytes(capacity_) +
               " are free and no free range is that large "
               "(PHANTOM_DEVICE_MEMORY sets the capacity)";
    return PH_ERROR_OUT_OF_MEMORY;
  }
  std::unique_ptr<char[]> bytes(new (std::nothrow) char[aligned]);
  if (!bytes) {
    *message = "phantom device " + std::to_string(device_) +
               " is out of memory: the remote server could not back " +
               Bytes(size) + " with its own memory";
    return PH_ERROR_OUT_OF_MEMORY;
  }
  const uint64_t offset = fit->first;
  const uint64_t left = fit->second - aligned;
  free_.erase(fit);
  if (left > 0) free_[offset + aligned] = left;
  blocks_[offset] = Block{aligned, session, std::move(bytes)};
  used_ += aligned;
  *out_offset = offset;
  return PH_SUCCESS;
}

ph_status_t DeviceMemory::Free(uint64_t offset, std::string* message) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto block = blocks_.find(offset);
  if (block == blocks_.end()) {
    *message = "is not the start of a live allocation on phantom device " +
               std::to_string(device_);
    return PH_ERROR_INVALID_HANDLE;
  }
  uint64_t start = offset;
  uint64_t size = block->second.size;
  used_ -= size;
  blocks_.erase(block);
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == start) {
      start = previous->first;
      size += previous->second;
      free_.erase(previous);
    }
  }
  free_[start] = size;
  return PH_SUCCESS;
}

void DeviceMemory::FreeSession(uint64_t session) {
  std::vector<uint64_t> owned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [offset, block] : blocks_) {
      if (block.session == session) owned.push_back(offset);
    }
  }
  std::string ignored;
  for (uint64_t offset : owned) Free(offset, &ignored);
}

void DeviceMemory::Info(uint64_t* out_free, uint64_t* out_total) {
  std::lock_guard<std::mutex> lock(mutex_);
  *out_free = capacity_ - used_;
  *out_total = capacity_;
}

char* DeviceMemory::Resolve(uint64_t offset, uint64_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto after = blocks_.upper_bound(offset);
  if (after == blocks_.begin()) return nullptr;
  const auto& [start, block] = *std::prev(after);
  if (offset - start > block.size || size > block.size - (offset - start)) {
    return nullptr;
  }
  return block.bytes.get() + (offset - start);
}

}  // namespace phantom::remote
