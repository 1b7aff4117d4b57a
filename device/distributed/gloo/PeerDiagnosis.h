// Naming the peer at fault when a collective fails.
//
// Gloo reports a dead peer as "Connection closed by peer [127.0.0.1]:40675"
// and a hung one as "Timed out waiting 5000ms for recv operation", neither
// of which says which rank to look at. Each rank therefore records in the
// group's store, under "pccl/":
//
//   process/<rank>   its host name and pid, once, when the group is made;
//   progress/<rank>  how many collectives it has called, and the last one,
//                    published by a small thread at most every 200 ms when
//                    the count changed (the calls themselves never touch
//                    the store, so a collective costs no extra round trip);
//   failure          the first local failure any rank had (a device error
//                    or an injected fault during a collective), written
//                    before that rank breaks its connections.
//
// When a collective fails, explain() reads them back: a peer on this host
// whose process is gone or stopped, a peer that has not called this
// collective yet (with its last one), or the rank whose own failure broke
// the group. Reading the store is bounded: a store that cannot be reached
// (its host died) is said so, not waited for.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace phantom::gloo_staging {

class PeerDiagnosis {
 public:
  PeerDiagnosis(c10::intrusive_ptr<c10d::Store> store, int rank, int size);
  ~PeerDiagnosis();

  // The calling thread has called collective number `collective`.
  void called(uint64_t collective, const std::string& label);

  // Records this rank's own failure for the peers (first writer wins).
  void reportLocalFailure(const std::string& message);

  // A sentence about the peers for a failure of collective `collective`
  // (`peer` set: a point-to-point exchange with that rank only).
  std::string explain(uint64_t collective, std::optional<int> peer);

  // Stops publishing (idempotent; the destructor calls it).
  void stop();

 private:
  void publishLoop();
  std::optional<std::string> read(const std::string& key);
  // " (pid N) has exited" / " is stopped" for a peer on this host, else "".
  std::string processState(int peer);

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int size_;
  std::string host_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  uint64_t called_ = 0;
  std::string last_label_;
  uint64_t published_ = 0;
  std::thread publisher_;
};

}  // namespace phantom::gloo_staging
