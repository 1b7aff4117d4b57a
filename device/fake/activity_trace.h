// The activity trace (hal_activity.h): what the fake's stream workers ran,
// and when, while tracing is on.
//
// Off (the common case) it costs one relaxed load per task: the nest
// count `enabled`. A build with the CMake option PHANTOM_FAKE_ACTIVITY_TRACE
// OFF (the compile definition PHANTOM_FAKE_ACTIVITY_TRACE=0) has no trace
// at all: On() is a constant false, so the per-task load and the
// recording code compile away, the driver table leaves the section's
// members NULL (the HAL's OPTIONAL section absent) and the section's entry
// points answer PH_ERROR_UNIMPLEMENTED saying so. That build exists to
// measure what the load costs (bench/bench_profiler.py --trace-off-cost).
// On, a task's worker reads the clock before and after the task and
// appends a record under one mutex; records wait in a
// bounded deque (kMaxRecords; past it new ones are dropped and counted)
// until ph_activity_flush moves them out. The correlation id of a task is
// taken from the launching thread's stack when the task is queued
// (Stream::Enqueue, Stream::RunNow). Times are the steady clock's
// nanoseconds (NowNs in activity.h), which ph_activity_get_timestamp
// reads too.
#ifndef PHANTOM_FAKE_ACTIVITY_TRACE_H_
#define PHANTOM_FAKE_ACTIVITY_TRACE_H_

#include <phantom/hal.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace phantom::fake::trace {

constexpr size_t kMaxRecords = size_t{1} << 20;

#ifndef PHANTOM_FAKE_ACTIVITY_TRACE
#define PHANTOM_FAKE_ACTIVITY_TRACE 1
#endif

// Whether this build has the trace (the CMake option above).
constexpr bool kBuiltIn = PHANTOM_FAKE_ACTIVITY_TRACE != 0;

extern std::atomic<int> g_enabled;

#if PHANTOM_FAKE_ACTIVITY_TRACE
inline bool On() {
  return __builtin_expect(g_enabled.load(std::memory_order_relaxed) > 0, 0);
}
#else
constexpr bool On() { return false; }
#endif

// PH_ERROR_UNIMPLEMENTED with the sentence that `call` is missing from
// this build and how to get it back (kBuiltIn false only).
ph_status_t NotBuiltIn(const char* call);

// The top of the calling thread's correlation stack (0 when empty).
uint64_t CurrentCorrelation();

// Appends one record (drops and counts it past kMaxRecords).
void Record(const ph_activity_record_t& record);

ph_status_t Enable();
ph_status_t Disable();
ph_status_t PushCorrelation(uint64_t id);
ph_status_t PopCorrelation();
ph_status_t Flush(void* records, size_t record_size, size_t capacity,
                  size_t* out_count, uint64_t* out_dropped);

}  // namespace phantom::fake::trace

#endif  // PHANTOM_FAKE_ACTIVITY_TRACE_H_
