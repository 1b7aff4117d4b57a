// Client-side streams: handles, host tasks and the callback threads that
// run them.
//
// Design. A stream lives in the server; the client keeps, per stream, the
// host tasks it has launched and not yet seen run or released (keyed by a
// task id the server's queue holds), and one callback thread with its own
// connection. When the server's worker reaches a task it asks that thread
// to run it (or to release it, when the stream is sticky) and waits for
// the answer, so host work runs in stream order, on a thread where
// CurrentStream() names the stream (the self-wait checks use it), while
// every other thread stays free to call the driver (a task may itself
// launch work, copy or query).
//
// Every task is released exactly once: whoever takes it out of the pending
// map (the callback thread, a failed launch, or the device-lost cleanup)
// calls `release`. When the server is lost, each callback thread sees its
// connection close and releases what its stream still held.
// ph_run_host_func needs nothing more: the server answers its launch only
// once the task has run and been counted (wire.h, kLaunch).
#ifndef PHANTOM_REMOTE_CLIENT_STREAMS_H_
#define PHANTOM_REMOTE_CLIENT_STREAMS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "phantom/hal.h"

namespace phantom::remote {

class ClientStream {
 public:
  ClientStream(uint64_t id, int device, int priority)
      : id_(id), device_(device), priority_(priority) {}
  ~ClientStream();

  uint64_t id() const { return id_; }
  int device() const { return device_; }
  int priority() const { return priority_; }

  // Takes `fd` (a callback connection) and starts the thread serving it.
  void StartCallbacks(int fd);
  // Says the stream is being destroyed: the server closing the callback
  // connection from now on is not a lost device (`false` undoes it).
  void SetDestroying(bool destroying) { stopping_ = destroying; }
  // Stops the callback thread after the server destroyed the stream.
  void StopCallbacks();

  // Registers a task before its launch is sent; returns its id.
  uint64_t AddTask(const ph_host_task_t& task);
  // Takes a task back out and releases it (a launch the server refused).
  void ReleaseTask(uint64_t task);

 private:
  struct Pending {
    ph_host_task_t task;
  };
  void Serve();
  bool Take(uint64_t task, Pending* out);
  void ReleaseAll();

  const uint64_t id_;
  const int device_;
  const int priority_;
  std::mutex mutex_;
  std::map<uint64_t, Pending> pending_;
  int fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Handles: ids with a tag in the low bits, so a stream handle passed as an
// event (or garbage) is refused without being dereferenced.
ph_stream_t StreamHandle(uint64_t id);
ph_event_t EventHandle(uint64_t id);
uint64_t StreamId(ph_stream_t handle);  // 0: not a stream handle
uint64_t EventId(ph_event_t handle);    // 0: not an event handle

void RegisterStream(std::shared_ptr<ClientStream> stream);
std::shared_ptr<ClientStream> FindStream(ph_stream_t handle);
std::shared_ptr<ClientStream> UnregisterStream(uint64_t id);

}  // namespace phantom::remote

#endif  // PHANTOM_REMOTE_CLIENT_STREAMS_H_
