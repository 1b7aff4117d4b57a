// See phantom/HostAllocator.h.
//
// The caching itself (free lists per power-of-two size, the queue of events
// that hold freed blocks back, statistics) is PyTorch's
// at::CachingHostAllocatorImpl. This file fills in the runtime-specific
// part: how to get and return pinned memory (ph_host_malloc / ph_host_free)
// and how to mark and query a point on a stream (a driver event created
// with PH_EVENT_DISABLE_TIMING).
#include <phantom/Exception.h>
#include <phantom/Graph.h>
#include <phantom/HostAllocator.h>
#include <phantom/DeviceWork.h>
#include <phantom/HostGuard.h>

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

namespace phantom {
namespace {

// A driver event that marks the point on a stream after which a freed
// pinned block may be reused. Move-only; destroys its driver event.
class HostEvent {
 public:
  HostEvent() = default;
  HostEvent(const HostEvent&) = delete;
  HostEvent& operator=(const HostEvent&) = delete;
  HostEvent(HostEvent&& other) noexcept
      : event_(std::exchange(other.event_, nullptr)) {}
  HostEvent& operator=(HostEvent&& other) noexcept {
    if (this != &other) {
      destroy();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  ~HostEvent() { destroy(); }

  // Marks the current end of `stream`'s queue. Never throws (it runs in a
  // deleter): if the driver refuses, waits for the stream instead, so that
  // the block is still never reused while queued work may touch it.
  void record(ph_stream_t stream) noexcept {
    if (event_ == nullptr &&
        ph_event_create(PH_EVENT_DISABLE_TIMING, &event_) != PH_SUCCESS) {
      event_ = nullptr;
    }
    if (event_ != nullptr && ph_event_record(event_, stream) == PH_SUCCESS) {
      return;
    }
    // A stream with a sticky error runs no more work, and synchronize
    // returns once the work already running has finished.
    (void)ph_stream_synchronize(stream);
  }

  // True once the recorded point has been reached. A driver error (the
  // event is gone) counts as reached: nothing waits on it any more.
  bool query() const noexcept {
    return event_ == nullptr || ph_event_query(event_) != PH_NOT_READY;
  }

 private:
  void destroy() noexcept {
    if (event_ != nullptr) {
      (void)ph_event_destroy(event_);
      event_ = nullptr;
    }
  }

  ph_event_t event_ = nullptr;
};

using Block = at::HostBlock<c10::Stream>;

struct PhantomHostAllocatorImpl final
    : public at::CachingHostAllocatorImpl<c10::Stream, HostEvent> {
 private:
  void allocate_host_memory(size_t size, void** ptr) override {
    const auto start = std::chrono::steady_clock::now();
    ph_status_t status = ph_host_malloc(size, ptr);
    if (status == PH_ERROR_OUT_OF_MEMORY) {
      // Cached blocks of other sizes may be what is in the way.
      empty_cache();
      status = ph_host_malloc(size, ptr);
    }
    PHANTOM_CHECK(status);
    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
    std::lock_guard<std::mutex> lock(stats_.timing_mutex_);
    stats_.host_alloc_time.increase(micros);
  }

  void free_block(Block* block) override {
    const auto start = std::chrono::steady_clock::now();
    if (ph_host_free(block->ptr_) != PH_SUCCESS) {
      // Called from deleters and empty_cache: report, never throw.
      std::fprintf(stderr, "phantom: ph_host_free(%p) failed: %s\n",
                   block->ptr_, ph_last_error_message());
    }
    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
    std::lock_guard<std::mutex> lock(stats_.timing_mutex_);
    stats_.host_free_time.increase(micros);
  }

  void record_stream(std::optional<std::vector<HostEvent>>& events,
                     c10::Stream stream) override {
    HostEvent event;
    ph_stream_t handle = nullptr;
    try {
      handle = PhantomStream(stream).handle();
    } catch (...) {
      // Not a stream this runtime knows: nothing of ours was queued on it.
      return;
    }
    event.record(handle);
    events->push_back(std::move(event));
  }

  bool query_event(HostEvent& event) override { return event.query(); }

  c10::Stream get_current_stream() const override {
    return getCurrentPhantomStream().unwrap();
  }

  // A block allocated while its stream captures is never handed out again
  // once used (the graph's replays read it); Graph.cpp routes such
  // allocations to the graph's host pool.
  bool stream_is_capturing(c10::Stream stream) const override {
    try {
      return isStreamCapturing(stream);
    } catch (...) {
      return false;  // a stream the driver no longer knows captures nothing
    }
  }

 public:
  void copy_data(void* dest, const void* src, std::size_t count)
      const override {
    std::memcpy(dest, src, count);
  }
};

void deletePinnedBlock(void* ctx);

struct PhantomHostAllocator final
    : public at::CachingHostAllocatorInterface<PhantomHostAllocatorImpl,
                                               &deletePinnedBlock> {
  c10::DeleterFnPtr raw_deleter() const override { return &deletePinnedBlock; }
};

PhantomHostAllocator& instance() {
  // Leaked on purpose: pinned tensors may be freed during static
  // destruction, after a function-local static would be gone.
  static auto* allocator = new PhantomHostAllocator();
  return *allocator;
}

void deletePinnedBlock(void* ctx) {
  // A guarded destination freed before its copy was seen to finish: the
  // block may be handed out again, so its pages must be readable.
  const Block* block = static_cast<const Block*>(ctx);
  if (block != nullptr) host_guard::releaseRange(block->ptr_, block->size_);
  instance().free(ctx);
}

}  // namespace

c10::Allocator* pinnedHostAllocator() { return &instance(); }

at::HostAllocator* phantomHostAllocator() { return &instance(); }

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &phantom::instance())

bool isPinnedPointer(const void* ptr) {
  ph_pointer_attributes_t attributes{};
  return ptr != nullptr &&
         ph_pointer_get_attributes(ptr, &attributes) == PH_SUCCESS &&
         attributes.type == PH_MEMORY_HOST_PINNED;
}

bool recordPinnedUse(void* ptr, void* ctx, const PhantomStream& stream) {
  return instance().record_event(ptr, ctx, stream.unwrap());
}

void recordPinnedUse(const c10::Storage& storage,
                     const PhantomStream& stream) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() == &deletePinnedBlock &&
      recordPinnedUse(data.get(), data.get_context(), stream)) {
    return;
  }
  // Pinned memory from elsewhere (e.g. ph_host_malloc wrapped with
  // from_blob): all we can do is keep the storage alive until the stream
  // is past the copy; what its owner does with the memory is up to them.
  hostExecHooks().launch_async(
      stream, "keep pinned memory of a non_blocking copy alive", [storage] {});
}

bool ownsPinnedBlock(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  return data.get_deleter() == &deletePinnedBlock &&
         data.get_context() != nullptr &&
         static_cast<const Block*>(data.get_context())->ptr_ == data.get();
}

void emptyHostCache() { instance().empty_cache(); }

at::HostStats hostMemoryStats() { return instance().get_stats(); }

void resetAccumulatedHostMemoryStats() {
  instance().reset_accumulated_stats();
}

void resetPeakHostMemoryStats() { instance().reset_peak_stats(); }

}  // namespace phantom
