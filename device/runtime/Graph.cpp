// torch's at::GraphImplInterface for phantom (torch.accelerator.Graph,
// torch.phantom.Graph): capture on the current stream with the HAL's
// capture section, replay with one ph_graph_launch. See phantom/Graph.h.
//
// Memory: capture_begin makes the capturing stream's allocations come from
// the graph's pool (PrivatePool.cpp) until capture_end; reset() gives the
// pool back. Work a capture cannot record (an op that must wait for its
// result, a synchronize) is refused by the driver with
// PH_ERROR_STREAM_CAPTURE_UNSUPPORTED, raised at the op; the capture is
// then invalidated, and capture_end raises and leaves the graph empty, so
// the program can capture again.
#include <phantom/Exception.h>
#include <phantom/Graph.h>
#include <phantom/DeviceWork.h>
#include <phantom/Stream.h>

#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <cstdio>
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
    const ph_status_t status = ph_stream_begin_capture(handle_, halMode(mode));
    if (status != PH_SUCCESS) {
      graphPoolEndCapture(stream.device_index(), stream.id());
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
    capturing_ = false;
    if (status != PH_SUCCESS) {
      // The capture gave nothing: release its memory so the program can
      // go on (and capture again after reset()).
      const std::string message = ph_last_error_message();
      hostExecHooks().release_finished_work();
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
  const bool keep_graph_;
  bool debug_ = false;
  bool capturing_ = false;
  PhantomStream stream_ = getDefaultPhantomStream();
  ph_stream_t handle_ = nullptr;
  ph_graph_t graph_ = nullptr;
  ph_graph_exec_t exec_ = nullptr;
  c10::MempoolId_t pool_{0, 0};
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
