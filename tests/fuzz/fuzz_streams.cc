// The fuzzer's stream, event and host-task operations (fuzz_model.h):
// streams and events created, destroyed, queried, synchronized and waited
// on with live, destroyed, null and wrong-kind handles; host tasks that
// fail on purpose or write device memory through the kernel view, launched
// or run and waited for. The model follows hal.h's error model: a failing
// task makes its stream sticky, an event recorded after it carries the
// failure, a stream waiting on that event inherits it.
#include "fuzz_model.h"

namespace hal_fuzz {

/* ---- Streams and events ------------------------------------------------- */

void Program::StreamCreate(Input& in) {
  bool valid = true;
  const int device = PickDevice(in, &valid);
  const int priority = static_cast<int>(in.U32());
  if (streams_.size() >= kMaxStreams) return;
  ph_stream_t handle = reinterpret_cast<ph_stream_t>(0x1);
  const ph_status_t status = ph_stream_create(device, priority, &handle);
  if (!valid) {
    Expect("ph_stream_create on a bad device", status,
           {PH_ERROR_INVALID_DEVICE});
    if (handle != nullptr) Violation("ph_stream_create left a handle");
    return;
  }
  Expect("ph_stream_create", status, {PH_SUCCESS});
  int got_device = -1, got_priority = 99;
  Expect("ph_stream_get_device", ph_stream_get_device(handle, &got_device),
         {PH_SUCCESS});
  Expect("ph_stream_get_priority",
         ph_stream_get_priority(handle, &got_priority), {PH_SUCCESS});
  ph_device_properties_t props;
  props.struct_size = sizeof props;
  Expect("ph_device_get_properties", ph_device_get_properties(device, &props),
         {PH_SUCCESS});
  const int high = props.stream_priority_high, low = props.stream_priority_low;
  const int clamped = priority < high ? high : priority > low ? low : priority;
  if (got_device != device || got_priority != clamped) {
    Violation("stream created on device %d with priority %d reports device "
              "%d, priority %d (expected %d)",
              device, priority, got_device, got_priority, clamped);
  }
  auto stream = std::make_shared<StreamModel>();
  stream->handle = handle;
  stream->device = device;
  streams_.push_back(stream);
}

void Program::StreamDestroy(Input& in) {
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const ph_status_t status = ph_stream_destroy(handle);
  if (!stream) {
    Expect("ph_stream_destroy of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_stream_destroy", status, {PH_SUCCESS});
  // Destroy waited for the queued work.
  for (auto& buffer : buffers_) {
    if (buffer->pending == stream) buffer->pending = nullptr;
  }
  for (auto it = streams_.begin(); it != streams_.end(); ++it) {
    if (*it == stream) {
      streams_.erase(it);
      break;
    }
  }
  dead_streams_.push_back(handle);
  Expect("ph_stream_query of a destroyed stream", ph_stream_query(handle),
         {PH_ERROR_INVALID_HANDLE});
}

void Program::StreamQuery(Input& in) {
  if (worker_ && in.U8() % 4 == 0 && !foreign_streams_.empty()) {
    // Another thread's stream, which it may destroy at any time.
    const ph_status_t status = ph_stream_query(
        foreign_streams_[in.Below(foreign_streams_.size())]);
    Expect("ph_stream_query of the other thread's stream", status,
           {PH_SUCCESS, PH_NOT_READY, PH_ERROR_INVALID_HANDLE,
            PH_ERROR_INVALID_ARGUMENT, PH_ERROR_OUT_OF_MEMORY,
            PH_ERROR_DEVICE, PH_ERROR_UNIMPLEMENTED});
    return;
  }
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const ph_status_t status = ph_stream_query(handle);
  if (!stream) {
    Expect("ph_stream_query of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  if (stream->doom == PH_SUCCESS) {
    Expect("ph_stream_query", status, {PH_SUCCESS, PH_NOT_READY});
  } else {
    Expect("ph_stream_query of a failing stream", status,
           {PH_NOT_READY, stream->doom});
  }
  int device = -1;
  Expect("ph_stream_get_device", ph_stream_get_device(handle, &device),
         {PH_SUCCESS});
  if (device != stream->device) Violation("ph_stream_get_device changed");
}

void Program::StreamSync(Input& in) {
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  if (!stream) {
    Expect("ph_stream_synchronize of a bad handle",
           ph_stream_synchronize(handle), {PH_ERROR_INVALID_HANDLE});
    int device = 7;
    Expect("ph_stream_get_device of a bad handle",
           ph_stream_get_device(handle, &device), {PH_ERROR_INVALID_HANDLE});
    if (device != 0) Violation("ph_stream_get_device did not clear *out");
    return;
  }
  SyncStream(stream);
}

void Program::StreamWaitEvent(Input& in) {
  StreamRef stream;
  const ph_stream_t stream_handle = PickStreamHandle(in, &stream);
  EventModel* event = nullptr;
  ph_event_t event_handle = PickEventHandle(in, &event);
  if (worker_ && in.U8() % 3 == 0 && !foreign_events_.empty()) {
    // The other thread's event may carry a failure this model cannot know,
    // so the wait goes on a scratch stream, destroyed (with whatever it
    // inherited) once the wait has completed.
    ph_stream_t scratch = nullptr;
    Expect("ph_stream_create", ph_stream_create(0, 0, &scratch), {PH_SUCCESS});
    Expect("ph_stream_wait_event on the other thread's event",
           ph_stream_wait_event(
               scratch, foreign_events_[in.Below(foreign_events_.size())]),
           {PH_SUCCESS, PH_ERROR_INVALID_HANDLE});
    Expect("ph_stream_destroy", ph_stream_destroy(scratch), {PH_SUCCESS});
    return;
  }
  const ph_status_t status = ph_stream_wait_event(stream_handle, event_handle);
  if (!stream || !event) {
    Expect("ph_stream_wait_event with a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_stream_wait_event", status, {PH_SUCCESS});
  // hal.h: the work queued after the wait fails with what the record
  // carries.
  if (event->recorded_on && stream->doom == PH_SUCCESS) {
    stream->doom = event->doom;
  }
}

void Program::EventCreate(Input& in) {
  const uint8_t mode = in.U8();
  unsigned flags = mode % 3 == 0 ? PH_EVENT_DISABLE_TIMING : PH_EVENT_DEFAULT;
  const bool bad = mode % 7 == 6;
  if (bad) flags = 2u << (mode % 30);
  if (events_.size() >= kMaxEvents && !bad) return;
  ph_event_t handle = reinterpret_cast<ph_event_t>(0x1);
  const ph_status_t status = ph_event_create(flags, &handle);
  if (bad) {
    Expect("ph_event_create with unknown flags", status,
           {PH_ERROR_INVALID_ARGUMENT});
    if (handle != nullptr) Violation("ph_event_create left a handle");
    return;
  }
  Expect("ph_event_create", status, {PH_SUCCESS});
  auto event = std::make_unique<EventModel>();
  event->handle = handle;
  event->flags = flags;
  event->reached = true;  // never recorded: queries say reached
  events_.push_back(std::move(event));
}

void Program::EventDestroy(Input& in) {
  EventModel* event = nullptr;
  const ph_event_t handle = PickEventHandle(in, &event);
  const ph_status_t status = ph_event_destroy(handle);
  if (!event) {
    Expect("ph_event_destroy of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_event_destroy", status, {PH_SUCCESS});
  dead_events_.push_back(handle);
  for (auto it = events_.begin(); it != events_.end(); ++it) {
    if (it->get() == event) {
      events_.erase(it);
      break;
    }
  }
}

void Program::EventRecord(Input& in) {
  EventModel* event = nullptr;
  const ph_event_t event_handle = PickEventHandle(in, &event);
  StreamRef stream;
  const ph_stream_t stream_handle = PickStreamHandle(in, &stream);
  const ph_status_t status = ph_event_record(event_handle, stream_handle);
  if (!event || !stream) {
    Expect("ph_event_record with a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  Expect("ph_event_record", status, {PH_SUCCESS});
  event->recorded_on = stream;
  event->record_seq = ++stream->records;
  event->reached = false;
  event->doom = stream->doom;
}

void Program::EventQuery(Input& in) {
  if (worker_ && in.U8() % 4 == 0 && !foreign_events_.empty()) {
    Expect("ph_event_query of the other thread's event",
           ph_event_query(foreign_events_[in.Below(foreign_events_.size())]),
           {PH_SUCCESS, PH_NOT_READY, PH_ERROR_INVALID_HANDLE,
            PH_ERROR_INVALID_ARGUMENT, PH_ERROR_OUT_OF_MEMORY,
            PH_ERROR_DEVICE, PH_ERROR_UNIMPLEMENTED});
    return;
  }
  EventModel* event = nullptr;
  const ph_event_t handle = PickEventHandle(in, &event);
  const ph_status_t status = ph_event_query(handle);
  if (!event) {
    Expect("ph_event_query of a bad handle", status, {PH_ERROR_INVALID_HANDLE});
  } else if (event->reached) {
    Expect("ph_event_query of a reached event", status, {event->doom});
  } else {
    Expect("ph_event_query", status, {event->doom, PH_NOT_READY});
    if (status == event->doom) event->reached = true;
  }
}

void Program::EventSync(Input& in) {
  EventModel* event = nullptr;
  const ph_event_t handle = PickEventHandle(in, &event);
  const ph_status_t status = ph_event_synchronize(handle);
  if (!event) {
    Expect("ph_event_synchronize of a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
    return;
  }
  // Exactly the failure before the record, not one queued after it.
  Expect("ph_event_synchronize", status, {event->doom});
  event->reached = true;
  Expect("ph_event_query after ph_event_synchronize",
         ph_event_query(handle), {event->doom});
}

void Program::EventElapsed(Input& in) {
  EventModel* start = nullptr;
  EventModel* end = nullptr;
  const ph_event_t start_handle = PickEventHandle(in, &start);
  const ph_event_t end_handle = PickEventHandle(in, &end);
  float ms = -12345.0f;
  const ph_status_t status =
      ph_event_elapsed_time(start_handle, end_handle, &ms);
  if (!start || !end) {
    Expect("ph_event_elapsed_time with a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
  } else if (((start->flags | end->flags) & PH_EVENT_DISABLE_TIMING) != 0 ||
             !start->recorded_on || !end->recorded_on) {
    Expect("ph_event_elapsed_time without timing or records", status,
           {PH_ERROR_INVALID_ARGUMENT});
  } else if (start->reached && end->reached) {
    Expect("ph_event_elapsed_time of reached events", status, {PH_SUCCESS});
  } else {
    Expect("ph_event_elapsed_time", status, {PH_SUCCESS, PH_NOT_READY});
  }
  if (status != PH_SUCCESS) {
    if (ms != 0.0f) Violation("ph_event_elapsed_time did not clear *out_ms");
    return;
  }
  if (start->recorded_on == end->recorded_on &&
      start->record_seq <= end->record_seq && ms < 0.0f) {
    Violation("ph_event_elapsed_time of two records in stream order gave "
              "%f ms",
              ms);
  }
}

void Program::Launch(Input& in) {
  StreamRef stream;
  const ph_stream_t handle = PickStreamHandle(in, &stream);
  const uint8_t mode = in.U8();
  auto probe = std::make_unique<TaskProbe>();
  probe->own = handle;
  probe->device = stream ? stream->device : 0;
  static const ph_status_t kFailures[] = {
      PH_ERROR_DEVICE, PH_ERROR_INVALID_ARGUMENT, PH_ERROR_OUT_OF_MEMORY,
      PH_ERROR_UNIMPLEMENTED, PH_NOT_READY, static_cast<ph_status_t>(42)};
  if (mode % 8 == 0) probe->result = kFailures[(mode >> 3) % 6];
  BufferRef target;
  if (mode % 8 >= 4 && stream) {
    // Write a device buffer through the kernel view.
    target = PickBuffer(in, BufferKind::kDevice);
    if (target && target->window > 0) {
      const size_t offset = in.Below(target->window);
      probe->fill_ptr = target->ptr + offset;
      probe->fill_size = 1 + in.Below(target->window - offset);
      probe->fill_byte = in.U8();
      Settle(*target, stream);
    } else {
      target = nullptr;
    }
  }
  const bool null_run = mode == 0xff;
  ph_host_task_t task{"fuzz task", null_run ? nullptr : TaskRun, TaskRelease,
                      probe.get()};
  if (mode & 0x40) task.name = nullptr;
  probe->may_skip = stream && stream->doom != PH_SUCCESS;
  // Some tasks are run and waited for (ph_run_host_func) instead of queued.
  if ((mode & 0x20) && !null_run && stream) {
    RunNow(stream, handle, task, std::move(probe), target);
    return;
  }
  const ph_status_t status = ph_launch_host_func(handle, &task);
  if (null_run) {
    Expect("ph_launch_host_func with a NULL run", status,
           {PH_ERROR_INVALID_ARGUMENT});
  } else if (!stream) {
    Expect("ph_launch_host_func on a bad handle", status,
           {PH_ERROR_INVALID_HANDLE});
  } else {
    Expect("ph_launch_host_func", status, {PH_SUCCESS, stream->doom});
  }
  if (status != PH_SUCCESS) {
    if (probe->releases.load() != 1 || probe->runs.load() != 0) {
      Violation("ph_launch_host_func returned %s but the task ran %d times "
                "and was released %d times (expected 0 and 1)",
                ph_status_name(status), probe->runs.load(),
                probe->releases.load());
    }
  } else {
    probe->accepted = true;
    if (probe->result != PH_SUCCESS && stream->doom == PH_SUCCESS) {
      stream->doom = AsStickyStatus(probe->result);
    }
    if (target) {
      for (size_t i = 0; i < probe->fill_size; ++i) {
        const size_t at = probe->fill_ptr - target->ptr + i;
        target->shadow[at] = probe->fill_byte;
        target->known[at] = !probe->may_skip && probe->result == PH_SUCCESS;
      }
    }
  }
  probes_.push_back(std::move(probe));
}

// ph_run_host_func: the task has run (or been refused) and been released
// by the time the call returns, in stream order.
void Program::RunNow(const StreamRef& stream, ph_stream_t handle,
                     const ph_host_task_t& task,
                     std::unique_ptr<TaskProbe> probe, const BufferRef& target) {
  const ph_status_t doom_before = stream->doom;
  const ph_status_t status = ph_run_host_func(handle, &task);
  const ph_status_t own_failure = AsStickyStatus(probe->result);
  if (doom_before != PH_SUCCESS) {
    Expect("ph_run_host_func on a failed stream", status, {doom_before});
  } else if (probe->result != PH_SUCCESS) {
    Expect("ph_run_host_func of a failing task", status, {own_failure});
  } else {
    Expect("ph_run_host_func", status, {PH_SUCCESS});
  }
  const int expected_runs = doom_before == PH_SUCCESS ? 1 : 0;
  if (probe->runs.load() != expected_runs || probe->releases.load() != 1) {
    Violation("ph_run_host_func returned %s but the task ran %d times and "
              "was released %d times (expected %d and 1)",
              ph_status_name(status), probe->runs.load(),
              probe->releases.load(), expected_runs);
  }
  if (doom_before == PH_SUCCESS && probe->result != PH_SUCCESS) {
    stream->doom = own_failure;
  }
  if (target) {
    const bool wrote = doom_before == PH_SUCCESS && probe->result == PH_SUCCESS;
    for (size_t i = 0; i < probe->fill_size; ++i) {
      const size_t at = probe->fill_ptr - target->ptr + i;
      if (wrote) {
        target->shadow[at] = probe->fill_byte;
        target->known[at] = true;
      }
    }
  }
  probes_.push_back(std::move(probe));
}

}  // namespace hal_fuzz
