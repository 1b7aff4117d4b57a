// Registry of live handles (streams, events).
//
// A handle given to callers is an opaque number, not the object's address:
// ids come from a 64-bit counter and are never reused, so a destroyed
// handle, a handle of the other kind or a made-up value is always detected
// and answered with PH_ERROR_INVALID_HANDLE, never dereferenced. (Pointers
// as handles would let a new object reuse a destroyed one's address.)
//
// Objects are held by shared_ptr: a call in progress keeps its object alive
// even if another thread destroys the handle meanwhile, and queued work can
// keep referring to an event after ph_event_destroy.
//
// Locking: one mutex per registry, held only for the map operation.
#ifndef PHANTOM_FAKE_HANDLE_REGISTRY_H_
#define PHANTOM_FAKE_HANDLE_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace phantom::fake {

template <typename Object>
class HandleRegistry {
 public:
  // `tag` (1..15) goes in the low bits so stream and event ids never
  // coincide even when both counters agree.
  explicit HandleRegistry(uintptr_t tag) : tag_(tag) {}

  uintptr_t Add(std::shared_ptr<Object> object) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uintptr_t id = (next_++ << 4) | tag_;
    objects_.emplace(id, std::move(object));
    return id;
  }

  std::shared_ptr<Object> Find(uintptr_t id) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(id);
    return it == objects_.end() ? nullptr : it->second;
  }

  // Removes and returns the object (null if unknown), so exactly one of
  // several concurrent destroyers wins.
  std::shared_ptr<Object> Remove(uintptr_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(id);
    if (it == objects_.end()) return nullptr;
    std::shared_ptr<Object> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

  std::vector<std::shared_ptr<Object>> All() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<Object>> all;
    all.reserve(objects_.size());
    for (const auto& entry : objects_) all.push_back(entry.second);
    return all;
  }

 private:
  const uintptr_t tag_;
  mutable std::mutex mutex_;  // guards next_ and objects_
  uintptr_t next_ = 1;
  std::unordered_map<uintptr_t, std::shared_ptr<Object>> objects_;
};

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_HANDLE_REGISTRY_H_
