// The remote driver (device/remote, docs/remote-driver.md): what it
// promises beyond the conformance suite (tests/hal), which it passes too.
//
//  - the server is a child process started on first use, and none is left
//    behind when the client exits, normally or killed; a server that
//    cannot be started or reached is a driver that could not start
//    (PH_ERROR_NOT_INITIALIZED naming the setting); a server shared through
//    PHANTOM_REMOTE_SOCKET frees what each client leaves behind; a forked
//    child of a client is refused and the client goes on, while counting
//    devices starts nothing, so a child forked after it uses the device;
//  - device memory is never host-addressable here: pointer attributes say
//    DEVICE, there is no kernel view, the bytes at a device address
//    cannot be read by this process, and host code that touches them dies
//    with a sentence saying so;
//  - copies round-trip in all four kinds, pageable (staged) and pinned
//    (shared memory), larger than the staging block;
//  - streams keep order across each other through events, and host work
//    (run by this process) keeps its place in stream order;
//  - out of memory is PH_ERROR_OUT_OF_MEMORY and the device goes on;
//  - device lost: when the server is killed, a synchronize waiting on
//    queued work (and an event synchronize) wakes, and every call returns
//    PH_ERROR_DEVICE saying the device was lost and how the server ended.
//
// The tests that kill or leave servers run in child processes (death
// tests, or this binary re-run with --child), since a lost device is
// lost for the whole process.
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "phantom/hal.h"

extern char** environ;

namespace {

using std::chrono::milliseconds;

#define ASSERT_PH_OK(expr)                                               \
  do {                                                                   \
    const ph_status_t status_ = (expr);                                  \
    ASSERT_EQ(status_, PH_SUCCESS)                                       \
        << ph_status_name(status_) << ": " << ph_last_error_message();   \
  } while (0)

std::string g_self;  // this program, for the --child runs

// Pids of this process's children running phantom_remote_server.
std::vector<pid_t> ServerChildren(pid_t parent) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t open = line.find('(');
    const size_t close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string comm = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && comm.rfind("phantom_remote", 0) == 0) {
      found.push_back(pid);
    }
  }
  ::closedir(proc);
  return found;
}

// Whether `pid` is still a live process (a zombie counts as gone).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() &&
         line[close + 2] != 'Z';
}

bool GoneWithin(pid_t pid, milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (Alive(pid)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

// Whether this process can read `size` bytes at `ptr` (write(2) to a
// pipe reports EFAULT instead of faulting).
bool Readable(const void* ptr, size_t size) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return true;
  const ssize_t written = ::write(pipe_fds[1], ptr, size);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  return written == static_cast<ssize_t>(size);
}

struct Task {
  std::function<ph_status_t()> body;
};

ph_status_t RunTask(void* data, char* error, size_t size) {
  const ph_status_t status = static_cast<Task*>(data)->body();
  if (status != PH_SUCCESS) std::snprintf(error, size, "the task failed");
  return status;
}

void ReleaseTask(void* data) { delete static_cast<Task*>(data); }

ph_status_t Launch(ph_stream_t stream, std::function<ph_status_t()> body) {
  const ph_host_task_t task{"remote_test_task", RunTask, ReleaseTask,
                            new Task{std::move(body)}};
  return ph_launch_host_func(stream, &task);
}

// Runs `body` in this binary re-run by a threadsafe death test: a fresh
// process, in which no earlier test of this binary has started the device.
// `success` is what it prints when `body` returns true.
void ExpectInAFreshProcess(bool (*body)(), const char* success) {
  EXPECT_EXIT(
      {
        const bool ok = body();
        std::fprintf(stderr, "%s\n", ok ? success : "failed");
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), success);
}

// Counting devices answers from the setting the server will read, without
// starting it (as CUDA counts devices without creating a context); the
// first call that uses a device starts it. Run in a fresh process
// (ExpectInAFreshProcess).
bool CountingStartsNothingAndFirstUseStartsOneServer() {
  int count = 0;
  if (ph_device_count(&count) != PH_SUCCESS || count != 2) return false;
  if (!ServerChildren(::getpid()).empty()) {
    std::fprintf(stderr, "counting devices started the server\n");
    return false;
  }
  size_t free_bytes = 0;
  size_t total = 0;
  if (ph_mem_get_info(1, &free_bytes, &total) != PH_SUCCESS) return false;
  const std::vector<pid_t> servers = ServerChildren(::getpid());
  if (servers.size() != 1 || !Alive(servers[0])) {
    std::fprintf(stderr, "not one live server started by this process\n");
    return false;
  }
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  return ph_device_get_properties(1, &props) == PH_SUCCESS &&
         std::strcmp(props.name, "Phantom remote accelerator") == 0 &&
         props.total_memory == size_t{64} << 20;
}

TEST(RemoteServer, StartsOnFirstUseAsAChildProcess) {
  ExpectInAFreshProcess(CountingStartsNothingAndFirstUseStartsOneServer,
                        "started on first use");
}

TEST(RemoteMemory, DeviceMemoryIsNeverHostAddressable) {
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 4096, &device));
  ph_pointer_attributes_t attributes;
  ASSERT_PH_OK(ph_pointer_get_attributes(device, &attributes));
  EXPECT_EQ(attributes.type, PH_MEMORY_DEVICE);
  EXPECT_EQ(attributes.base, device);
  std::vector<char> ones(4096, 1);
  ASSERT_PH_OK(ph_memcpy(device, ones.data(), 4096, PH_MEMCPY_HOST_TO_DEVICE));
  EXPECT_FALSE(Readable(device, 1)) << "device memory is mapped in the client";
  void* view = reinterpret_cast<void*>(1);
  EXPECT_EQ(ph_kernel_address(device, &view), PH_ERROR_UNIMPLEMENTED);
  EXPECT_EQ(view, nullptr);
  const ph_driver_table_t* table = ph_driver_get_table(PH_HAL_ABI_VERSION);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->kernel_address, nullptr) << "the table offers no kernel view";
  EXPECT_NE(table->run_host_func, nullptr);
  ASSERT_PH_OK(ph_free(device));
}

TEST(RemoteMemory, HostCodeTouchingDeviceMemoryDiesSayingSo) {
  void* device = nullptr;
  ASSERT_PH_OK(ph_malloc(1, 4096, &device));
  EXPECT_EXIT(
      { (void)*static_cast<volatile const char*>(device); },
      ::testing::KilledBySignal(SIGSEGV),
      "host code touched device memory at 0x[0-9a-f]+ \\(phantom device 1, "
      ".*copy the tensor to the host first");
  ASSERT_PH_OK(ph_free(device));
}

TEST(RemoteCopies, RoundTripInAllFourKindsPageableAndPinned) {
  // Larger than the 8 MiB staging block, odd-sized.
  const size_t size = (size_t{9} << 20) + 77;
  std::vector<char> source(size);
  for (size_t i = 0; i < size; ++i) source[i] = static_cast<char>(i * 31 + 7);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_PH_OK(ph_malloc(0, size, &a));
  ASSERT_PH_OK(ph_malloc(1, size, &b));
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  // Pageable: H2D, D2D across devices, D2H, H2H.
  ASSERT_PH_OK(ph_memcpy(a, source.data(), size, PH_MEMCPY_HOST_TO_DEVICE));
  ASSERT_PH_OK(ph_memcpy_async(b, a, size, PH_MEMCPY_DEVICE_TO_DEVICE, stream));
  std::vector<char> back(size, 0);
  ASSERT_PH_OK(ph_memcpy_async(back.data(), b, size, PH_MEMCPY_DEVICE_TO_HOST,
                               stream));
  EXPECT_TRUE(back == source) << "pageable copies, staged";
  std::vector<char> host(size, 0);
  ASSERT_PH_OK(ph_memcpy(host.data(), back.data(), size, PH_MEMCPY_HOST_TO_HOST));
  EXPECT_TRUE(host == source);
  // Pinned: the server reads and writes this process's shared block.
  void* pinned = nullptr;
  ASSERT_PH_OK(ph_host_malloc(size, &pinned));
  ph_pointer_attributes_t attributes;
  ASSERT_PH_OK(ph_pointer_get_attributes(pinned, &attributes));
  EXPECT_EQ(attributes.type, PH_MEMORY_HOST_PINNED);
  ASSERT_PH_OK(ph_memset_async(a, 0, size, stream));
  std::memcpy(pinned, source.data(), size);
  ASSERT_PH_OK(ph_memcpy_async(a, pinned, size, PH_MEMCPY_HOST_TO_DEVICE, stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  std::memset(pinned, 0, size);
  ASSERT_PH_OK(ph_memcpy_async(pinned, a, size, PH_MEMCPY_DEVICE_TO_HOST, stream));
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  EXPECT_EQ(std::memcmp(pinned, source.data(), size), 0) << "pinned copies";
  ASSERT_PH_OK(ph_host_free(pinned));
  ASSERT_PH_OK(ph_stream_destroy(stream));
  ASSERT_PH_OK(ph_free(a));
  ASSERT_PH_OK(ph_free(b));
}

// B's copy waits, through an event, for A's fill, which waits for a host
// task this test holds; the bytes B copies are A's.
TEST(RemoteStreams, EventsOrderWorkAcrossTwoStreams) {
  ph_stream_t a = nullptr;
  ph_stream_t b = nullptr;
  ph_event_t filled = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &a));
  ASSERT_PH_OK(ph_stream_create(1, 0, &b));
  ASSERT_PH_OK(ph_event_create(PH_EVENT_DEFAULT, &filled));
  void* on0 = nullptr;
  void* on1 = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 4096, &on0));
  ASSERT_PH_OK(ph_malloc(1, 4096, &on1));
  ASSERT_PH_OK(ph_memset_async(on0, 1, 4096, a));
  std::atomic<bool> open{false};
  ASSERT_PH_OK(Launch(a, [&] {
    while (!open) std::this_thread::sleep_for(milliseconds(1));
    return PH_SUCCESS;
  }));
  ASSERT_PH_OK(ph_memset_async(on0, 0x42, 4096, a));
  ASSERT_PH_OK(ph_event_record(filled, a));
  ASSERT_PH_OK(ph_stream_wait_event(b, filled));
  ASSERT_PH_OK(ph_memcpy_async(on1, on0, 4096, PH_MEMCPY_DEVICE_TO_DEVICE, b));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(ph_stream_query(b), PH_NOT_READY) << "B ran ahead of A's event";
  EXPECT_EQ(ph_event_query(filled), PH_NOT_READY);
  open = true;
  ASSERT_PH_OK(ph_stream_synchronize(b));
  char byte = 0;
  ASSERT_PH_OK(ph_memcpy(&byte, static_cast<char*>(on1) + 4095, 1,
                         PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(byte, 0x42);
  ASSERT_PH_OK(ph_event_query(filled));
  ASSERT_PH_OK(ph_event_destroy(filled));
  ASSERT_PH_OK(ph_stream_destroy(a));
  ASSERT_PH_OK(ph_stream_destroy(b));
  ASSERT_PH_OK(ph_free(on0));
  ASSERT_PH_OK(ph_free(on1));
}

// Host tasks run in this process, between the server's copies of the same
// stream: each sees exactly the copies queued before it.
TEST(RemoteStreams, HostWorkKeepsItsPlaceInStreamOrder) {
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  void* device = nullptr;
  void* pinned = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 64, &device));
  ASSERT_PH_OK(ph_host_malloc(64, &pinned));
  auto* bytes = static_cast<volatile char*>(pinned);
  std::vector<int> seen;
  for (int round = 1; round <= 20; ++round) {
    ASSERT_PH_OK(ph_memset_async(device, round, 64, stream));
    ASSERT_PH_OK(ph_memcpy_async(pinned, device, 64, PH_MEMCPY_DEVICE_TO_HOST,
                                 stream));
    ASSERT_PH_OK(Launch(stream, [&seen, bytes] {
      seen.push_back(bytes[63]);
      return PH_SUCCESS;
    }));
  }
  ASSERT_PH_OK(ph_stream_synchronize(stream));
  ASSERT_EQ(seen.size(), 20u);
  for (int round = 1; round <= 20; ++round) EXPECT_EQ(seen[round - 1], round);
  // ph_run_host_func returns once its task ran, after earlier work.
  bool ran = false;
  const ph_host_task_t task{"run_now", RunTask, ReleaseTask, new Task{[&] {
                              ran = bytes[0] == 20;
                              return PH_SUCCESS;
                            }}};
  ASSERT_PH_OK(ph_run_host_func(stream, &task));
  EXPECT_TRUE(ran);
  ASSERT_PH_OK(ph_stream_destroy(stream));
  ASSERT_PH_OK(ph_host_free(pinned));
  ASSERT_PH_OK(ph_free(device));
}

TEST(RemoteMemory, OutOfMemoryIsReportedAndTheDeviceGoesOn) {
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_PH_OK(ph_mem_get_info(0, &free_bytes, &total));
  void* ptr = reinterpret_cast<void*>(1);
  EXPECT_EQ(ph_malloc(0, total + 1, &ptr), PH_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_NE(std::string(ph_last_error_message()).find("out of memory"),
            std::string::npos)
      << ph_last_error_message();
  void* half = nullptr;
  ASSERT_PH_OK(ph_malloc(0, total / 2, &half));
  ASSERT_PH_OK(ph_memcpy(half, "x", 1, PH_MEMCPY_HOST_TO_DEVICE));
  ASSERT_PH_OK(ph_free(half));
  size_t after = 0;
  ASSERT_PH_OK(ph_mem_get_info(0, &after, &total));
  EXPECT_EQ(after, free_bytes);
}

// A process forked from one that started the device shares its
// connections; it must not use them (the parent's replies would be read by
// the child). Its calls refuse, saying why, and the parent goes on.
TEST(RemoteStartUp, AForkedChildIsRefusedAndTheParentGoesOn) {
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_PH_OK(ph_mem_get_info(0, &free_bytes, &total));  // starts it
  const pid_t child = ::fork();
  if (child == 0) {
    void* ptr = nullptr;
    const bool refused =
        ph_malloc(0, 16, &ptr) == PH_ERROR_DEVICE &&
        std::strstr(ph_last_error_message(), "forked") != nullptr;
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  void* ptr = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 16, &ptr));
  ASSERT_PH_OK(ph_free(ptr));
}

// A process that only counted devices has not started one: a child forked
// then starts its own server and uses the device, and so does the parent.
// The parent is a fresh process (ExpectInAFreshProcess).
bool ForkedChildAndParentUseTheDevice() {
  int count = 0;
  if (ph_device_count(&count) != PH_SUCCESS || count != 2) return false;
  const pid_t child = ::fork();
  if (child == 0) {
    void* ptr = nullptr;
    const bool used = ph_malloc(1, 16, &ptr) == PH_SUCCESS &&
                      ph_free(ptr) == PH_SUCCESS &&
                      ServerChildren(::getpid()).size() == 1;
    ::_exit(used ? 0 : 1);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child ||
      !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::fprintf(stderr, "the child could not use the device\n");
    return false;
  }
  void* ptr = nullptr;
  return ph_malloc(0, 16, &ptr) == PH_SUCCESS && ph_free(ptr) == PH_SUCCESS &&
         ServerChildren(::getpid()).size() == 1;
}

TEST(RemoteStartUp, AChildForkedAfterCountingDevicesUsesTheDevice) {
  ExpectInAFreshProcess(ForkedChildAndParentUseTheDevice, "both used it");
}

// Every call the runtime makes, after the device was lost: the device
// error, with the lost sentence.
bool EveryCallSaysLost(ph_stream_t stream, void* device) {
  auto lost = [](ph_status_t status) {
    return status == PH_ERROR_DEVICE &&
           std::strstr(ph_last_error_message(), "device was lost") != nullptr;
  };
  int count = 0;
  void* ptr = nullptr;
  char byte = 0;
  ph_stream_t other = nullptr;
  ph_event_t event = nullptr;
  size_t free_bytes = 0;
  size_t total = 0;
  const ph_host_task_t task{"after_loss", RunTask, ReleaseTask,
                            new Task{[] { return PH_SUCCESS; }}};
  return lost(ph_device_count(&count)) && lost(ph_malloc(0, 16, &ptr)) &&
         lost(ph_mem_get_info(0, &free_bytes, &total)) &&
         lost(ph_memcpy(&byte, device, 1, PH_MEMCPY_DEVICE_TO_HOST)) &&
         lost(ph_stream_create(0, 0, &other)) &&
         lost(ph_event_create(0, &event)) && lost(ph_stream_query(stream)) &&
         lost(ph_stream_synchronize(stream)) &&
         lost(ph_launch_host_func(stream, &task)) &&
         lost(ph_device_synchronize(0));
}

TEST(RemoteDeviceLost, KillingTheServerFailsEveryCallAndWakesWaiters) {
  EXPECT_EXIT(
      {
        ph_stream_t stream = nullptr;
        void* device = nullptr;
        bool ok = ph_stream_create(0, 0, &stream) == PH_SUCCESS &&
                  ph_malloc(0, 64, &device) == PH_SUCCESS;
        const std::vector<pid_t> servers = ServerChildren(::getpid());
        ok = ok && servers.size() == 1;
        // Queued work the synchronize below waits for: a task that holds
        // the stream until the test lets it go.
        std::atomic<bool> release{false};
        ok = ok && Launch(stream, [&] {
                     while (!release) std::this_thread::sleep_for(milliseconds(1));
                     return PH_SUCCESS;
                   }) == PH_SUCCESS;
        ph_event_t after = nullptr;
        ok = ok && ph_event_create(0, &after) == PH_SUCCESS &&
             ph_event_record(after, stream) == PH_SUCCESS;
        // A second waiter, on an event behind the same work.
        ph_status_t event_waited = PH_SUCCESS;
        std::thread event_waiter(
            [&] { event_waited = ph_event_synchronize(after); });
        std::thread killer([&] {
          std::this_thread::sleep_for(milliseconds(100));
          if (!servers.empty()) ::kill(servers[0], SIGKILL);
        });
        const ph_status_t waited = ph_stream_synchronize(stream);
        const std::string message = ph_last_error_message();
        event_waiter.join();
        release = true;
        killer.join();
        ok = ok && event_waited == PH_ERROR_DEVICE;
        std::fprintf(stderr, "%s\n", message.c_str());
        ok = ok && waited == PH_ERROR_DEVICE &&
             message.find("killed by signal 9") != std::string::npos &&
             EveryCallSaysLost(stream, device);
        // Destroying the stream of a lost device reports the loss and still
        // frees the client's half (its callback thread: ThreadSanitizer's
        // leak check fails the child otherwise).
        ok = ok && ph_stream_destroy(stream) == PH_ERROR_DEVICE;
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "device was lost: its server process");
}

// A server that cannot be started or reached is a driver that could not
// start: PH_ERROR_NOT_INITIALIZED, with a sentence naming the setting.
TEST(RemoteStartUp, AServerThatCannotStartIsNotInitialized) {
  EXPECT_EXIT(
      {
        setenv("PHANTOM_REMOTE_SERVER", "/nonexistent/phantom_remote_server", 1);
        int count = 7;
        void* ptr = nullptr;
        const bool ok = ph_device_count(&count) == PH_ERROR_NOT_INITIALIZED &&
                        count == 0 &&
                        ph_malloc(0, 16, &ptr) == PH_ERROR_NOT_INITIALIZED;
        std::fprintf(stderr, "%s\n", ph_last_error_message());
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "cannot start its server '/nonexistent/phantom_remote_server'.*"
      "PHANTOM_REMOTE_SERVER");
  EXPECT_EXIT(
      {
        setenv("PHANTOM_REMOTE_SOCKET", "/nonexistent/socket", 1);
        int count = 7;
        const bool ok = ph_device_count(&count) == PH_ERROR_NOT_INITIALIZED;
        std::fprintf(stderr, "%s\n", ph_last_error_message());
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "cannot connect to the phantom remote server at '/nonexistent/socket'"
      ".*PHANTOM_REMOTE_SOCKET");
}

// This binary, re-run as `--child exit|kill|shared`. exit, kill: starts
// the device, prints the server's pid, then exits or is killed. shared:
// checks the shared server's device 0 is whole (or becomes whole within
// 10 s: the server frees what the previous client left when it sees that
// client's connection close, on that connection's thread, which may run
// after this client connected), then leaves half of it allocated and a
// stream with work on it.
int ChildMain(const std::string& how) {
  if (how == "shared") {
    size_t free_bytes = 0;
    size_t total = 0;
    void* leaked = nullptr;
    ph_stream_t stream = nullptr;
    bool whole = false;
    for (int i = 0; i < 1000 && !whole; ++i) {
      if (i > 0) std::this_thread::sleep_for(milliseconds(10));
      whole = ph_mem_get_info(0, &free_bytes, &total) == PH_SUCCESS &&
              free_bytes == total;
    }
    const bool ok = whole &&
                    ph_malloc(0, total / 2, &leaked) == PH_SUCCESS &&
                    ph_stream_create(0, 0, &stream) == PH_SUCCESS &&
                    ph_memset_async(leaked, 1, 4096, stream) == PH_SUCCESS &&
                    ServerChildren(::getpid()).empty();  // not ours: shared
    std::printf("0\n");
    return ok ? 0 : 1;
  }
  size_t free_bytes = 0;
  size_t total = 0;
  if (ph_mem_get_info(0, &free_bytes, &total) != PH_SUCCESS) return 2;
  const std::vector<pid_t> servers = ServerChildren(::getpid());
  if (servers.size() != 1) return 3;
  std::printf("%d\n", static_cast<int>(servers[0]));
  std::fflush(stdout);
  if (how == "kill") ::raise(SIGKILL);
  return 0;
}

// Runs `--child how`; returns the server pid it printed (or -1).
pid_t RunChild(const char* how, int* out_status) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  char* argv[] = {&g_self[0], const_cast<char*>("--child"),
                  const_cast<char*>(how), nullptr};
  pid_t child = -1;
  const int spawned =
      ::posix_spawn(&child, g_self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  std::string out;
  char buffer[64];
  ssize_t got;
  while ((got = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) {
    out.append(buffer, static_cast<size_t>(got));
  }
  ::close(pipe_fds[0]);
  if (spawned != 0) return -1;
  ::waitpid(child, out_status, 0);
  return out.empty() ? -1 : static_cast<pid_t>(std::atoi(out.c_str()));
}

TEST(RemoteServer, NoServerOutlivesAClientThatExits) {
  int status = 0;
  const pid_t server = RunChild("exit", &status);
  ASSERT_GT(server, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(GoneWithin(server, milliseconds(10000)))
      << "server " << server << " outlived its client";
}

TEST(RemoteServer, NoServerOutlivesAClientThatIsKilled) {
  int status = 0;
  const pid_t server = RunChild("kill", &status);
  ASSERT_GT(server, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(GoneWithin(server, milliseconds(10000)))
      << "server " << server << " outlived its killed client";
}

// The server next to the driver library this program linked.
std::string ServerProgram() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&ph_driver_get_table), &info) == 0) {
    return "";
  }
  const std::string library = info.dli_fname;
  return library.substr(0, library.rfind('/') + 1) + "phantom_remote_server";
}

// A server started by hand serves clients one after the other
// (PHANTOM_REMOTE_SOCKET); what a client left behind is freed when it goes.
TEST(RemoteServer, ASharedServerFreesWhatEachClientLeaves) {
  const std::string socket_path =
      "/tmp/phantom-remote-test-" + std::to_string(::getpid()) + ".sock";
  std::string program = ServerProgram();
  char* argv[] = {&program[0], const_cast<char*>("--socket"),
                  const_cast<char*>(socket_path.c_str()), nullptr};
  pid_t server = -1;
  ASSERT_EQ(::posix_spawn(&server, program.c_str(), nullptr, nullptr, argv,
                          environ),
            0);
  for (int i = 0; i < 500 && ::access(socket_path.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  setenv("PHANTOM_REMOTE_SOCKET", socket_path.c_str(), 1);
  for (int client = 0; client < 2; ++client) {
    int status = 0;
    RunChild("shared", &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "client " << client << " found the device used, or failed";
  }
  unsetenv("PHANTOM_REMOTE_SOCKET");
  EXPECT_TRUE(Alive(server)) << "the shared server outlives its clients";
  ::kill(server, SIGTERM);
  int status = 0;
  ::waitpid(server, &status, 0);
  EXPECT_NE(::access(socket_path.c_str(), F_OK), 0) << "socket left behind";
}

}  // namespace

int main(int argc, char** argv) {
  setenv("PHANTOM_DEVICE_COUNT", "2", 0);
  setenv("PHANTOM_DEVICE_MEMORY", "64MiB", 0);
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof self - 1);
  g_self = length > 0 ? std::string(self, static_cast<size_t>(length)) : argv[0];
  if (argc == 3 && std::string(argv[1]) == "--child") return ChildMain(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
