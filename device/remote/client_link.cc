// Starting the session, per-thread connections and the device-lost state;
// client_link.h has the design.
#include "client_link.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <phantom/common/settings.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "client_memory.h"
#include "host_access_message.h"

extern char** environ;

namespace phantom::remote {
namespace {

thread_local std::string t_last_error;
thread_local uint64_t t_current_stream = 0;
thread_local int t_current_device = -1;

constexpr size_t kStagingBytes = size_t{8} << 20;

struct State {
  std::mutex mutex;  // guards the start and the lost sentence
  bool attempted = false;
  std::atomic<bool> running{false};
  ph_status_t start_status = PH_SUCCESS;
  std::string start_error;
  SessionInfo info;
  uint64_t session = 0;
  std::string socket_path;
  std::string private_folder;  // ours to remove ("" if we did not spawn)
  pid_t server_pid = -1;       // ours to reap (-1 if we did not spawn)
  pid_t owner_pid = 0;
  int session_fd = -1;
  std::atomic<bool> lost{false};
  std::string lost_message;
};

State& GetState() {
  static State* const state = new State;  // leaked: used until exit
  return *state;
}

struct ThreadLink {
  int fd = -1;
  char* staging = nullptr;
  // A thread's last calls may come after this ran (the runtime frees
  // memory from static destructors at exit): they find no connection and
  // open a new one.
  ~ThreadLink() {
    if (fd >= 0) ::close(fd);
    if (staging != nullptr) ::munmap(staging, kStagingBytes);
    fd = -1;
    staging = nullptr;
  }
};
thread_local ThreadLink t_link;

// The folder this library was loaded from, with a trailing '/'.
std::string OwnFolder() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&OwnFolder), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash + 1);
}

// How the spawned server ended, waiting up to ~2 s for it to end; kills it
// if it is still running (it no longer answers).
std::string ReapServer(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      if (WIFSIGNALED(status)) {
        return "its server process (pid " + std::to_string(pid) +
               ") was killed by signal " + std::to_string(WTERMSIG(status)) +
               " (" + ::strsignal(WTERMSIG(status)) + ")";
      }
      return "its server process (pid " + std::to_string(pid) +
             ") exited with status " + std::to_string(WEXITSTATUS(status));
    }
    if (done < 0) {
      return "its server process (pid " + std::to_string(pid) +
             ") exited (its exit status is unknown)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return "its server process (pid " + std::to_string(pid) +
         ") stopped answering and was killed";
}

void RemovePrivateFolder(State& state) {
  if (state.private_folder.empty()) return;
  ::unlink(state.socket_path.c_str());
  ::rmdir(state.private_folder.c_str());
}

// The server program this driver would spawn, if it can be run; else
// empty, with `error` saying why.
std::string ServerToSpawn(std::string* error) {
  settings::Value server;
  if (!settings::ReadEnvironment(settings::kRemoteServer, &server, error)) {
    return "";
  }
  const std::string program =
      server.set ? server.text : OwnFolder() + "phantom_remote_server";
  if (::access(program.c_str(), X_OK) != 0) {
    *error = "the phantom remote driver cannot start its server '" + program +
             "' (" + std::strerror(errno) +
             "): build the phantom_remote_server target next to "
             "libphantom_remote.so, or set PHANTOM_REMOTE_SERVER to its path";
    return "";
  }
  return program;
}

// Spawns the server; on success fills state.session_fd and server_pid.
ph_status_t Spawn(State& state) {
  std::string error;
  const std::string program = ServerToSpawn(&error);
  if (program.empty()) return Fail(PH_ERROR_NOT_INITIALIZED, error);
  char folder[] = "/tmp/phantom-remote-XXXXXX";
  if (::mkdtemp(folder) == nullptr) {
    return Fail(PH_ERROR_NOT_INITIALIZED,
                std::string("the phantom remote driver cannot create a "
                            "private folder in /tmp: ") +
                    std::strerror(errno));
  }
  state.private_folder = folder;
  state.socket_path = state.private_folder + "/socket";
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return Fail(PH_ERROR_NOT_INITIALIZED,
                std::string("socketpair failed: ") + std::strerror(errno));
  }
  int child_end = pair[1];
  if (child_end == 3) {  // dup2(3, 3) would keep close-on-exec set
    child_end = ::fcntl(pair[1], F_DUPFD_CLOEXEC, 10);
    ::close(pair[1]);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_end, 3);
  // Nothing else of the program's: a socket it opened without
  // close-on-exec (Gloo's, a TCPStore's) would otherwise stay open in the
  // server, and a peer would not see the program close it.
  posix_spawn_file_actions_addclosefrom_np(&actions, 4);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  // Its own process group: a Ctrl-C meant for the program does not kill
  // the device under it.
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  std::string socket_path = state.socket_path;
  char* argv[] = {const_cast<char*>(program.c_str()),
                  const_cast<char*>("--socket"), &socket_path[0],
                  const_cast<char*>("--session-fd"), const_cast<char*>("3"),
                  nullptr};
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, program.c_str(), &actions,
                                    &attributes, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(child_end);
  if (spawned != 0) {
    ::close(pair[0]);
    RemovePrivateFolder(state);
    return Fail(PH_ERROR_NOT_INITIALIZED,
                "the phantom remote driver cannot start its server '" +
                    program + "': " + std::strerror(spawned));
  }
  state.server_pid = pid;
  state.session_fd = pair[0];
  return PH_SUCCESS;
}

ph_status_t StartLocked(State& state) {
  settings::Value socket;
  std::string error;
  if (!settings::ReadEnvironment(settings::kRemoteSocket, &socket, &error)) {
    return Fail(PH_ERROR_NOT_INITIALIZED, error);
  }
  if (socket.set) {
    state.socket_path = socket.text;
    state.session_fd = ConnectTo(state.socket_path, &error);
    if (state.session_fd < 0) {
      return Fail(PH_ERROR_NOT_INITIALIZED,
                  error + " (PHANTOM_REMOTE_SOCKET names it; start "
                          "phantom_remote_server --socket PATH first, or "
                          "unset it to let the driver start its own)");
    }
  } else {
    const ph_status_t spawned = Spawn(state);
    if (spawned != PH_SUCCESS) return spawned;
  }
  Message hello;
  hello.op = static_cast<uint32_t>(Op::kHelloSession);
  hello.a[0] = kProtocolVersion;
  Message reply;
  std::string text;
  if (!SendMessage(state.session_fd, hello) ||
      !ReceiveMessage(state.session_fd, &reply, &text)) {
    ::close(state.session_fd);
    state.session_fd = -1;
    std::string how = "the server closed the connection";
    if (state.server_pid > 0) how = ReapServer(state.server_pid);
    RemovePrivateFolder(state);
    return Fail(PH_ERROR_NOT_INITIALIZED,
                "the phantom remote server did not start: " + how);
  }
  if (reply.status != PH_SUCCESS) {
    ::close(state.session_fd);  // a spawned server exits with it
    state.session_fd = -1;
    if (state.server_pid > 0) ReapServer(state.server_pid);
    RemovePrivateFolder(state);
    return Fail(PH_ERROR_NOT_INITIALIZED, text);
  }
  state.session = reply.a[0];
  state.info.device_count = static_cast<int>(reply.a[1]);
  state.info.device_memory = reply.a[2];
  if (!ReserveDeviceRanges(state.info.device_count, state.info.device_memory,
                           &error)) {
    return Fail(PH_ERROR_NOT_INITIALIZED, error);
  }
  InstallHostAccessMessage();
  state.owner_pid = ::getpid();
  return PH_SUCCESS;
}

ph_status_t ForkedChild() {
  return Fail(PH_ERROR_DEVICE,
              "the phantom remote device cannot be used in a process forked "
              "from the one that started it: use the 'spawn' start method, "
              "or start the device only in the child");
}

}  // namespace

ph_status_t Fail(ph_status_t status, std::string message) {
  try {
    t_last_error = std::move(message);
  } catch (...) {
  }
  return status;
}

const char* LastErrorMessage() { return t_last_error.c_str(); }

ph_status_t Start() {
  State& state = GetState();
  if (state.lost.load(std::memory_order_acquire)) return LostError();
  if (state.running.load(std::memory_order_acquire)) {
    return state.owner_pid == ::getpid() ? PH_SUCCESS : ForkedChild();
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.attempted) {
    state.attempted = true;
    state.start_status = StartLocked(state);
    if (state.start_status == PH_SUCCESS) {
      state.running.store(true, std::memory_order_release);
    } else {
      state.start_error = t_last_error;
    }
  }
  if (state.start_status != PH_SUCCESS) {
    return Fail(state.start_status, state.start_error);
  }
  return PH_SUCCESS;
}

const SessionInfo& Info() { return GetState().info; }

ph_status_t DeviceCount(int* out_count) {
  State& state = GetState();
  if (!state.running.load(std::memory_order_acquire) &&
      !state.lost.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(state.mutex);
    settings::Value socket;
    settings::Value count;
    settings::Value memory;
    std::string error;
    if (!state.attempted &&
        settings::ReadEnvironment(settings::kRemoteSocket, &socket, &error) &&
        !socket.set && !ServerToSpawn(&error).empty() &&
        settings::ReadEnvironment(settings::kDeviceCount, &count, &error) &&
        settings::ReadEnvironment(settings::kDeviceMemory, &memory, &error)) {
      *out_count = static_cast<int>(count.number);
      return PH_SUCCESS;
    }
  }
  const ph_status_t started = Start();
  if (started != PH_SUCCESS) return started;
  *out_count = Info().device_count;
  return PH_SUCCESS;
}

bool Lost() { return GetState().lost.load(std::memory_order_acquire); }

ph_status_t LostError() {
  State& state = GetState();
  return Fail(PH_ERROR_DEVICE, state.lost_message);
}

void MarkLost() {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.lost.load(std::memory_order_acquire)) return;
  std::string how;
  if (state.server_pid > 0) {
    how = ReapServer(state.server_pid);
  } else {
    how = "the server at '" + state.socket_path + "' closed the connection";
  }
  state.lost_message =
      "the phantom remote device was lost: " + how +
      "; every call now fails with PH_ERROR_DEVICE: restart the process to "
      "use the device again";
  RemovePrivateFolder(state);
  state.lost.store(true, std::memory_order_release);
}

int OpenConnection(Op hello_op, uint64_t argument) {
  State& state = GetState();
  std::string error;
  const int fd = ConnectTo(state.socket_path, &error);
  if (fd < 0) {
    MarkLost();
    LostError();
    return -1;
  }
  Message hello;
  hello.op = static_cast<uint32_t>(hello_op);
  hello.a[0] = state.session;
  hello.a[1] = argument;
  Message reply;
  std::string text;
  if (!SendMessage(fd, hello) || !ReceiveMessage(fd, &reply, &text)) {
    ::close(fd);
    MarkLost();
    LostError();
    return -1;
  }
  if (reply.status != PH_SUCCESS) {
    ::close(fd);
    Fail(static_cast<ph_status_t>(reply.status), text);
    return -1;
  }
  return fd;
}

ph_status_t Call(Op op, Message request, Message* reply,
                 std::string* reply_text, int fd) {
  if (Lost()) return LostError();
  if (t_link.fd < 0) {
    t_link.fd = OpenConnection(Op::kHelloRequest, 0);
    if (t_link.fd < 0) return Lost() ? LostError() : PH_ERROR_DEVICE;
  }
  request.op = static_cast<uint32_t>(op);
  request.caller_stream = t_current_stream;
  Message answer;
  std::string text;
  if (!SendMessage(t_link.fd, request, "", fd) ||
      !ReceiveMessage(t_link.fd, &answer, &text)) {
    ::close(t_link.fd);
    t_link.fd = -1;
    MarkLost();
    return LostError();
  }
  if (reply != nullptr) *reply = answer;
  if (reply_text != nullptr) *reply_text = text;
  const ph_status_t status = static_cast<ph_status_t>(answer.status);
  if (status != PH_SUCCESS && status != PH_NOT_READY) {
    return Fail(status, std::move(text));
  }
  return status;
}

char* Staging(size_t* out_size) {
  *out_size = kStagingBytes;
  if (t_link.staging != nullptr) return t_link.staging;
  const int fd = ::memfd_create("phantom-remote-staging", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, kStagingBytes) != 0) {
    if (fd >= 0) ::close(fd);
    Fail(PH_ERROR_OUT_OF_MEMORY,
         std::string("cannot create the staging block for a copy: ") +
             std::strerror(errno));
    return nullptr;
  }
  void* address = ::mmap(nullptr, kStagingBytes, PROT_READ | PROT_WRITE,
                         MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    ::close(fd);
    Fail(PH_ERROR_OUT_OF_MEMORY, "cannot map the staging block for a copy");
    return nullptr;
  }
  Message request;
  request.a[0] = kStagingBytes;
  const ph_status_t attached = Call(Op::kStagingAttach, request, nullptr,
                                    nullptr, fd);
  ::close(fd);
  if (attached != PH_SUCCESS) {
    ::munmap(address, kStagingBytes);
    return nullptr;
  }
  t_link.staging = static_cast<char*>(address);
  return t_link.staging;
}

uint64_t CurrentStream() { return t_current_stream; }
int CurrentStreamDevice() { return t_current_device; }
void SetCurrentStream(uint64_t stream, int device) {
  t_current_stream = stream;
  t_current_device = device;
}

}  // namespace phantom::remote
