// torch's at::GraphImplInterface for phantom (torch.accelerator.Graph,
// torch.phantom.Graph): capture on the current stream with the HAL's
// capture section, replay with one ph_graph_launch. See phantom/Graph.h.
//
// Memory: capture_begin makes the capturing stream's allocations come from
// the graph's pool (PrivatePool.cpp) until capture_end; reset() gives the
// pool back. The pinned host allocator is told the same, through the pool
// hooks of torch's caching host allocator: pinned blocks allocated while
// the capture's streams are current come from the graph's host pool, and
// one the captured work used is never handed out again (its replays read
// it), until reset() releases the pool. Work a capture cannot record (an op that must wait for its
// result, a synchronize) is refused by the driver with
// PH_ERROR_STREAM_CAPTURE_UNSUPPORTED, raised at the op; the capture is
// then invalidated, and capture_end raises and leaves the graph empty, so
// the program can capture again.
#include <phantom/Exception.h>
#include <phantom/Graph.h>
#include <phantom/HostAllocator.h>
#include <phantom/DeviceWork.h>
#include <phantom/Stream.h>

#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

namespace phantom {
namespace {

ph_capture_mode_t halMode(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal:
      return PH_CAPTURE_MODE_THREAD_LOCAL;
    case at::GraphCaptureMode::Relaxed:
      return PH_CAPTURE_MODE_RELAXED;
    default:  // Default and Global: CUDA's default is global
      return PH_CAPTURE_MODE_GLOBAL;
  }
}

// The capture id of `stream` if it is capturing, else 0.
uint64_t captureIdOf(const c10::Stream& stream) noexcept {
  try {
    ph_capture_status_t status = PH_CAPTURE_STATUS_NONE;
    uint64_t id = 0;
    if (ph_stream_get_capture_info(PhantomStream(stream).handle(), &status,
                                   &id) == PH_SUCCESS &&
        status != PH_CAPTURE_STATUS_NONE) {
      return id;
    }
  } catch (...) {
    // Not a phantom stream: not part of any capture.
  }
  return 0;
}

class PhantomGraphImpl final : public at::GraphImplInterface {
 public:
  explicit PhantomGraphImpl(const at::GraphImplArgs& args)
      : keep_graph_(args.keep_graph) {}
  ~PhantomGraphImpl() override {
    try {
      reset();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phantom: destroying a graph failed: %s\n",
                   e.what());
    }
  }

  void capture_begin(c10::MempoolId_t pool,
                     at::GraphCaptureMode mode) override {
    TORCH_CHECK(!capturing_ && graph_ == nullptr && exec_ == nullptr,
                c10::get_privateuse1_backend(),
                " graph: this graph already holds a capture; call reset() "
                "before capturing again");
    const PhantomStream stream = getCurrentPhantomStream();
    pool_ = (pool.first != 0 || pool.second != 0) ? pool
                                                  : newPrivatePoolId(false);
    stream_ = stream;
    handle_ = stream.handle();
    graphPoolBeginCapture(pool_, stream.device_index(), stream.id());
    // Pinned blocks allocated while the capturing stream, or a stream that
    // joined the capture, is current: the capture id is known once the
    // capture has begun, so the filter reads it then.
    capture_id_ = std::make_shared<std::atomic<uint64_t>>(0);
    phantomHostAllocator()->begin_allocate_to_pool(
        pool_, [stream, capture_id = capture_id_](c10::Stream current) {
          if (current == stream.unwrap()) return true;
          const uint64_t ours = capture_id->load(std::memory_order_relaxed);
          return ours != 0 && captureIdOf(current) == ours;
        });
    host_pool_held_ = true;
    const ph_status_t status = ph_stream_begin_capture(handle_, halMode(mode));
    if (status != PH_SUCCESS) {
      graphPoolEndCapture(stream.device_index(), stream.id());
      endHostPoolCapture();
      releaseHostPool();
      privatePoolRelease(pool_);
      TORCH_CHECK_NOT_IMPLEMENTED(
          status != PH_ERROR_UNIMPLEMENTED,
          c10::get_privateuse1_backend(),
          ": the device driver cannot capture graphs (its HAL "
          "returns PH_ERROR_UNIMPLEMENTED from ph_stream_begin_capture); run "
          "the work eagerly");
      PHANTOM_CHECK(status);
    }
    capturing_ = true;
    ph_capture_status_t capture_status = PH_CAPTURE_STATUS_NONE;
    uint64_t capture_id = 0;
    if (ph_stream_get_capture_info(handle_, &capture_status, &capture_id) ==
        PH_SUCCESS) {
      graphPoolBindCaptureId(stream.device_index(), stream.id(), capture_id);
      capture_id_->store(capture_id, std::memory_order_relaxed);
    }
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, c10::get_privateuse1_backend(),
                " graph: capture_end() without capture_begin()");
    const PhantomStream current = getCurrentPhantomStream(stream_.device_index());
    TORCH_CHECK(current == stream_,
                c10::get_privateuse1_backend(),
                " graph: capture_end() must be called on the stream "
                "capture_begin() was called on (stream_id=", stream_.id(),
                "), not stream_id=", current.id());
    ph_graph_t graph = nullptr;
    const ph_status_t status = ph_stream_end_capture(handle_, &graph);
    graphPoolEndCapture(stream_.device_index(), stream_.id());
    endHostPoolCapture();
    capturing_ = false;
    if (status != PH_SUCCESS) {
      // The capture gave nothing: release its memory so the program can
      // go on (and capture again after reset()).
      const std::string message = ph_last_error_message();
      hostExecHooks().release_finished_work();
      releaseHostPool();
      privatePoolRelease(pool_);
      pool_ = {0, 0};
      TORCH_CHECK(false, c10::get_privateuse1_backend(),
                  " graph: the capture failed and was discarded: ", message);
    }
    graph_ = graph;
    if (!keep_graph_) instantiate();
  }

  void instantiate() override {
    TORCH_CHECK(graph_ != nullptr,
                c10::get_privateuse1_backend(),
                " graph: nothing to instantiate; capture first");
    if (exec_ != nullptr) {
      PHANTOM_CHECK(ph_graph_exec_destroy(exec_));
      exec_ = nullptr;
    }
    PHANTOM_CHECK(ph_graph_instantiate(graph_, &exec_));
    if (!keep_graph_ && !debug_) {
      PHANTOM_CHECK(ph_graph_destroy(graph_));
      graph_ = nullptr;
    }
  }

  void replay() override {
    if (exec_ == nullptr && graph_ != nullptr) instantiate();
    TORCH_CHECK(exec_ != nullptr,
                c10::get_privateuse1_backend(),
                " graph: replay() needs a successful capture "
                "(capture_begin() ... capture_end()) first");
    // A profiler sees the replay as an op, and the device work of each
    // node (hal_activity.h) is linked to it.
    RECORD_FUNCTION("phantom::graph_replay", c10::ArrayRef<c10::IValue>{});
    const PhantomStream stream = getCurrentPhantomStream(stream_.device_index());
    const ph_stream_t handle = stream.handle();
    stream.check(ph_graph_launch(exec_, handle), handle);
  }

  void reset() override {
    if (capturing_) {
      ph_graph_t graph = nullptr;
      (void)ph_stream_end_capture(handle_, &graph);
      if (graph != nullptr) (void)ph_graph_destroy(graph);
      graphPoolEndCapture(stream_.device_index(), stream_.id());
      endHostPoolCapture();
      capturing_ = false;
    }
    const bool had_pool = pool_.first != 0 || pool_.second != 0;
    if (exec_ != nullptr || graph_ != nullptr) {
      // Replays still queued use the pool's memory.
      stream_.synchronize();
    }
    if (exec_ != nullptr) (void)ph_graph_exec_destroy(exec_);
    if (graph_ != nullptr) (void)ph_graph_destroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
    hostExecHooks().release_finished_work();  // the recorded work's tensors die now
    releaseHostPool();
    if (had_pool) privatePoolRelease(pool_);
    pool_ = {0, 0};
  }

  c10::MempoolId_t pool() const override { return pool_; }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_,
                c10::get_privateuse1_backend(),
                " graph: debug_dump() needs enable_debug_mode() before the "
                "capture (the graph is kept only then)");
    TORCH_CHECK(graph_ != nullptr,
                c10::get_privateuse1_backend(),
                " graph: debug_dump() needs a captured graph");
    PHANTOM_CHECK(ph_graph_debug_dump(graph_, path.c_str()));
  }

 private:
  // Stops routing pinned allocations to the graph's host pool.
  void endHostPoolCapture() {
    if (capture_id_ == nullptr) return;
    capture_id_ = nullptr;
    phantomHostAllocator()->end_allocate_to_pool(pool_);
  }

  // Gives the graph's host pool back (its blocks are freed with the
  // allocator's cache once no graph uses the pool).
  void releaseHostPool() {
    if (!host_pool_held_) return;
    host_pool_held_ = false;
    phantomHostAllocator()->release_pool(pool_);
  }

  const bool keep_graph_;
  bool debug_ = false;
  bool capturing_ = false;
  PhantomStream stream_ = getDefaultPhantomStream();
  ph_stream_t handle_ = nullptr;
  ph_graph_t graph_ = nullptr;
  ph_graph_exec_t exec_ = nullptr;
  c10::MempoolId_t pool_{0, 0};
  // Set from capture_begin to capture_end: the capture id the host pool's
  // filter compares streams with.
  std::shared_ptr<std::atomic<uint64_t>> capture_id_;
  bool host_pool_held_ = false;
};

}  // namespace

bool isStreamCapturing(const c10::Stream& stream) {
  ph_capture_status_t status = PH_CAPTURE_STATUS_NONE;
  uint64_t id = 0;
  const ph_status_t answered =
      ph_stream_get_capture_info(PhantomStream(stream).handle(), &status, &id);
  if (answered == PH_ERROR_UNIMPLEMENTED) return false;
  PHANTOM_CHECK(answered);
  return status != PH_CAPTURE_STATUS_NONE;
}

}  // namespace phantom

namespace at {
// The registry's key is c10::DeviceTypeName(PrivateUse1, false): the
// backend's name in capitals once renamed, "PRIVATEUSEONE" before.
C10_REGISTER_TYPED_CLASS(GraphImplRegistry, "PHANTOM",
                         phantom::PhantomGraphImpl)
C10_REGISTER_TYPED_CLASS(GraphImplRegistry, "PRIVATEUSEONE",
                         phantom::PhantomGraphImpl)
}  // namespace at
