// Events: a marker in a stream's queue, one generation per record.
//
// ph_event_record creates a new EventRecord and queues a marker task that,
// when the worker reaches it, stamps the time (steady_clock) and sets
// `reached`. The event points at its latest record; every record replaces
// the pointer with a fresh object instead of resetting the old one. So a
// ph_stream_wait_event, which captures the record current at the time of
// its call, keeps waiting for exactly that point even if the event is
// recorded again (hal.h's rule), and a wait queued before ph_event_destroy
// still works because it owns its record through a shared_ptr.
//
// Markers run even on a stream with a sticky error (otherwise every waiter
// would hang). A marker hands its record the recording stream's sticky
// state at the marker's place in the queue (the failure of work before
// it, hal.h's error model), so the record carries that failure, and only
// that one, for as long as the record lives: a later failure of the
// stream does not reach it, and destroying the stream does not clear it.
// ph_event_query and ph_event_synchronize return it, and an event wait
// makes its stream sticky with it (the messages below say how the failure
// was inherited, then give the original one).
//
// Locking: Event::mutex guards `latest`; EventRecord::mutex guards its
// fields and pairs with its condition variable.
#ifndef PHANTOM_FAKE_EVENT_H_
#define PHANTOM_FAKE_EVENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "ipc.h"
#include "phantom/hal.h"
#include "stream.h"

namespace phantom::fake {

struct CaptureMark;  // graph.h

struct EventRecord {
  std::mutex mutex;  // guards the fields below
  std::condition_variable reached_changed;
  std::atomic<bool> reached{false};  // written under mutex; polled unlocked
  std::chrono::steady_clock::time_point time;
  Stream* stream_identity = nullptr;  // for "waiting for itself" checks
  int device = -1;                    // of the recording stream
  // The failure of the work before the marker (set with `reached`).
  ph_status_t failure = PH_SUCCESS;
  std::string origin;  // the original failure's message

  void MarkTime();  // when the marker runs
  // After the stream counted the marker complete, with its sticky state.
  void MarkReached(ph_status_t failure, const std::string& origin);
  // False if not reached yet; else true, with the failure it carries.
  bool Reached(ph_status_t* out_failure, std::string* out_origin);
  void WaitReached();
};

// The message of a stream that waited for a record carrying a failure, and
// the message of an event query or synchronize that meets one.
std::string InheritedByWait(const EventRecord& record,
                            const std::string& origin);
std::string CarriedByEvent(const EventRecord& record,
                           const std::string& origin);

struct Event {
  explicit Event(unsigned flags) : flags(flags) {}
  const unsigned flags;
  std::mutex mutex;  // guards latest
  std::shared_ptr<EventRecord> latest;  // null until first recorded
  // Set for an interprocess event (PH_EVENT_INTERPROCESS or opened from a
  // handle): its records live in shared memory instead (ipc.h), and
  // `latest` is unused.
  std::shared_ptr<SharedEvent> shared;
  // Set when the latest record was made during a graph capture (graph.h):
  // the point lies inside a graph. `captured` mirrors it for a lock-free
  // check; both are written under `mutex`.
  std::shared_ptr<CaptureMark> capture_mark;
  std::atomic<bool> captured{false};

  std::shared_ptr<EventRecord> Latest();
};

ph_event_t RegisterEvent(std::shared_ptr<Event> event);
std::shared_ptr<Event> FindEvent(ph_event_t handle);
std::shared_ptr<Event> UnregisterEvent(ph_event_t handle);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_EVENT_H_
