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

void EventRecord::MarkReached() {
  std::lock_guard<std::mutex> lock(mutex);
  reached = true;
  reached_changed.notify_all();
}

bool EventRecord::IsReached() {
  std::lock_guard<std::mutex> lock(mutex);
  return reached.load();
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
