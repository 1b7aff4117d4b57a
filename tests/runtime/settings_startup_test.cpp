// A LibTorch program started with a malformed PHANTOM_* setting gets one
// error naming it, at its first phantom call and at every later one, and
// nothing runs with the setting silently ignored (phantom/Settings.h).
//
// The settings are read once per process, so each case runs in a child: this
// program re-executes itself with PHANTOM_STARTUP_TEST_CHILD set and one
// setting given a bad value, and the child, a LibTorch program like
// examples/cpp, prints what its phantom calls raised. Every setting of the
// catalogue that C++ reads is tried, so a new one is covered without a change
// here.
#include <phantom/common/settings.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

namespace settings = phantom::settings;

constexpr const char* kChildVariable = "PHANTOM_STARTUP_TEST_CHILD";

// What one phantom call raised: "OK", or "<type>: <message>".
std::string outcome(const std::function<void()>& call) {
  try {
    call();
    return "OK";
  } catch (const c10::ValueError& e) {
    return std::string("ValueError: ") + e.what_without_backtrace();
  } catch (const c10::AcceleratorError& e) {
    return std::string("AcceleratorError: ") + e.what_without_backtrace();
  } catch (const c10::Error& e) {
    return std::string("Error: ") + e.what_without_backtrace();
  }
}

// The child: two ordinary uses of the device, one line each.
int runChild() {
  const c10::Device phantom0(c10::DeviceType::PrivateUse1, 0);
  std::printf("%s\n", outcome([&] {
                        at::Tensor x = at::ones({4}, at::device(phantom0));
                        (x.sin() + 1).cpu();
                      }).c_str());
  std::printf("%s\n", outcome([&] { at::empty({2}, at::device(phantom0)); }).c_str());
  return 0;
}

// Runs this program as a child with `name`=`value` added to the
// environment; returns its output lines.
std::vector<std::string> runAsChild(const char* name, const char* value) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    setenv(kChildVariable, "1", 1);
    if (name != nullptr) setenv(name, value, 1);
    execl("/proc/self/exe", "settings_startup_child", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = read(out[0], buffer, sizeof buffer)) > 0) text.append(buffer, n);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(text.substr(start, end - start));
  }
  return lines;
}

const char* badValueFor(settings::Kind kind) {
  switch (kind) {
    case settings::Kind::kCount: return "abc";
    case settings::Kind::kSize: return "lots";
    case settings::Kind::kSwitch: return "true";
    case settings::Kind::kFraction: return "half";
    case settings::Kind::kOptions: return "bogus";
    case settings::Kind::kLibrary: return "drivers/";
    case settings::Kind::kChoice: return "sometimes";
  }
  return nullptr;
}

TEST(SettingsStartup, WellFormedSettingsLetTheProgramRun) {
  EXPECT_EQ(runAsChild(nullptr, nullptr),
            (std::vector<std::string>{"OK", "OK"}));
  // Blank is unset, whatever the setting.
  EXPECT_EQ(runAsChild("PHANTOM_SYNC_GENERIC", "  "),
            (std::vector<std::string>{"OK", "OK"}));
}

TEST(SettingsStartup, EveryMalformedSettingIsOneErrorAtEveryPhantomCall) {
  for (const settings::Spec* spec : settings::kAll) {
    if (spec->reader == settings::Reader::kPython) continue;  // not read by C++
    // The remote driver's settings: the driver loaded here is the fake,
    // which never reads them (tests/remote starts that driver).
    if (std::string(spec->name).rfind("PHANTOM_REMOTE_", 0) == 0) continue;
    const char* bad = badValueFor(spec->kind);
    ASSERT_NE(bad, nullptr) << spec->name << ": add a bad value for its kind";
    std::string sentence;
    settings::Value unused;
    ASSERT_FALSE(settings::Parse(*spec, bad, &unused, &sentence));
    // The driver refuses to start and says why; the runtime's own settings
    // are a ValueError. Either way the message is the parser's sentence.
    const std::string expected =
        spec->reader == settings::Reader::kDriver
            ? "AcceleratorError: phantom driver failed to start: " + sentence
            : "ValueError: " + sentence;
    EXPECT_EQ(runAsChild(spec->name, bad),
              (std::vector<std::string>{expected, expected}))
        << spec->name;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv(kChildVariable) != nullptr) return runChild();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
