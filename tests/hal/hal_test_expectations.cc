// See hal_test_expectations.h.
#include "hal_test_expectations.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace hal_test {
namespace {

// Test name -> reason; false (with `error`) when the file is malformed.
bool ReadList(const std::string& path, std::map<std::string, std::string>* list,
              std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read the expectation list '" + path + "'";
    return false;
  }
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string name;
    if (!(words >> name)) continue;  // blank or comment
    std::string reason;
    std::getline(words, reason);
    const size_t start = reason.find_first_not_of(" \t");
    if (start == std::string::npos) {
      *error = path + ":" + std::to_string(number) + ": '" + name +
               "' needs a reason after the name, on the same line";
      return false;
    }
    if (name.find('.') == std::string::npos) {
      *error = path + ":" + std::to_string(number) + ": '" + name +
               "' is not a test name (Suite.Test)";
      return false;
    }
    (*list)[name] = reason.substr(start);
  }
  return true;
}

}  // namespace

int RunTestsWithExpectations() {
  const char* path = std::getenv("PHANTOM_HAL_TEST_EXPECTED");
  if (path == nullptr || path[0] == '\0') return RUN_ALL_TESTS();
  std::map<std::string, std::string> expected;
  std::string error;
  if (!ReadList(path, &expected, &error)) {
    std::fprintf(stderr, "HAL conformance: %s\n", error.c_str());
    return 1;
  }
  const int gtest_verdict = RUN_ALL_TESTS();  // judged below, per test
  (void)gtest_verdict;

  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  bool ok = !unit.ad_hoc_test_result().Failed();
  std::set<std::string> suites;
  std::set<std::string> tests;
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    suites.insert(suite.name());
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(t);
      const std::string name =
          std::string(suite.name()) + "." + info.name();
      tests.insert(name);
      if (!info.should_run()) continue;
      const ::testing::TestResult& result = *info.result();
      const auto listed = expected.find(name);
      if (listed == expected.end()) {
        ok = ok && !result.Failed();
      } else if (result.Failed()) {
        std::printf("[ EXPECTED ] %s fails as %s says: %s\n", name.c_str(),
                    path, listed->second.c_str());
      } else if (!result.Skipped()) {
        std::printf("[ UNEXPECTED PASS ] %s: unexpected pass: remove it "
                    "from %s\n", name.c_str(), path);
        ok = false;
      }
    }
  }
  for (const auto& [name, reason] : expected) {
    const std::string suite = name.substr(0, name.find('.'));
    if (suites.count(suite) != 0 && tests.count(name) == 0) {
      std::printf("[ STALE ] %s lists '%s', which is no test of suite %s: "
                  "remove or rename it\n", path, name.c_str(), suite.c_str());
      ok = false;
    }
  }
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace hal_test
