// Client streams and their callback threads; client_streams.h has the
// design.
#include "client_streams.h"

#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "client_link.h"
#include "wire.h"

namespace phantom::remote {
namespace {

constexpr uintptr_t kTagBits = 4;
constexpr uintptr_t kTagMask = (uintptr_t{1} << kTagBits) - 1;
constexpr uintptr_t kStreamTag = 0x5;
constexpr uintptr_t kEventTag = 0xa;

struct Registry {
  std::mutex mutex;
  std::map<uint64_t, std::shared_ptr<ClientStream>> streams;
};

Registry& GetRegistry() {
  static Registry* const registry = new Registry;  // leaked: used until exit
  return *registry;
}

std::atomic<uint64_t> g_next_task{1};

void Release(const ph_host_task_t& task) {
  if (task.release != nullptr) task.release(task.user_data);
}

}  // namespace

ClientStream::~ClientStream() {
  if (thread_.joinable()) StopCallbacks();
}

void ClientStream::StartCallbacks(int fd) {
  fd_ = fd;
  thread_ = std::thread([this] { Serve(); });
}

void ClientStream::StopCallbacks() {
  stopping_ = true;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ReleaseAll();
}

uint64_t ClientStream::AddTask(const ph_host_task_t& task) {
  const uint64_t id = g_next_task.fetch_add(1);
  std::lock_guard<std::mutex> lock(mutex_);
  pending_[id] = Pending{task};
  return id;
}

bool ClientStream::Take(uint64_t task, Pending* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = pending_.find(task);
  if (found == pending_.end()) return false;
  *out = std::move(found->second);
  pending_.erase(found);
  return true;
}

void ClientStream::ReleaseTask(uint64_t task) {
  Pending pending;
  if (Take(task, &pending)) Release(pending.task);  // else: released already
}

void ClientStream::ReleaseAll() {
  std::map<uint64_t, Pending> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left.swap(pending_);
  }
  for (auto& [id, pending] : left) Release(pending.task);
}

void ClientStream::Serve() {
  SetCurrentStream(id_, device_);
  Message message;
  std::string text;
  while (ReceiveMessage(fd_, &message, &text)) {
    Pending pending;
    const bool found = Take(message.a[0], &pending);
    Message reply;
    reply.op = static_cast<uint32_t>(Op::kReply);
    std::string reply_text;
    if (!found) {
      reply.status = PH_ERROR_DEVICE;
      reply_text = "the remote driver lost track of a host task";
    } else if (message.op == static_cast<uint32_t>(Op::kRunTask)) {
      char error[1024] = "";
      const ph_status_t status =
          pending.task.run(pending.task.user_data, error, sizeof error);
      error[sizeof error - 1] = '\0';
      if (status != PH_SUCCESS) {
        const char* name =
            pending.task.name != nullptr ? pending.task.name : "(unnamed)";
        reply_text = std::string("work '") + name +
                     "' failed on phantom device " + std::to_string(device_) +
                     ": " + (error[0] != '\0' ? error : "(the work gave no message)");
      }
      reply.status = status;
      Release(pending.task);
    } else {  // kReleaseTask: skipped because the stream is sticky
      Release(pending.task);
    }
    if (!SendMessage(fd_, reply, reply_text)) break;
  }
  if (stopping_) return;
  // The server is gone: nothing queued will run.
  MarkLost();
  ReleaseAll();
}

ph_stream_t StreamHandle(uint64_t id) {
  return reinterpret_cast<ph_stream_t>((uintptr_t{id} << kTagBits) | kStreamTag);
}

ph_event_t EventHandle(uint64_t id) {
  return reinterpret_cast<ph_event_t>((uintptr_t{id} << kTagBits) | kEventTag);
}

uint64_t StreamId(ph_stream_t handle) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(handle);
  return (value & kTagMask) == kStreamTag ? value >> kTagBits : 0;
}

uint64_t EventId(ph_event_t handle) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(handle);
  return (value & kTagMask) == kEventTag ? value >> kTagBits : 0;
}

void RegisterStream(std::shared_ptr<ClientStream> stream) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.streams[stream->id()] = std::move(stream);
}

std::shared_ptr<ClientStream> FindStream(ph_stream_t handle) {
  const uint64_t id = StreamId(handle);
  if (id == 0) return nullptr;
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto found = registry.streams.find(id);
  return found == registry.streams.end() ? nullptr : found->second;
}

std::shared_ptr<ClientStream> UnregisterStream(uint64_t id) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto found = registry.streams.find(id);
  if (found == registry.streams.end()) return nullptr;
  std::shared_ptr<ClientStream> stream = std::move(found->second);
  registry.streams.erase(found);
  return stream;
}

}  // namespace phantom::remote
