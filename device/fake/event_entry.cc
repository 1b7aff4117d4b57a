// The C entry points of phantom/hal.h's events for the fake driver: thin
// shells, as in hal_entry.cc, over Event (event.h).
#include <chrono>
#include <memory>
#include <string>

#include "activity.h"
#include "config.h"
#include "entry_checks.h"
#include "errors.h"
#include "event.h"
#include "graph.h"
#include "phantom/hal.h"
#include "stream.h"

using namespace phantom::fake;  // NOLINT: this file is the C shell

extern "C" {

/* ---- Events ------------------------------------------------------------ */

ph_status_t ph_event_create(unsigned flags, ph_event_t* out_event) {
  return Guarded("ph_event_create", [&] {
    if (out_event == nullptr) return NullOut("ph_event_create", "out_event");
    *out_event = nullptr;
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    const unsigned known = PH_EVENT_DISABLE_TIMING | PH_EVENT_INTERPROCESS;
    if ((flags & ~known) != 0) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "ph_event_create: unknown flags 0x%x (use "
                    "PH_EVENT_DEFAULT, PH_EVENT_DISABLE_TIMING or "
                    "PH_EVENT_INTERPROCESS)",
                    flags);
      return Fail(PH_ERROR_INVALID_ARGUMENT, text);
    }
    auto event = std::make_shared<Event>(flags);
    if ((flags & PH_EVENT_INTERPROCESS) != 0) {
      const ph_status_t offered = CheckIpcOffered("ph_event_create");
      if (offered != PH_SUCCESS) return offered;
      if ((flags & PH_EVENT_DISABLE_TIMING) == 0) {
        return Fail(PH_ERROR_INVALID_ARGUMENT,
                    "ph_event_create: PH_EVENT_INTERPROCESS needs "
                    "PH_EVENT_DISABLE_TIMING too (interprocess events do not "
                    "time work)");
      }
      const ph_status_t created = SharedEvent::Create(&event->shared);
      if (created != PH_SUCCESS) return created;
    }
    *out_event = RegisterEvent(std::move(event));
    return PH_SUCCESS;
  });
}

ph_status_t ph_event_destroy(ph_event_t handle) {
  return Guarded("ph_event_destroy", [&] {
    const ph_status_t started = CheckStarted();
    if (started != PH_SUCCESS) return started;
    if (!UnregisterEvent(handle)) return InvalidHandle("ph_event_destroy", "event", handle);
    return PH_SUCCESS;
  });
}

ph_status_t ph_event_record(ph_event_t event_handle,
                            ph_stream_t stream_handle) {
  return Guarded("ph_event_record", [&] {
    std::shared_ptr<Event> event;
    ph_status_t status = GetEvent("ph_event_record", event_handle, &event);
    if (status != PH_SUCCESS) return status;
    std::shared_ptr<Stream> stream;
    status = GetStream("ph_event_record", stream_handle, &stream);
    if (status != PH_SUCCESS) return status;
    if (CaptureActive() || event->captured.load(std::memory_order_acquire)) {
      bool recorded = false;
      status = RecordEventIfCapturing(*stream, *event, &recorded);
      if (recorded) return status;
    }
    if (event->shared) return event->shared->Record(event->shared, stream);
    auto record = std::make_shared<EventRecord>();
    record->stream_identity = stream.get();
    record->device = stream->device();
    Task task;
    task.kind = TaskKind::kEventMarker;
    task.name = "ph_event_record";
    // The time is taken when the marker runs; the record counts as reached
    // only after the stream has counted the marker complete, so a query of
    // the stream right after the event is reached already says idle.
    task.run = [record](char*, size_t) {
      record->MarkTime();
      return PH_SUCCESS;
    };
    task.on_complete = [record](ph_status_t failure,
                                const std::string& origin) {
      record->MarkReached(failure, origin);  // what came before the marker
    };
    task.runs_when_sticky = true;
    // Publish under the event's lock so concurrent records of one event
    // leave `latest` pointing at whichever marker was queued last.
    std::lock_guard<std::mutex> lock(event->mutex);
    uint64_t generation = 0;
    status = stream->Enqueue(std::move(task), false, &generation);
    if (status != PH_SUCCESS) return status;
    event->latest = std::move(record);
    return PH_SUCCESS;
  });
}

ph_status_t ph_event_query(ph_event_t handle) {
  return Guarded("ph_event_query", [&] {
    std::shared_ptr<Event> event;
    const ph_status_t found = GetEvent("ph_event_query", handle, &event);
    if (found != PH_SUCCESS) return found;
    const ph_status_t captured = RefuseCapturedEvent(*event, "ph_event_query");
    if (captured != PH_SUCCESS) return captured;
    if (event->shared) return event->shared->Query();
    std::shared_ptr<EventRecord> record = event->Latest();
    if (!record) return PH_SUCCESS;
    ph_status_t failure = PH_SUCCESS;
    std::string origin;
    if (!record->Reached(&failure, &origin)) return PH_NOT_READY;
    if (failure == PH_SUCCESS) return PH_SUCCESS;
    return Fail(failure, CarriedByEvent(*record, origin));
  });
}

ph_status_t ph_event_synchronize(ph_event_t handle) {
  return Guarded("ph_event_synchronize", [&] {
    std::shared_ptr<Event> event;
    const ph_status_t found = GetEvent("ph_event_synchronize", handle, &event);
    if (found != PH_SUCCESS) return found;
    const ph_status_t captured =
        RefuseCapturedEvent(*event, "ph_event_synchronize");
    if (captured != PH_SUCCESS) return captured;
    if (event->shared) return event->shared->Synchronize();
    std::shared_ptr<EventRecord> record = event->Latest();
    if (!record) return PH_SUCCESS;
    ph_status_t failure = PH_SUCCESS;
    std::string origin;
    if (!record->Reached(&failure, &origin) &&
        CurrentStream() == record->stream_identity) {
      return WaitsForItself("ph_event_synchronize",
                            "the stream that recorded the event");
    }
    record->WaitReached();
    record->Reached(&failure, &origin);
    if (failure == PH_SUCCESS) return PH_SUCCESS;
    return Fail(failure, CarriedByEvent(*record, origin));
  });
}

ph_status_t ph_event_elapsed_time(ph_event_t start_handle,
                                  ph_event_t end_handle, float* out_ms) {
  return Guarded("ph_event_elapsed_time", [&] {
    if (out_ms == nullptr) return NullOut("ph_event_elapsed_time", "out_ms");
    *out_ms = 0.0f;
    std::shared_ptr<Event> start;
    std::shared_ptr<Event> end;
    ph_status_t status = GetEvent("ph_event_elapsed_time", start_handle, &start);
    if (status != PH_SUCCESS) return status;
    status = GetEvent("ph_event_elapsed_time", end_handle, &end);
    if (status != PH_SUCCESS) return status;
    if (((start->flags | end->flags) & PH_EVENT_DISABLE_TIMING) != 0) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  "ph_event_elapsed_time: an event was created with "
                  "PH_EVENT_DISABLE_TIMING");
    }
    std::shared_ptr<EventRecord> first = start->Latest();
    std::shared_ptr<EventRecord> second = end->Latest();
    if (!first || !second) {
      return Fail(PH_ERROR_INVALID_ARGUMENT,
                  std::string("ph_event_elapsed_time: the ") +
                      (!first ? "start" : "end") +
                      " event was never recorded");
    }
    std::chrono::steady_clock::time_point t0;
    std::chrono::steady_clock::time_point t1;
    {
      std::lock_guard<std::mutex> lock(first->mutex);
      if (!first->reached.load()) return PH_NOT_READY;
      t0 = first->time;
    }
    {
      std::lock_guard<std::mutex> lock(second->mutex);
      if (!second->reached.load()) return PH_NOT_READY;
      t1 = second->time;
    }
    *out_ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
    return PH_SUCCESS;
  });
}

}  // extern "C"
