// HAL conformance for the OPTIONAL "Interprocess sharing" section of
// phantom/hal.h, written against the header alone like the rest of the
// suite (hal_test_support.h: the driver is loaded at run time). Sharing needs two processes: a test re-executes
// this binary as a child (PHANTOM_HAL_IPC_CHILD names the part it plays)
// and talks to it over a pipe, one line per step, handles in hex. Every
// wait for the child is bounded, so a driver that hangs fails the test
// instead of hanging it.
//
// A driver without kIpcMemory or kIpcEvent (NULL members, or
// PH_ERROR_UNIMPLEMENTED) skips the memory or event tests naming it, and must then refuse every call
// of the part it lacks (AllOrNothing). ctest also runs the suite on the fake
// with its test-only switch PHANTOM_FAKE_NO_IPC=1, as such a driver.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hal_test_expectations.h"
#include "hal_test_support.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;


constexpr auto kChildTimeout = std::chrono::seconds(30);

std::string Hex(const unsigned char* bytes, size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < size; ++i) {
    text += digits[bytes[i] >> 4];
    text += digits[bytes[i] & 15];
  }
  return text;
}

bool Unhex(const std::string& text, unsigned char* bytes, size_t size) {
  if (text.size() != 2 * size) return false;
  auto value = [](char c) {
    return c <= '9' ? c - '0' : c - 'a' + 10;
  };
  for (size_t i = 0; i < size; ++i) {
    bytes[i] = static_cast<unsigned char>(value(text[2 * i]) * 16 +
                                          value(text[2 * i + 1]));
  }
  return true;
}

std::vector<unsigned char> Pattern(size_t size, int seed) {
  std::vector<unsigned char> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<unsigned char>(i * 13 + seed);
  return data;
}

// Host work for a stream.
struct Closure {
  std::function<ph_status_t(char*, size_t)> body;
};
ph_status_t RunClosure(void* data, char* error, size_t size) {
  return static_cast<Closure*>(data)->body(error, size);
}
void ReleaseClosure(void* data) { delete static_cast<Closure*>(data); }
ph_status_t Launch(ph_stream_t stream, const char* name,
                   std::function<ph_status_t(char*, size_t)> body) {
  const ph_host_task_t task{name, RunClosure, ReleaseClosure,
                            new Closure{std::move(body)}};
  return ph_launch_host_func(stream, &task);
}

// Work that keeps a stream busy until Open().
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  ph_status_t Block(ph_stream_t stream) {
    return Launch(stream, "gate", [this](char*, size_t) {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return open_; });
      return PH_SUCCESS;
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

// This binary, re-executed as the other process, with a line protocol on
// its stdin/stdout. Killed at destruction if still running.
class Child {
 public:
  Child(const std::string& part, const std::vector<std::string>& extra_env = {}) {
    int to_child[2];
    int from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe: " << std::strerror(errno);
      return;
    }
    std::vector<std::string> env_storage;
    for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
    env_storage.push_back("PHANTOM_HAL_IPC_CHILD=" + part);
    for (const auto& e : extra_env) env_storage.push_back(e);
    std::vector<char*> env;
    for (auto& e : env_storage) env.push_back(e.data());
    env.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    if (posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, argv,
                    env.data()) != 0) {
      ADD_FAILURE() << "posix_spawn failed";
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    to_ = to_child[1];
    from_ = from_child[0];
  }
  ~Child() {
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void Send(const std::string& line) {
    const std::string text = line + "\n";
    ASSERT_EQ(write(to_, text.data(), text.size()),
              static_cast<ssize_t>(text.size()));
  }

  // The next line, or "" on timeout or end of output (then a failure).
  std::string Receive() {
    const auto deadline = Clock::now() + kChildTimeout;
    for (;;) {
      const size_t end = buffer_.find('\n');
      if (end != std::string::npos) {
        std::string line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      pollfd poll_fd{from_, POLLIN, 0};
      if (left.count() <= 0 || poll(&poll_fd, 1, static_cast<int>(left.count())) <= 0) {
        ADD_FAILURE() << "the child process said nothing for "
                      << kChildTimeout.count() << " s";
        return "";
      }
      char chunk[512];
      const ssize_t got = read(from_, chunk, sizeof chunk);
      if (got <= 0) {
        ADD_FAILURE() << "the child process ended its output early";
        return "";
      }
      buffer_.append(chunk, static_cast<size_t>(got));
    }
  }

  // The child's exit code (-1: killed after the timeout, or by a signal).
  int Wait() {
    const auto deadline = Clock::now() + kChildTimeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        reaped_ = true;
        ADD_FAILURE() << "the child process did not exit";
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  bool reaped_ = false;
  std::string buffer_;
};

// --- The child's parts -------------------------------------------------------

std::string ReadLine() {
  std::string line;
  std::getline(std::cin, line);
  return line;
}

void Say(const std::string& line) { std::cout << line << std::endl; }

std::string Status(ph_status_t status) {
  std::string text = ph_status_name(status);
  if (status != PH_SUCCESS && status != PH_NOT_READY) {
    text += std::string(" ") + ph_last_error_message();
  }
  return text;
}

// Opens a memory handle, checks what hal.h promises about it, writes back.
int ImportMemory() {
  std::istringstream command(ReadLine());
  std::string hex;
  size_t size = 0;
  int seed = 0;
  command >> hex >> size >> seed;
  ph_ipc_mem_handle_t handle{};
  if (!Unhex(hex, handle.reserved, sizeof handle.reserved)) return 2;
  void* ptr = nullptr;
  const ph_status_t opened = ph_ipc_open_mem_handle(&handle, &ptr);
  Say("open " + Status(opened));
  if (opened != PH_SUCCESS) return 0;
  ph_pointer_attributes_t attributes{};
  ph_pointer_get_attributes(ptr, &attributes);
  Say(std::string("attributes ") +
      (attributes.type == PH_MEMORY_DEVICE && attributes.base == ptr &&
               attributes.size == size
           ? "ok"
           : "wrong"));
  std::vector<unsigned char> data(size);
  const ph_status_t read =
      ph_memcpy(data.data(), ptr, size, PH_MEMCPY_DEVICE_TO_HOST);
  Say("read " + Status(read) + (data == Pattern(size, seed) ? " same" : " different"));
  // Work on a stream reaches it too, and the exporter sees what it writes.
  ph_stream_t stream = nullptr;
  ph_stream_create(attributes.device, 0, &stream);
  const std::vector<unsigned char> mine = Pattern(size / 2, seed + 1);
  ph_memcpy_async(ptr, mine.data(), mine.size(), PH_MEMCPY_HOST_TO_DEVICE, stream);
  Say("wrote " + Status(ph_stream_synchronize(stream)));
  void* again = nullptr;
  const ph_status_t reopened = ph_ipc_open_mem_handle(&handle, &again);
  Say(std::string("reopen ") + (reopened == PH_SUCCESS && again == ptr ? "same" : "other"));
  Say("free " + std::string(ph_status_name(ph_free(ptr))));
  Say("close " + Status(ph_ipc_close_mem_handle(ptr)));
  Say("close " + Status(ph_ipc_close_mem_handle(ptr)));
  Say("close " + std::string(ph_status_name(ph_ipc_close_mem_handle(ptr))));
  ph_stream_destroy(stream);
  ReadLine();  // the parent has read everything
  return 0;
}

// Exports memory holding Pattern(size, 7); exits when told, or at once.
int ExportMemory(bool exit_at_once) {
  constexpr size_t kSize = 300000;
  void* ptr = nullptr;
  ph_malloc(0, kSize, &ptr);
  const std::vector<unsigned char> data = Pattern(kSize, 7);
  ph_memcpy(ptr, data.data(), kSize, PH_MEMCPY_HOST_TO_DEVICE);
  ph_ipc_mem_handle_t handle{};
  const ph_status_t exported = ph_ipc_get_mem_handle(ptr, &handle);
  if (exported != PH_SUCCESS) {
    Say("error " + Status(exported));
    return 1;
  }
  Say(Hex(handle.reserved, sizeof handle.reserved) + " " + std::to_string(kSize));
  if (exit_at_once) return 0;
  ReadLine();  // "done"
  ph_free(ptr);
  return 0;
}

int ImportEvent() {
  ph_ipc_event_handle_t handle{};
  if (!Unhex(ReadLine(), handle.reserved, sizeof handle.reserved)) return 2;
  ph_event_t event = nullptr;
  const ph_status_t opened = ph_ipc_open_event_handle(&handle, &event);
  Say("open " + Status(opened));
  if (opened != PH_SUCCESS) return 0;
  Say("query " + Status(ph_event_query(event)));
  ph_stream_t stream = nullptr;
  ph_stream_create(0, 0, &stream);
  std::atomic<bool> ran{false};
  ph_stream_wait_event(stream, event);
  Launch(stream, "after the wait", [&ran](char*, size_t) {
    ran = true;
    return PH_SUCCESS;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::string waiting = Status(ph_stream_query(stream));
  Say("waiting " + waiting + (ran ? " ran" : " held"));
  ReadLine();  // the parent opened its gate
  const std::string synchronized = Status(ph_stream_synchronize(stream));
  Say("synchronized " + synchronized + (ran ? " ran" : " held"));
  Say("query " + Status(ph_event_query(event)));
  // Now this process records the shared event, behind its own gate.
  Gate gate;
  gate.Block(stream);
  Say("recorded " + Status(ph_event_record(event, stream)));
  ReadLine();  // the parent saw the record pending
  gate.Open();
  Say("synchronized " + Status(ph_stream_synchronize(stream)));
  ReadLine();
  ph_event_destroy(event);
  ph_stream_destroy(stream);
  return 0;
}

int ImportFailedEvent() {
  ph_ipc_event_handle_t handle{};
  if (!Unhex(ReadLine(), handle.reserved, sizeof handle.reserved)) return 2;
  ph_event_t event = nullptr;
  ph_ipc_open_event_handle(&handle, &event);
  Say("synchronize " + Status(ph_event_synchronize(event)));
  ph_stream_t stream = nullptr;
  ph_stream_create(0, 0, &stream);
  ph_stream_wait_event(stream, event);
  Say("stream " + Status(ph_stream_synchronize(stream)));
  ph_event_destroy(event);
  ph_stream_destroy(stream);
  return 0;
}

int RunChild(const std::string& part) {
  if (part == "import-memory") return ImportMemory();
  if (part == "export-memory") return ExportMemory(false);
  if (part == "export-memory-and-exit") return ExportMemory(true);
  if (part == "import-event") return ImportEvent();
  if (part == "import-failed-event") return ImportFailedEvent();
  return 3;
}

// --- Capabilities ------------------------------------------------------------

bool DriverSharesMemory() {
  return hal_test::Has(hal_test::Capability::kIpcMemory);
}

bool DriverSharesEvents() {
  return hal_test::Has(hal_test::Capability::kIpcEvent);
}

#define REQUIRE_MEMORY_SHARING() REQUIRE_CAPABILITY(kIpcMemory)
#define REQUIRE_EVENT_SHARING() REQUIRE_CAPABILITY(kIpcEvent)

// --- Tests -------------------------------------------------------------------

TEST(IpcMemory, AnotherProcessReadsAndWritesTheAllocation) {
  REQUIRE_MEMORY_SHARING();
  constexpr size_t kSize = (3 << 20) + 100;
  void* ptr = nullptr;
  ASSERT_PH_OK(ph_malloc(0, kSize, &ptr));
  const std::vector<unsigned char> data = Pattern(kSize, 1);
  ASSERT_PH_OK(ph_memcpy(ptr, data.data(), kSize, PH_MEMCPY_HOST_TO_DEVICE));
  ph_ipc_mem_handle_t handle{};
  // Any address inside names the whole allocation.
  ASSERT_PH_OK(ph_ipc_get_mem_handle(static_cast<char*>(ptr) + 4096, &handle));
  Child child("import-memory");
  child.Send(Hex(handle.reserved, sizeof handle.reserved) + " " +
             std::to_string(kSize) + " 1");
  EXPECT_EQ(child.Receive(), "open PH_SUCCESS");
  EXPECT_EQ(child.Receive(), "attributes ok");
  EXPECT_EQ(child.Receive(), "read PH_SUCCESS same");
  EXPECT_EQ(child.Receive(), "wrote PH_SUCCESS");
  EXPECT_EQ(child.Receive(), "reopen same");
  EXPECT_EQ(child.Receive(), "free PH_ERROR_INVALID_HANDLE")
      << "an imported pointer is closed, not freed";
  EXPECT_EQ(child.Receive(), "close PH_SUCCESS");
  EXPECT_EQ(child.Receive(), "close PH_SUCCESS");
  EXPECT_EQ(child.Receive(), "close PH_ERROR_INVALID_HANDLE");
  child.Send("bye");
  EXPECT_EQ(child.Wait(), 0);
  std::vector<unsigned char> back(kSize);
  ASSERT_PH_OK(ph_memcpy(back.data(), ptr, kSize, PH_MEMCPY_DEVICE_TO_HOST));
  const std::vector<unsigned char> theirs = Pattern(kSize / 2, 2);
  EXPECT_TRUE(std::equal(theirs.begin(), theirs.end(), back.begin()))
      << "the exporter sees what the importer wrote";
  EXPECT_TRUE(std::equal(data.begin() + kSize / 2, data.end(),
                         back.begin() + kSize / 2));
  ASSERT_PH_OK(ph_free(ptr));
}

TEST(IpcMemory, MemoryExportedByAChildReachesTheParent) {
  REQUIRE_MEMORY_SHARING();
  Child child("export-memory");
  std::istringstream line(child.Receive());
  std::string hex;
  size_t size = 0;
  line >> hex >> size;
  ph_ipc_mem_handle_t handle{};
  ASSERT_TRUE(Unhex(hex, handle.reserved, sizeof handle.reserved)) << hex;
  void* ptr = nullptr;
  ASSERT_PH_OK(ph_ipc_open_mem_handle(&handle, &ptr));
  std::vector<unsigned char> data(size);
  ASSERT_PH_OK(ph_memcpy(data.data(), ptr, size, PH_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(data, Pattern(size, 7));
  ASSERT_PH_OK(ph_ipc_close_mem_handle(ptr));
  child.Send("done");
  EXPECT_EQ(child.Wait(), 0);
}

TEST(IpcMemory, AHandleOfAnExitedProcessIsRefused) {
  REQUIRE_MEMORY_SHARING();
  Child child("export-memory-and-exit");
  std::istringstream line(child.Receive());
  std::string hex;
  line >> hex;
  EXPECT_EQ(child.Wait(), 0);
  ph_ipc_mem_handle_t handle{};
  ASSERT_TRUE(Unhex(hex, handle.reserved, sizeof handle.reserved)) << hex;
  void* ptr = reinterpret_cast<void*>(1);
  EXPECT_EQ(ph_ipc_open_mem_handle(&handle, &ptr), PH_ERROR_INVALID_HANDLE);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_NE(std::string(ph_last_error_message()), "");
}

TEST(IpcMemory, BadArgumentsAreRefused) {
  REQUIRE_MEMORY_SHARING();
  void* ptr = nullptr;
  ASSERT_PH_OK(ph_malloc(0, 4096, &ptr));
  ph_ipc_mem_handle_t handle{};
  EXPECT_EQ(ph_ipc_get_mem_handle(ptr, nullptr), PH_ERROR_INVALID_ARGUMENT);
  char host[16];
  EXPECT_EQ(ph_ipc_get_mem_handle(host, &handle), PH_ERROR_INVALID_ARGUMENT);
  ASSERT_PH_OK(ph_ipc_get_mem_handle(ptr, &handle));
  void* opened = reinterpret_cast<void*>(1);
  EXPECT_EQ(ph_ipc_open_mem_handle(&handle, &opened), PH_ERROR_INVALID_ARGUMENT)
      << "the exporting process uses its own pointer";
  EXPECT_EQ(opened, nullptr);
  EXPECT_EQ(ph_ipc_open_mem_handle(&handle, nullptr), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ph_ipc_open_mem_handle(nullptr, &opened), PH_ERROR_INVALID_ARGUMENT);
  ph_ipc_mem_handle_t garbage;
  std::memset(garbage.reserved, 0x5a, sizeof garbage.reserved);
  EXPECT_EQ(ph_ipc_open_mem_handle(&garbage, &opened), PH_ERROR_INVALID_HANDLE);
  EXPECT_EQ(ph_ipc_close_mem_handle(ptr), PH_ERROR_INVALID_HANDLE)
      << "only what ph_ipc_open_mem_handle returned is closed";
  ASSERT_PH_OK(ph_free(ptr));
  EXPECT_EQ(ph_ipc_get_mem_handle(ptr, &handle), PH_ERROR_INVALID_ARGUMENT)
      << "freed memory cannot be exported";
}

TEST(IpcEvent, RecordsAreSharedBothWays) {
  REQUIRE_EVENT_SHARING();
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  ph_event_t event = nullptr;
  ASSERT_PH_OK(
      ph_event_create(PH_EVENT_INTERPROCESS | PH_EVENT_DISABLE_TIMING, &event));
  Gate gate;
  ASSERT_PH_OK(gate.Block(stream));
  ASSERT_PH_OK(ph_event_record(event, stream));
  ph_ipc_event_handle_t handle{};
  ASSERT_PH_OK(ph_ipc_get_event_handle(event, &handle));
  Child child("import-event");
  child.Send(Hex(handle.reserved, sizeof handle.reserved));
  EXPECT_EQ(child.Receive(), "open PH_SUCCESS");
  EXPECT_EQ(child.Receive(), "query PH_NOT_READY");
  EXPECT_EQ(child.Receive(), "waiting PH_NOT_READY held")
      << "the child's stream waits for this process's record";
  gate.Open();
  child.Send("opened");
  EXPECT_EQ(child.Receive(), "synchronized PH_SUCCESS ran");
  EXPECT_EQ(child.Receive(), "query PH_SUCCESS");
  EXPECT_EQ(child.Receive(), "recorded PH_SUCCESS");
  EXPECT_EQ(ph_event_query(event), PH_NOT_READY)
      << "the child's record is the latest one here too";
  child.Send("seen");
  EXPECT_EQ(child.Receive(), "synchronized PH_SUCCESS");
  EXPECT_PH_OK(ph_event_synchronize(event));
  EXPECT_PH_OK(ph_event_query(event));
  child.Send("bye");
  EXPECT_EQ(child.Wait(), 0);
  ASSERT_PH_OK(ph_event_destroy(event));
  ASSERT_PH_OK(ph_stream_destroy(stream));
}

TEST(IpcEvent, FailedWorkBeforeTheRecordReachesTheOtherProcess) {
  REQUIRE_EVENT_SHARING();
  ph_stream_t stream = nullptr;
  ASSERT_PH_OK(ph_stream_create(0, 0, &stream));
  ph_event_t event = nullptr;
  ASSERT_PH_OK(
      ph_event_create(PH_EVENT_INTERPROCESS | PH_EVENT_DISABLE_TIMING, &event));
  ASSERT_PH_OK(Launch(stream, "fails", [](char* error, size_t size) {
    std::snprintf(error, size, "on purpose");
    return PH_ERROR_DEVICE;
  }));
  ph_event_record(event, stream);  // may report the sticky error: either way
  ph_ipc_event_handle_t handle{};
  ASSERT_PH_OK(ph_ipc_get_event_handle(event, &handle));
  Child child("import-failed-event");
  child.Send(Hex(handle.reserved, sizeof handle.reserved));
  EXPECT_EQ(child.Receive().rfind("synchronize PH_ERROR_DEVICE", 0), 0u);
  EXPECT_EQ(child.Receive().rfind("stream PH_ERROR_DEVICE", 0), 0u)
      << "work waiting for failed work fails";
  EXPECT_EQ(child.Wait(), 0);
  ph_event_destroy(event);
  ph_stream_destroy(stream);
}

TEST(IpcEvent, BadArgumentsAreRefused) {
  REQUIRE_EVENT_SHARING();
  ph_event_t event = nullptr;
  EXPECT_EQ(ph_event_create(PH_EVENT_INTERPROCESS, &event),
            PH_ERROR_INVALID_ARGUMENT)
      << "an interprocess event needs PH_EVENT_DISABLE_TIMING";
  ph_event_t plain = nullptr;
  ASSERT_PH_OK(ph_event_create(PH_EVENT_DISABLE_TIMING, &plain));
  ph_ipc_event_handle_t handle{};
  EXPECT_EQ(ph_ipc_get_event_handle(plain, &handle), PH_ERROR_INVALID_ARGUMENT);
  ASSERT_PH_OK(
      ph_event_create(PH_EVENT_INTERPROCESS | PH_EVENT_DISABLE_TIMING, &event));
  EXPECT_EQ(ph_ipc_get_event_handle(event, nullptr), PH_ERROR_INVALID_ARGUMENT);
  ASSERT_PH_OK(ph_ipc_get_event_handle(event, &handle));
  ph_event_t opened = reinterpret_cast<ph_event_t>(1);
  EXPECT_EQ(ph_ipc_open_event_handle(&handle, &opened), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(opened, nullptr);
  ph_ipc_event_handle_t garbage;
  std::memset(garbage.reserved, 0x33, sizeof garbage.reserved);
  EXPECT_EQ(ph_ipc_open_event_handle(&garbage, &opened), PH_ERROR_INVALID_HANDLE);
  float ms = 0;
  EXPECT_EQ(ph_event_elapsed_time(event, event, &ms), PH_ERROR_INVALID_ARGUMENT);
  EXPECT_PH_OK(ph_event_query(event)) << "never recorded: reached";
  ph_event_destroy(plain);
  ph_event_destroy(event);
}

// A driver without the capability refuses the whole part it lacks.
TEST(IpcCapability, AllOrNothing) {
  if (DriverSharesMemory() && DriverSharesEvents()) {
    GTEST_SKIP() << "the driver shares memory and events";
  }
  if (!DriverSharesMemory()) {
    ph_ipc_mem_handle_t handle{};
    void* ptr = nullptr;
    EXPECT_EQ(ph_ipc_open_mem_handle(&handle, &ptr), PH_ERROR_UNIMPLEMENTED);
    int host = 0;
    EXPECT_EQ(ph_ipc_close_mem_handle(&host), PH_ERROR_UNIMPLEMENTED);
    EXPECT_NE(std::string(ph_last_error_message()), "");
  }
  if (!DriverSharesEvents()) {
    ph_ipc_event_handle_t handle{};
    ph_event_t event = nullptr;
    EXPECT_EQ(ph_ipc_open_event_handle(&handle, &event), PH_ERROR_UNIMPLEMENTED);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* part = getenv("PHANTOM_HAL_IPC_CHILD")) return RunChild(part);
  ::testing::InitGoogleTest(&argc, argv);
  return hal_test::RunTestsWithExpectations();
}
