// See PeerDiagnosis.h.
#include "PeerDiagnosis.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <pthread.h>
#include <unistd.h>

namespace phantom::gloo_staging {
namespace {

constexpr auto kPublishPeriod = std::chrono::milliseconds(200);

std::vector<uint8_t> bytesOf(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string processKey(int rank) {
  return "pccl/process/" + std::to_string(rank);
}
std::string progressKey(int rank) {
  return "pccl/progress/" + std::to_string(rank);
}
const char* kFailureKey = "pccl/failure";

std::string hostName() {
  char name[256] = "";
  if (gethostname(name, sizeof(name) - 1) != 0) {
    return "?";
  }
  return name;
}

// The state letter of a local process (/proc/<pid>/stat), or 0 if gone.
char localProcessState(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) {
    return 0;
  }
  // "pid (comm) S ...": the state follows the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) {
    return '?';
  }
  return line[close + 2];
}

}  // namespace

PeerDiagnosis::PeerDiagnosis(c10::intrusive_ptr<c10d::Store> store, int rank,
                             int size)
    : store_(std::move(store)), rank_(rank), size_(size), host_(hostName()) {
  // Failing to record is not fatal: diagnosis then says less.
  try {
    store_->set(processKey(rank_),
                bytesOf(host_ + "\n" + std::to_string(getpid())));
    store_->set(progressKey(rank_), bytesOf("0\n"));
  } catch (const std::exception&) {
  }
  publisher_ = std::thread([this] { publishLoop(); });
}

PeerDiagnosis::~PeerDiagnosis() {
  stop();
}

void PeerDiagnosis::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (publisher_.joinable()) {
    publisher_.join();
  }
}

void PeerDiagnosis::called(uint64_t collective, const std::string& label) {
  std::lock_guard<std::mutex> lock(mutex_);
  called_ = collective;
  last_label_ = label;
}

void PeerDiagnosis::publishLoop() {
  pthread_setname_np(pthread_self(), "pccl-progress");
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kPublishPeriod);
    if (stopping_ || called_ == published_) {
      continue;
    }
    const uint64_t called = called_;
    const std::string value = std::to_string(called) + "\n" + last_label_;
    lock.unlock();
    try {
      store_->set(progressKey(rank_), bytesOf(value));
    } catch (const std::exception&) {
      // The store's host is gone; the next failure will say so.
    }
    lock.lock();
    published_ = called;
  }
}

void PeerDiagnosis::reportLocalFailure(const std::string& message) {
  try {
    store_->compareSet(kFailureKey, {},
                       bytesOf("rank " + std::to_string(rank_) + ": " + message));
  } catch (const std::exception&) {
  }
}

std::optional<std::string> PeerDiagnosis::read(const std::string& key) {
  if (!store_->check({key})) {
    return std::nullopt;
  }
  const std::vector<uint8_t> value = store_->get(key);
  return std::string(value.begin(), value.end());
}

std::string PeerDiagnosis::processState(int peer) {
  const std::optional<std::string> process = read(processKey(peer));
  if (!process) {
    return "";
  }
  const size_t newline = process->find('\n');
  if (newline == std::string::npos || process->substr(0, newline) != host_) {
    return "";  // another machine: the store is all we can see
  }
  const long pid = std::atol(process->c_str() + newline + 1);
  const char state = localProcessState(pid);
  const std::string pid_text = " (pid " + std::to_string(pid) + ")";
  if (state == 0 || state == 'Z' || state == 'X') {
    return pid_text + " has exited";
  }
  if (state == 'T' || state == 't') {
    return pid_text + " is stopped";
  }
  return "";
}

std::string PeerDiagnosis::explain(uint64_t collective,
                                   std::optional<int> peer) {
  std::vector<std::string> findings;
  try {
    if (std::optional<std::string> failure = read(kFailureKey)) {
      const std::string mine = "rank " + std::to_string(rank_) + ":";
      if (failure->compare(0, mine.size(), mine) != 0) {
        findings.push_back("it failed first on " + *failure);
      }
    }
    // A healthy peer publishes within one period of calling; give it that
    // before reading, so that it is not taken for the one that is late.
    std::this_thread::sleep_for(kPublishPeriod + kPublishPeriod / 2);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || (peer && *peer != p)) {
        continue;
      }
      const std::string who = "rank " + std::to_string(p);
      const std::string state = processState(p);
      if (peer) {  // point-to-point: progress counts collectives only
        if (!state.empty()) {
          findings.push_back(who + state);
        }
        continue;
      }
      const std::optional<std::string> progress = read(progressKey(p));
      const uint64_t reached =
          progress ? std::strtoull(progress->c_str(), nullptr, 10) : 0;
      if (!state.empty()) {
        findings.push_back(who + state +
                           (reached < collective ? " before calling it"
                                                 : " after calling it"));
      } else if (reached < collective) {
        const size_t newline = progress ? progress->find('\n') : std::string::npos;
        const bool named = newline != std::string::npos && newline + 1 < progress->size();
        findings.push_back(
            who + " has not called it (" +
            (named ? "its last collective is " + progress->substr(newline + 1)
                   : std::string("it has called no collective")) +
            ")");
      }
    }
  } catch (const c10::Error& e) {
    findings.push_back(
        std::string("the group's store could not be read to find the peer "
                    "at fault (the process hosting it may have exited): ") +
        e.what_without_backtrace());
  } catch (const std::exception& e) {
    findings.push_back(
        std::string("the group's store could not be read to find the peer "
                    "at fault (the process hosting it may have exited): ") +
        e.what());
  }
  if (findings.empty()) {
    return peer ? "rank " + std::to_string(*peer) + " is still running"
                : "every peer is running and has called it";
  }
  std::ostringstream out;
  for (size_t i = 0; i < findings.size(); ++i) {
    out << (i == 0 ? "" : "; ") << findings[i];
  }
  return out.str();
}

}  // namespace phantom::gloo_staging
