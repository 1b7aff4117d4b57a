// Streams, events and device memory inside the remote server.
//
// Design. The server is where the device lives: it owns device memory
// (ordinary host memory of the server process, never mapped into a
// client), and runs each stream's queue on a worker thread of its own, in
// order. The rules are those of phantom/hal.h ("Device errors"):
//
//  - A stream's queue holds Items: host work (run by the client, see
//    below), copies and fills, event records, event waits and barriers.
//    Work that fails makes the stream sticky; later work is skipped
//    (host tasks are released, blocking copies are told why), records
//    still mark their point and carry the failure as it was there.
//  - An event is a pointer to its latest Record. A record is reached when
//    the stream's worker passes it; a wait item holds the record it was
//    queued against, so re-recording or destroying the event later does
//    not change what the wait waits for.
//  - Host work: the client's function pointer means nothing here, so an
//    item holds the client's task id. When the worker reaches it, it sends
//    kRunTask on the stream's callback connection and waits for the
//    client's reply (status and message) before going on: host work keeps
//    its place in stream order. Skipped tasks are sent as kReleaseTask,
//    also answered, so a task is released before the stream counts it done.
#ifndef PHANTOM_REMOTE_SERVER_STREAM_H_
#define PHANTOM_REMOTE_SERVER_STREAM_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "phantom/hal.h"

namespace phantom::remote {

// The reached state of one event record.
struct Record {
  std::mutex mutex;
  std::condition_variable changed;
  bool reached = false;
  ph_status_t failure = PH_SUCCESS;  // of the work before the record
  std::string origin;                // the original failure's message
  std::chrono::steady_clock::time_point time;
  uint64_t stream = 0;
  int device = 0;

  void MarkReached(ph_status_t status, const std::string& failure_origin);
  void WaitReached();
  // Whether reached; if so, the failure it carries.
  bool Reached(ph_status_t* out_failure, std::string* out_origin);
};

struct Event {
  uint64_t session = 0;
  unsigned flags = 0;
  std::mutex mutex;
  std::shared_ptr<Record> latest;  // null: never recorded
};

// The outcome of a blocking item (a staged copy, a barrier).
struct Done {
  std::mutex mutex;
  std::condition_variable changed;
  bool finished = false;
  ph_status_t status = PH_SUCCESS;
  std::string message;

  void Finish(ph_status_t result, const std::string& text);
  ph_status_t Wait(std::string* text);
};

struct Item {
  enum class Kind { kHost, kWork, kRecord, kWait, kBarrier };
  Kind kind = Kind::kWork;
  uint64_t task = 0;             // kHost: the client's task id
  std::function<void()> work;    // kWork: the copy or fill
  std::shared_ptr<Record> record;  // kRecord, kWait
  std::shared_ptr<Done> done;      // set when the caller waits for it
};

// Messages of the error model, shared with the fake driver's wording.
std::string InheritedByWait(const Record& record, const std::string& origin);
std::string CarriedByEvent(const Record& record, const std::string& origin);

class Stream {
 public:
  Stream(uint64_t id, uint64_t session, int device, int priority);
  ~Stream();

  uint64_t id() const { return id_; }
  uint64_t session() const { return session_; }
  int device() const { return device_; }
  int priority() const { return priority_; }

  void Start();
  // The connection host tasks are sent on (owned by the stream from now).
  void AttachCallback(int fd);

  // Queues `item`. Refused with the sticky error when `refuse_when_sticky`
  // and the stream has one, and with PH_ERROR_INVALID_HANDLE once the
  // stream is being destroyed.
  ph_status_t Enqueue(Item item, bool refuse_when_sticky, std::string* message);

  ph_status_t Query(std::string* message);
  ph_status_t Synchronize(std::string* message);
  ph_status_t Sticky(std::string* message);

  // Refuses new work, runs what is queued, stops the worker.
  void Shutdown();

 private:
  void Run();
  void Execute(Item& item, std::unique_lock<std::mutex>& lock);
  void RunHostTask(Item& item, std::unique_lock<std::mutex>& lock);
  void SetSticky(ph_status_t status, std::string message, std::string origin);

  const uint64_t id_;
  const uint64_t session_;
  const int device_;
  const int priority_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  uint64_t queued_ = 0;
  uint64_t completed_ = 0;
  bool closing_ = false;
  int callback_fd_ = -1;
  ph_status_t sticky_ = PH_SUCCESS;
  std::string sticky_message_;
  std::string sticky_origin_;
  std::thread worker_;
};

// One device's memory: a first-fit range allocator over [0, capacity) and
// a block of server memory behind each allocation.
class DeviceMemory {
 public:
  void Configure(int device, uint64_t capacity);
  ph_status_t Allocate(uint64_t session, uint64_t size, uint64_t* out_offset,
                       std::string* message);
  ph_status_t Free(uint64_t offset, std::string* message);
  void FreeSession(uint64_t session);
  void Info(uint64_t* out_free, uint64_t* out_total);
  // The server address of [offset, offset + size) inside one live
  // allocation, or nullptr.
  char* Resolve(uint64_t offset, uint64_t size);

 private:
  struct Block {
    uint64_t size;      // as allocated (aligned)
    uint64_t session;
    std::unique_ptr<char[]> bytes;
  };
  int device_ = 0;
  uint64_t capacity_ = 0;
  uint64_t used_ = 0;
  std::mutex mutex_;
  std::map<uint64_t, uint64_t> free_;  // offset -> size
  std::map<uint64_t, Block> blocks_;   // offset -> block
};

}  // namespace phantom::remote

#endif  // PHANTOM_REMOTE_SERVER_STREAM_H_
