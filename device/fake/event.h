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
// would hang); ph_event_synchronize then reports the recording stream's
// sticky error.
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

#include "ipc.h"
#include "phantom/hal.h"
#include "stream.h"

namespace phantom::fake {

struct EventRecord {
  std::mutex mutex;  // guards the fields below
  std::condition_variable reached_changed;
  std::atomic<bool> reached{false};  // written under mutex; polled unlocked
  std::chrono::steady_clock::time_point time;
  std::weak_ptr<Stream> stream;  // the recording stream
  Stream* stream_identity = nullptr;  // for "waiting for itself" checks

  void MarkTime();     // when the marker runs
  void MarkReached();  // after the stream counted the marker complete
  bool IsReached();
  void WaitReached();
};

struct Event {
  explicit Event(unsigned flags) : flags(flags) {}
  const unsigned flags;
  std::mutex mutex;  // guards latest
  std::shared_ptr<EventRecord> latest;  // null until first recorded
  // Set for an interprocess event (PH_EVENT_INTERPROCESS or opened from a
  // handle): its records live in shared memory instead (ipc.h), and
  // `latest` is unused.
  std::shared_ptr<SharedEvent> shared;

  std::shared_ptr<EventRecord> Latest();
};

ph_event_t RegisterEvent(std::shared_ptr<Event> event);
std::shared_ptr<Event> FindEvent(ph_event_t handle);
std::shared_ptr<Event> UnregisterEvent(ph_event_t handle);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_EVENT_H_
