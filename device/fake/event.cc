// Event records and the event registry; see event.h.
#include "event.h"

#include "handle_registry.h"
#include "spin_wait.h"

namespace phantom::fake {
namespace {

HandleRegistry<Event>& Events() {
  static auto* registry = new HandleRegistry<Event>(0xE);  // leaked at exit
  return *registry;
}

}  // namespace

void EventRecord::MarkTime() {
  std::lock_guard<std::mutex> lock(mutex);
  time = std::chrono::steady_clock::now();
}

void EventRecord::MarkReached(ph_status_t failure_before,
                              const std::string& failure_origin) {
  std::lock_guard<std::mutex> lock(mutex);
  failure = failure_before;
  if (failure_before != PH_SUCCESS) origin = failure_origin;
  reached = true;
  reached_changed.notify_all();
}

bool EventRecord::Reached(ph_status_t* out_failure, std::string* out_origin) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!reached.load()) return false;
  *out_failure = failure;
  if (failure != PH_SUCCESS) *out_origin = origin;
  return true;
}

std::string InheritedByWait(const EventRecord& record,
                            const std::string& origin) {
  return "this stream waited for an event recorded on phantom device " +
         std::to_string(record.device) +
         " after work that failed, so its work queued after that wait was "
         "discarded (the failure is inherited through the event); the "
         "original error: " +
         origin;
}

std::string CarriedByEvent(const EventRecord& record,
                           const std::string& origin) {
  return "the event was recorded on phantom device " +
         std::to_string(record.device) +
         " after work that failed; the original error: " + origin;
}

void EventRecord::WaitReached() {
  if (SpinUntil([this] { return reached.load(std::memory_order_acquire); })) {
    return;
  }
  std::unique_lock<std::mutex> lock(mutex);
  reached_changed.wait(lock, [this] { return reached.load(); });
}

std::shared_ptr<EventRecord> Event::Latest() {
  std::lock_guard<std::mutex> lock(mutex);
  return latest;
}

ph_event_t RegisterEvent(std::shared_ptr<Event> event) {
  return reinterpret_cast<ph_event_t>(Events().Add(std::move(event)));
}

std::shared_ptr<Event> FindEvent(ph_event_t handle) {
  return Events().Find(reinterpret_cast<uintptr_t>(handle));
}

std::shared_ptr<Event> UnregisterEvent(ph_event_t handle) {
  return Events().Remove(reinterpret_cast<uintptr_t>(handle));
}

}  // namespace phantom::fake
