// phantom_remote_server: the process that is the remote device.
//
// Design. The server listens on a Unix-domain socket and serves each
// connection on a thread of its own (wire.h says what each connection
// carries). Everything a client creates (device memory, streams, events,
// the pinned blocks it shares) belongs to its session; when the session's
// connection closes, a server the client spawned exits (its only client is
// gone), and a shared server (started by hand, reached through
// PHANTOM_REMOTE_SOCKET) frees what the session owned and goes on.
//
// Bulk data never goes through the socket: pinned host blocks and each
// connection's staging block are shared-memory descriptors the client
// passes once (SCM_RIGHTS) and both sides map; device memory stays here.
//
// Configuration: PHANTOM_DEVICE_COUNT and PHANTOM_DEVICE_MEMORY, read by
// the settings parser as the fake driver reads them. A bad value does not
// stop the server: it answers every session hello with
// PH_ERROR_NOT_INITIALIZED and the parser's sentence, so the client's
// driver reports it as any driver that cannot start.
//
// Usage: phantom_remote_server --socket PATH [--session-fd N]
//   --session-fd: the spawning client's session connection (inherited);
//   the server exits, removing PATH and its folder, when it closes.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <phantom/common/settings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server_stream.h"
#include "wire.h"

namespace phantom::remote {
namespace {

struct Config {
  std::string error;  // non-empty: the server cannot serve devices
  int device_count = 0;
  uint64_t device_memory = 0;
};

struct Mapping {
  char* address = nullptr;
  uint64_t size = 0;
};

struct Server {
  Config config;
  std::string socket_path;
  bool spawned = false;
  std::vector<std::unique_ptr<DeviceMemory>> devices;
  std::mutex mutex;  // guards everything below
  uint64_t next_id = 1;
  std::map<uint64_t, std::shared_ptr<Stream>> streams;
  std::map<uint64_t, std::shared_ptr<Event>> events;
  // session -> client address -> the server's mapping of that pinned block
  std::map<uint64_t, std::map<uint64_t, Mapping>> pinned;
};

Server* g_server = nullptr;

Config ReadConfig() {
  Config config;
  settings::Value count;
  settings::Value memory;
  if (!settings::ReadEnvironment(settings::kDeviceCount, &count,
                                 &config.error) ||
      !settings::ReadEnvironment(settings::kDeviceMemory, &memory,
                                 &config.error)) {
    return config;
  }
  config.device_count = static_cast<int>(count.number);
  config.device_memory = memory.number;
  return config;
}

Mapping MapShared(int fd, uint64_t size) {
  Mapping mapping;
  void* address = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, 0);
  ::close(fd);
  if (address == MAP_FAILED) return mapping;
  mapping.address = static_cast<char*>(address);
  mapping.size = size;
  return mapping;
}

// One connection's state and its request loop.
class Connection {
 public:
  Connection(int fd, uint64_t session) : fd_(fd), session_(session) {}
  ~Connection() {
    if (staging_.address != nullptr) ::munmap(staging_.address, staging_.size);
    ::close(fd_);
  }
  void Serve();

 private:
  // Sets the reply's status and text; returns false to end the connection.
  void Handle(const Message& request, int passed_fd, Message* reply,
              std::string* text);
  std::shared_ptr<Stream> FindStream(uint64_t id, std::string* text);
  std::shared_ptr<Event> FindEvent(uint64_t id, std::string* text);
  char* Resolve(uint64_t place, uint64_t address, uint64_t size);
  ph_status_t Copy(const Message& request, std::string* text);
  ph_status_t Memset(const Message& request, std::string* text);
  ph_status_t Submit(Stream& stream, Item item, bool blocking,
                     std::string* text);
  ph_status_t CheckDevice(uint64_t device, std::string* text);

  int fd_;
  uint64_t session_;
  Mapping staging_;
};

void Connection::Serve() {
  Message request;
  std::string text;
  int passed = -1;
  while (ReceiveMessage(fd_, &request, &text, &passed)) {
    Message reply;
    reply.op = static_cast<uint32_t>(Op::kReply);
    std::string reply_text;
    Handle(request, passed, &reply, &reply_text);
    if (!SendMessage(fd_, reply, reply_text)) return;
  }
}

ph_status_t Connection::CheckDevice(uint64_t device, std::string* text) {
  if (device < static_cast<uint64_t>(g_server->config.device_count)) {
    return PH_SUCCESS;
  }
  *text = "device index " + std::to_string(static_cast<int64_t>(device)) +
          " is out of range: there are " +
          std::to_string(g_server->config.device_count) +
          " phantom devices (PHANTOM_DEVICE_COUNT)";
  return PH_ERROR_INVALID_DEVICE;
}

std::shared_ptr<Stream> Connection::FindStream(uint64_t id, std::string* text) {
  std::lock_guard<std::mutex> lock(g_server->mutex);
  auto found = g_server->streams.find(id);
  if (found == g_server->streams.end() ||
      found->second->session() != session_) {
    *text = "the stream is null, destroyed or not a stream";
    return nullptr;
  }
  return found->second;
}

std::shared_ptr<Event> Connection::FindEvent(uint64_t id, std::string* text) {
  std::lock_guard<std::mutex> lock(g_server->mutex);
  auto found = g_server->events.find(id);
  if (found == g_server->events.end() || found->second->session != session_) {
    *text = "the event is null, destroyed or not an event";
    return nullptr;
  }
  return found->second;
}

char* Connection::Resolve(uint64_t place, uint64_t address, uint64_t size) {
  switch (static_cast<Place>(place)) {
    case Place::kDevice: {
      const uint64_t device = address >> kDeviceShift;
      if (device >= g_server->devices.size()) return nullptr;
      return g_server->devices[device]->Resolve(address & kOffsetMask, size);
    }
    case Place::kPinned: {
      std::lock_guard<std::mutex> lock(g_server->mutex);
      auto& blocks = g_server->pinned[session_];
      auto after = blocks.upper_bound(address);
      if (after == blocks.begin()) return nullptr;
      const auto& [start, mapping] = *std::prev(after);
      if (address - start > mapping.size ||
          size > mapping.size - (address - start)) {
        return nullptr;
      }
      return mapping.address + (address - start);
    }
    case Place::kStaging:
      if (address > staging_.size || size > staging_.size - address) {
        return nullptr;
      }
      return staging_.address + address;
  }
  return nullptr;
}

ph_status_t Connection::Submit(Stream& stream, Item item, bool blocking,
                               std::string* text) {
  std::shared_ptr<Done> done;
  if (blocking) {
    done = std::make_shared<Done>();
    item.done = done;
  }
  const ph_status_t queued = stream.Enqueue(std::move(item), true, text);
  if (queued != PH_SUCCESS || !blocking) return queued;
  return done->Wait(text);
}

ph_status_t Connection::Copy(const Message& request, std::string* text) {
  const uint64_t size = request.a[5];
  const bool blocking = (request.a[1] & kCopyBlocking) != 0;
  char* dst = Resolve(request.a[1] & 0xffffffffu, request.a[2], size);
  char* src = Resolve(request.a[3], request.a[4], size);
  if (dst == nullptr || src == nullptr) {
    *text = std::string("the copy's ") + (dst == nullptr ? "destination" : "source") +
            " is not inside memory the server knows (a live allocation, a "
            "registered pinned block or the staging block)";
    return PH_ERROR_INVALID_ARGUMENT;
  }
  if (request.a[0] == 0) {  // ph_memcpy: now, ordered with no stream
    std::memmove(dst, src, size);
    return PH_SUCCESS;
  }
  std::shared_ptr<Stream> stream = FindStream(request.a[0], text);
  if (!stream) return PH_ERROR_INVALID_HANDLE;
  Item item;
  item.kind = Item::Kind::kWork;
  item.work = [dst, src, size] { std::memmove(dst, src, size); };
  return Submit(*stream, std::move(item), blocking, text);
}

ph_status_t Connection::Memset(const Message& request, std::string* text) {
  std::shared_ptr<Stream> stream = FindStream(request.a[0], text);
  if (!stream) return PH_ERROR_INVALID_HANDLE;
  const uint64_t size = request.a[4];
  char* dst = Resolve(static_cast<uint64_t>(Place::kDevice),
                      (request.a[1] << kDeviceShift) | request.a[2], size);
  if (dst == nullptr) {
    *text = "the fill's destination is not inside a live allocation";
    return PH_ERROR_INVALID_ARGUMENT;
  }
  const int byte = static_cast<int>(request.a[3] & 0xff);
  Item item;
  item.kind = Item::Kind::kWork;
  item.work = [dst, byte, size] { std::memset(dst, byte, size); };
  return Submit(*stream, std::move(item), false, text);
}

void Connection::Handle(const Message& request, int passed_fd, Message* reply,
                        std::string* text) {
  Server& server = *g_server;
  auto status = [&](ph_status_t value) { reply->status = value; };
  const uint64_t* a = request.a;
  switch (static_cast<Op>(request.op)) {
    case Op::kDeviceProperties: {
      const ph_status_t valid = CheckDevice(a[0], text);
      status(valid);
      if (valid != PH_SUCCESS) return;
      const unsigned cores = std::thread::hardware_concurrency();
      reply->a[0] = server.config.device_memory;
      reply->a[1] = cores > 0 ? cores : 1;
      reply->a[2] = 0;                            // lowest priority
      reply->a[3] = static_cast<uint64_t>(-1);    // highest priority
      *text = "Phantom remote accelerator";
      return;
    }
    case Op::kDeviceSynchronize: {
      const ph_status_t valid = CheckDevice(a[0], text);
      status(valid);
      if (valid != PH_SUCCESS) return;
      std::vector<std::shared_ptr<Stream>> device_streams;
      {
        std::lock_guard<std::mutex> lock(server.mutex);
        for (const auto& [id, stream] : server.streams) {
          if (stream->session() == session_ &&
              stream->device() == static_cast<int>(a[0])) {
            device_streams.push_back(stream);
          }
        }
      }
      for (const auto& stream : device_streams) {
        std::string message;
        const ph_status_t result = stream->Synchronize(&message);
        if (result != PH_SUCCESS && reply->status == PH_SUCCESS) {
          status(result);
          *text = message;
        }
      }
      return;
    }
    case Op::kMemInfo: {
      const ph_status_t valid = CheckDevice(a[0], text);
      status(valid);
      if (valid == PH_SUCCESS) server.devices[a[0]]->Info(&reply->a[0], &reply->a[1]);
      return;
    }
    case Op::kMalloc: {
      ph_status_t result = CheckDevice(a[0], text);
      if (result == PH_SUCCESS) {
        result = server.devices[a[0]]->Allocate(session_, a[1], &reply->a[0], text);
      }
      status(result);
      return;
    }
    case Op::kFree: {
      ph_status_t result = CheckDevice(a[0], text);
      if (result == PH_SUCCESS) result = server.devices[a[0]]->Free(a[1], text);
      status(result);
      return;
    }
    case Op::kPinnedRegister: {
      if (passed_fd < 0) {
        status(PH_ERROR_INVALID_ARGUMENT);
        *text = "pinned registration without a memory descriptor";
        return;
      }
      const Mapping mapping = MapShared(passed_fd, a[1]);
      if (mapping.address == nullptr) {
        status(PH_ERROR_OUT_OF_MEMORY);
        *text = std::string("the remote server cannot map the pinned block: ") +
                std::strerror(errno);
        return;
      }
      std::lock_guard<std::mutex> lock(server.mutex);
      server.pinned[session_][a[0]] = mapping;
      return;
    }
    case Op::kPinnedUnregister: {
      std::lock_guard<std::mutex> lock(server.mutex);
      auto& blocks = server.pinned[session_];
      auto found = blocks.find(a[0]);
      if (found != blocks.end()) {
        ::munmap(found->second.address, found->second.size);
        blocks.erase(found);
      }
      return;
    }
    case Op::kStagingAttach: {
      if (staging_.address != nullptr) ::munmap(staging_.address, staging_.size);
      staging_ = passed_fd >= 0 ? MapShared(passed_fd, a[0]) : Mapping{};
      if (staging_.address == nullptr) {
        status(PH_ERROR_OUT_OF_MEMORY);
        *text = "the remote server cannot map the staging block";
      }
      return;
    }
    case Op::kStreamCreate: {
      const ph_status_t valid = CheckDevice(a[0], text);
      status(valid);
      if (valid != PH_SUCCESS) return;
      int priority = static_cast<int>(static_cast<int64_t>(a[1]));
      priority = priority < -1 ? -1 : (priority > 0 ? 0 : priority);
      std::lock_guard<std::mutex> lock(server.mutex);
      const uint64_t id = server.next_id++;
      auto stream = std::make_shared<Stream>(id, session_,
                                             static_cast<int>(a[0]), priority);
      stream->Start();
      server.streams[id] = stream;
      reply->a[0] = id;
      reply->a[1] = static_cast<uint64_t>(static_cast<int64_t>(priority));
      return;
    }
    case Op::kStreamDestroy: {
      std::shared_ptr<Stream> stream = FindStream(a[0], text);
      if (!stream) return status(PH_ERROR_INVALID_HANDLE);
      {
        std::lock_guard<std::mutex> lock(server.mutex);
        server.streams.erase(a[0]);
      }
      stream->Shutdown();
      return;
    }
    case Op::kStreamQuery:
    case Op::kStreamSynchronize: {
      std::shared_ptr<Stream> stream = FindStream(a[0], text);
      if (!stream) return status(PH_ERROR_INVALID_HANDLE);
      status(static_cast<Op>(request.op) == Op::kStreamQuery
                 ? stream->Query(text)
                 : stream->Synchronize(text));
      return;
    }
    case Op::kStreamWaitEvent: {
      std::shared_ptr<Stream> stream = FindStream(a[0], text);
      if (!stream) return status(PH_ERROR_INVALID_HANDLE);
      std::shared_ptr<Event> event = FindEvent(a[1], text);
      if (!event) return status(PH_ERROR_INVALID_HANDLE);
      std::shared_ptr<Record> record;
      {
        std::lock_guard<std::mutex> lock(event->mutex);
        record = event->latest;
      }
      if (!record) return;  // never recorded: no wait
      Item item;
      item.kind = Item::Kind::kWait;
      item.record = std::move(record);
      status(stream->Enqueue(std::move(item), false, text));
      return;
    }
    case Op::kLaunch: {
      std::shared_ptr<Stream> stream = FindStream(a[0], text);
      if (!stream) return status(PH_ERROR_INVALID_HANDLE);
      Item item;
      item.kind = Item::Kind::kHost;
      item.task = a[1];
      // a2 != 0: ph_run_host_func, which answers once the task has run.
      status(Submit(*stream, std::move(item), a[2] != 0, text));
      return;
    }
    case Op::kCopy:
      status(Copy(request, text));
      return;
    case Op::kMemset:
      status(Memset(request, text));
      return;
    case Op::kBarrier: {
      std::shared_ptr<Stream> stream = FindStream(a[0], text);
      if (!stream) return status(PH_ERROR_INVALID_HANDLE);
      Item item;
      item.kind = Item::Kind::kBarrier;
      status(Submit(*stream, std::move(item), true, text));
      return;
    }
    case Op::kEventCreate: {
      auto event = std::make_shared<Event>();
      event->session = session_;
      event->flags = static_cast<unsigned>(a[0]);
      std::lock_guard<std::mutex> lock(server.mutex);
      const uint64_t id = server.next_id++;
      server.events[id] = std::move(event);
      reply->a[0] = id;
      return;
    }
    case Op::kEventDestroy: {
      if (!FindEvent(a[0], text)) return status(PH_ERROR_INVALID_HANDLE);
      std::lock_guard<std::mutex> lock(server.mutex);
      server.events.erase(a[0]);
      return;
    }
    case Op::kEventRecord: {
      std::shared_ptr<Event> event = FindEvent(a[0], text);
      if (!event) return status(PH_ERROR_INVALID_HANDLE);
      std::shared_ptr<Stream> stream = FindStream(a[1], text);
      if (!stream) return status(PH_ERROR_INVALID_HANDLE);
      auto record = std::make_shared<Record>();
      Item item;
      item.kind = Item::Kind::kRecord;
      item.record = record;
      // Under the event's lock: concurrent records leave the latest queued.
      std::lock_guard<std::mutex> lock(event->mutex);
      const ph_status_t queued = stream->Enqueue(std::move(item), false, text);
      status(queued);
      if (queued == PH_SUCCESS) event->latest = std::move(record);
      return;
    }
    case Op::kEventQuery:
    case Op::kEventSynchronize: {
      std::shared_ptr<Event> event = FindEvent(a[0], text);
      if (!event) return status(PH_ERROR_INVALID_HANDLE);
      std::shared_ptr<Record> record;
      {
        std::lock_guard<std::mutex> lock(event->mutex);
        record = event->latest;
      }
      if (!record) return;
      ph_status_t failure = PH_SUCCESS;
      std::string origin;
      bool reached = record->Reached(&failure, &origin);
      if (static_cast<Op>(request.op) == Op::kEventQuery && !reached) {
        return status(PH_NOT_READY);
      }
      if (!reached) {
        if (request.caller_stream != 0 && request.caller_stream == record->stream) {
          *text = "ph_event_synchronize was called from work running on the "
                  "stream that recorded the event, which would wait for "
                  "itself forever";
          return status(PH_ERROR_INVALID_ARGUMENT);
        }
        record->WaitReached();
        record->Reached(&failure, &origin);
      }
      if (failure != PH_SUCCESS) *text = CarriedByEvent(*record, origin);
      status(failure);
      return;
    }
    case Op::kEventElapsed: {
      std::shared_ptr<Event> start = FindEvent(a[0], text);
      std::shared_ptr<Event> end = start ? FindEvent(a[1], text) : nullptr;
      if (!start || !end) return status(PH_ERROR_INVALID_HANDLE);
      if (((start->flags | end->flags) & PH_EVENT_DISABLE_TIMING) != 0) {
        *text = "ph_event_elapsed_time: an event was created with "
                "PH_EVENT_DISABLE_TIMING";
        return status(PH_ERROR_INVALID_ARGUMENT);
      }
      std::shared_ptr<Record> first;
      std::shared_ptr<Record> second;
      {
        std::lock_guard<std::mutex> lock(start->mutex);
        first = start->latest;
      }
      {
        std::lock_guard<std::mutex> lock(end->mutex);
        second = end->latest;
      }
      if (!first || !second) {
        *text = std::string("ph_event_elapsed_time: the ") +
                (!first ? "start" : "end") + " event was never recorded";
        return status(PH_ERROR_INVALID_ARGUMENT);
      }
      ph_status_t ignored = PH_SUCCESS;
      std::string origin;
      if (!first->Reached(&ignored, &origin) ||
          !second->Reached(&ignored, &origin)) {
        return status(PH_NOT_READY);
      }
      const float ms = std::chrono::duration<float, std::milli>(
                           second->time - first->time).count();
      uint32_t bits = 0;
      std::memcpy(&bits, &ms, sizeof bits);
      reply->a[0] = bits;
      return;
    }
    default:
      *text = std::string("the remote server does not know request ") +
              std::to_string(request.op) + " (" +
              OpName(static_cast<Op>(request.op)) + ")";
      status(PH_ERROR_INVALID_ARGUMENT);
      return;
  }
}

void EndSession(uint64_t session) {
  if (g_server->spawned) {
    // The one client is gone: nothing is left to serve.
    ::unlink(g_server->socket_path.c_str());
    const size_t slash = g_server->socket_path.rfind('/');
    if (slash != std::string::npos) {
      ::rmdir(g_server->socket_path.substr(0, slash).c_str());
    }
    ::_exit(0);
  }
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(g_server->mutex);
    for (auto it = g_server->streams.begin(); it != g_server->streams.end();) {
      if (it->second->session() == session) {
        streams.push_back(it->second);
        it = g_server->streams.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = g_server->events.begin(); it != g_server->events.end();) {
      it = it->second->session == session ? g_server->events.erase(it)
                                          : std::next(it);
    }
  }
  for (const auto& stream : streams) stream->Shutdown();
  for (const auto& device : g_server->devices) device->FreeSession(session);
  std::lock_guard<std::mutex> lock(g_server->mutex);
  for (const auto& [address, mapping] : g_server->pinned[session]) {
    ::munmap(mapping.address, mapping.size);
  }
  g_server->pinned.erase(session);
}

// The first message of a connection says what it is.
void ServeConnection(int fd) {
  Message hello;
  std::string text;
  if (!ReceiveMessage(fd, &hello, &text)) {
    ::close(fd);
    return;
  }
  Message reply;
  reply.op = static_cast<uint32_t>(Op::kReply);
  switch (static_cast<Op>(hello.op)) {
    case Op::kHelloSession: {
      const Config& config = g_server->config;
      std::string error = config.error;
      if (error.empty() && hello.a[0] != kProtocolVersion) {
        error = "the phantom remote server speaks protocol version " +
                std::to_string(kProtocolVersion) + " and the driver " +
                std::to_string(hello.a[0]) +
                ": use the server built with the driver";
      }
      uint64_t session = 0;
      if (error.empty()) {
        std::lock_guard<std::mutex> lock(g_server->mutex);
        session = g_server->next_id++;
      }
      reply.status = error.empty() ? PH_SUCCESS : PH_ERROR_NOT_INITIALIZED;
      reply.a[0] = session;
      reply.a[1] = static_cast<uint64_t>(config.device_count);
      reply.a[2] = config.device_memory;
      if (!SendMessage(fd, reply, error)) {
        ::close(fd);
        if (session != 0) EndSession(session);
        return;
      }
      // Nothing more comes on this connection: its end is the session's.
      while (ReceiveMessage(fd, &hello, &text)) {
      }
      ::close(fd);
      EndSession(session);
      return;
    }
    case Op::kHelloRequest: {
      if (!SendMessage(fd, reply)) {
        ::close(fd);
        return;
      }
      Connection(fd, hello.a[0]).Serve();
      return;
    }
    case Op::kHelloCallback: {
      std::shared_ptr<Stream> stream;
      {
        std::lock_guard<std::mutex> lock(g_server->mutex);
        auto found = g_server->streams.find(hello.a[1]);
        if (found != g_server->streams.end() &&
            found->second->session() == hello.a[0]) {
          stream = found->second;
        }
      }
      reply.status = stream ? PH_SUCCESS : PH_ERROR_INVALID_HANDLE;
      if (!stream) {
        SendMessage(fd, reply);
        ::close(fd);
        return;
      }
      // Attached before the answer: once the client hears it, it may launch
      // host work and destroy the stream at once, and the worker must find
      // the connection then (a destroy that found none would drop the
      // queued tasks unrun). A failed answer leaves a dead connection the
      // worker reports as a client that is gone.
      stream->AttachCallback(fd);
      SendMessage(fd, reply);
      return;
    }
    default:
      ::close(fd);
      return;
  }
}

void OnSignal(int) {
  if (g_server != nullptr) ::unlink(g_server->socket_path.c_str());
  ::_exit(0);
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "phantom_remote_server: %s\nusage: phantom_remote_server "
               "--socket PATH [--session-fd N]\n",
               why);
  return 2;
}

int Main(int argc, char** argv) {
  std::string socket_path;
  int session_fd = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--socket" && i + 1 < argc) {
      socket_path = argv[++i];
    } else if (arg == "--session-fd" && i + 1 < argc) {
      session_fd = std::atoi(argv[++i]);
    } else {
      return Usage(("unknown argument '" + arg + "'").c_str());
    }
  }
  if (socket_path.empty()) return Usage("--socket is required");
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGTERM, OnSignal);
  ::signal(SIGINT, OnSignal);

  g_server = new Server;  // leaked: threads may use it until _exit
  g_server->config = ReadConfig();
  g_server->socket_path = socket_path;
  g_server->spawned = session_fd >= 0;
  if (g_server->config.error.empty()) {
    for (int d = 0; d < g_server->config.device_count; ++d) {
      g_server->devices.push_back(std::make_unique<DeviceMemory>());
      g_server->devices.back()->Configure(d, g_server->config.device_memory);
    }
  }

  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (listener < 0 || socket_path.size() >= sizeof address.sun_path) {
    return Usage("cannot create the socket (is the path too long?)");
  }
  // Bound and listening under a temporary name, then renamed into place:
  // a client that finds the socket path never meets a socket that is not
  // listening yet (connect would fail with ECONNREFUSED).
  const std::string starting_path = socket_path + ".starting";
  if (starting_path.size() >= sizeof address.sun_path) {
    return Usage("cannot create the socket (is the path too long?)");
  }
  std::memcpy(address.sun_path, starting_path.c_str(), starting_path.size() + 1);
  ::unlink(starting_path.c_str());
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener, 64) != 0 ||
      ::rename(starting_path.c_str(), socket_path.c_str()) != 0) {
    ::unlink(starting_path.c_str());
    std::fprintf(stderr, "phantom_remote_server: cannot listen on '%s': %s\n",
                 socket_path.c_str(), std::strerror(errno));
    return 1;
  }
  if (session_fd >= 0) {
    ::fcntl(session_fd, F_SETFD, FD_CLOEXEC);
    std::thread(ServeConnection, session_fd).detach();
  }
  for (;;) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE ||
          errno == ENFILE) {
        continue;
      }
      std::fprintf(stderr, "phantom_remote_server: accept failed: %s\n",
                   std::strerror(errno));
      return 1;
    }
    std::thread(ServeConnection, fd).detach();
  }
}

}  // namespace
}  // namespace phantom::remote

int main(int argc, char** argv) { return phantom::remote::Main(argc, argv); }
