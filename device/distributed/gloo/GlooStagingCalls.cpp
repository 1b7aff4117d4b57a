// The Gloo staging communicator, calling-thread side: building each call's
// job and handing it over (GlooStagingCommunicator.h).
#include "GlooStagingCommunicator.h"

#include <phantom/Exception.h>
#include <phantom/FaultInjection.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <tuple>

namespace phantom::gloo_staging {

const char* kindName(Kind kind) {
  switch (kind) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::Reduce: return "reduce";
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllToAll: return "all_to_all";
    case Kind::Send: return "send";
    case Kind::Recv: return "recv";
  }
  return "?";
}

namespace {

using ccl::DeviceBuffer;
using ccl::ReduceOp;

constexpr int kDataTag = 0;
constexpr int kHeaderTag = 0;
constexpr size_t kHostAlignment = 64;

// All-reduce, broadcast and reduce are cut into chunks of kChunkBytes
// (docs/performance.md, "Distributed"): the pipeline overlaps one chunk's
// copies with another's exchange, and Gloo moves a few MiB at a time
// faster than one large buffer.
constexpr size_t kChunkBytes = size_t{2} << 20;

// Jobs moving less than this stage even when zero-copy is possible: a few
// KiB cost nothing to copy, and their time is the hand-overs between
// threads either way (docs/distributed.md, "How it works", has the
// measurements).
constexpr size_t kZeroCopyMinBytes = size_t{64} << 10;

size_t alignUp(size_t n) {
  return (n + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
}

c10d::ReduceOp toC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Avg: return c10d::ReduceOp::AVG;
    case ReduceOp::Product: return c10d::ReduceOp::PRODUCT;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::BitwiseAnd: return c10d::ReduceOp::BAND;
    case ReduceOp::BitwiseOr: return c10d::ReduceOp::BOR;
    case ReduceOp::BitwiseXor: return c10d::ReduceOp::BXOR;
  }
  return c10d::ReduceOp::SUM;
}

// The Gloo call of the collectives that run both staged and zero-copy: the
// same call whichever memory the tensors view (a staging buffer, or the
// device memory through the kernel view).
c10::intrusive_ptr<c10d::Work> glooAllReduce(c10d::Backend& gloo, at::Tensor tensor,
                                             ReduceOp op) {
  std::vector<at::Tensor> tensors{std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = toC10d(op);
  return gloo.allreduce(tensors, options);
}

c10::intrusive_ptr<c10d::Work> glooBroadcast(c10d::Backend& gloo, at::Tensor tensor,
                                             int root) {
  std::vector<at::Tensor> tensors{std::move(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return gloo.broadcast(tensors, options);
}

c10::intrusive_ptr<c10d::Work> glooReduceScatter(c10d::Backend& gloo, at::Tensor out,
                                                 at::Tensor in, ReduceOp op) {
  c10d::ReduceScatterOptions options;
  options.reduceOp = toC10d(op);
  return gloo._reduce_scatter_base(out, in, options);
}

// [first element, element count) of each chunk of `count` elements.
std::vector<std::pair<int64_t, int64_t>> chunksOf(int64_t count,
                                                  size_t element_size) {
  const int64_t per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / element_size));
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t first = 0; first < count; first += per_chunk) {
    chunks.emplace_back(first, std::min(per_chunk, count - first));
  }
  if (chunks.empty()) {
    chunks.emplace_back(0, 0);
  }
  return chunks;
}

at::Tensor hostView(uint8_t* base, size_t offset, int64_t count,
                    c10::ScalarType dtype) {
  return at::from_blob(base + offset, {count}, at::TensorOptions().dtype(dtype));
}

void* advance(void* device, size_t bytes) {
  return static_cast<uint8_t*>(device) + bytes;
}

// Whether the driver offers a kernel view. Outside stream work a driver
// with one refuses a null address (PH_ERROR_INVALID_ARGUMENT); one without
// answers PH_ERROR_UNIMPLEMENTED, also when its table member is NULL.
bool kernelViewOffered() {
  static const bool offered = [] {
    void* address = nullptr;
    return ph_kernel_address(nullptr, &address) != PH_ERROR_UNIMPLEMENTED;
  }();
  return offered;
}

// A CPU tensor over a zero-copy job's device buffer, through its view.
at::Tensor viewOf(const KernelViews& views, const void* device, int64_t count,
                  c10::ScalarType dtype) {
  return at::from_blob(views.at(device), {count}, at::TensorOptions().dtype(dtype));
}

// Whether ranks.size() ranks' values reduce to Gloo's bits in any order:
// always for two (each op is commutative), for integers and for min and
// max; not for a float sum or product over three or more, which Gloo adds
// in its ring's order.
bool orderFree(c10::ScalarType dtype, ReduceOp op, int ranks) {
  return ranks <= 2 || !c10::isFloatingType(dtype) || op == ReduceOp::Min ||
         op == ReduceOp::Max;
}

// A small job's reduction (Step::combine): `n` elements at `offset` of
// every rank's block, reduced in rank order into `host`, as Gloo's
// functions reduce them (an average is Gloo's sum divided by the size).
void combineReduction(uint8_t* host, const std::vector<const uint8_t*>& ranks,
                      size_t offset, int64_t n, c10::ScalarType dtype, ReduceOp op) {
  at::Tensor out = hostView(host, offset, n, dtype);
  const auto in = [&](size_t r) {
    return hostView(const_cast<uint8_t*>(ranks[r]), offset, n, dtype);
  };
  out.copy_(in(0));
  for (size_t r = 1; r < ranks.size(); ++r) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: out.add_(in(r)); break;
      case ReduceOp::Product: out.mul_(in(r)); break;
      case ReduceOp::Min: at::minimum_out(out, out, in(r)); break;
      case ReduceOp::Max: at::maximum_out(out, out, in(r)); break;
      case ReduceOp::BitwiseAnd: out.bitwise_and_(in(r)); break;
      case ReduceOp::BitwiseOr: out.bitwise_or_(in(r)); break;
      case ReduceOp::BitwiseXor: out.bitwise_xor_(in(r)); break;
    }
  }
  if (op == ReduceOp::Avg) {
    out.div_(static_cast<int64_t>(ranks.size()));
  }
}

// Queued on a stream a job is ordered after: sets the job's mark when the
// stream gets there, or when the stream drops it (a failed stream).
struct MarkReady {
  std::shared_ptr<ReadyMark> mark;

  static ph_status_t run(void*, char*, size_t) {
    return PH_SUCCESS;  // release() follows and sets the mark
  }

  static void release(void* self) {
    auto* task = static_cast<MarkReady*>(self);
    task->mark->reached.store(true, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(task->mark->readiness->mutex);
    }
    task->mark->readiness->changed.notify_all();
    delete task;
  }
};

// The one task a job queues on its stream: holds the stream until the
// communicator's thread has ended the job, and fails it if the job failed.
// A zero-copy job runs here instead (run_direct: GlooStagingThread.cpp).
struct JobWait {
  std::shared_ptr<Job> job;
  bool ran = false;

  static ph_status_t run(void* self, char* error, size_t error_size) {
    auto* task = static_cast<JobWait*>(self);
    Job& job = *task->job;
    task->ran = true;
    if (job.run_direct) {
      job.run_direct(job);
    }
    if (!job.done.load(std::memory_order_acquire)) {
      std::unique_lock<std::mutex> lock(job.mutex);
      job.ended.wait(lock, [&] { return job.done.load(std::memory_order_acquire); });
    }
    if (!job.failed.load(std::memory_order_acquire)) {
      return PH_SUCCESS;
    }
    std::snprintf(error, error_size, "%s", job.error.c_str());
    return PH_ERROR_DEVICE;
  }

  static void release(void* self) {
    auto* task = static_cast<JobWait*>(self);
    if (task->job->released) {
      task->job->released(*task->job, task->ran);
    }
    delete task;
  }
};

}  // namespace

GlooStagingCommunicator::GlooStagingCommunicator(GlooStagingConfig config)
    : config_(std::move(config)),
      data_(std::move(config_.data)),
      control_(std::move(config_.control)),
      zero_copy_(kernelViewOffered()),
      diagnosis_(config_.store->clone(), config_.rank, config_.size) {
  // data_ and control_ hold the only references: breaking the communicator
  // must destroy the backends to close their connections.
  TORCH_CHECK(data_ && control_, "the Gloo staging communicator needs two CPU backends");
  // A new thread's state is the clean one.
  std::thread([this] { clean_state_ = std::make_unique<at::ThreadLocalState>(); }).join();
  thread_ = std::thread([this] { serve(); });
}

GlooStagingCommunicator::~GlooStagingCommunicator() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();
  // Zero-copy jobs end on their stream's worker and use this communicator
  // until their task is released.
  {
    std::unique_lock<std::mutex> lock(direct_mutex_);
    direct_done_.wait(lock, [&] { return direct_outstanding_ == 0; });
  }
  diagnosis_.stop();
}

bool GlooStagingCommunicator::supportsReduction(c10::ScalarType dtype,
                                                ReduceOp op) const {
  // What ProcessGroupGloo reduces in torch 2.13 (checked per dtype and op
  // in tests/python/test_distributed_collectives.py).
  switch (dtype) {
    case c10::kFloat:
    case c10::kDouble:
    case c10::kHalf:
    case c10::kBFloat16:
      return op != ReduceOp::BitwiseAnd && op != ReduceOp::BitwiseOr &&
             op != ReduceOp::BitwiseXor;
    case c10::kChar:
    case c10::kByte:
    case c10::kInt:
    case c10::kLong:
    case c10::kBool:
      return op != ReduceOp::Avg;
    default:
      return false;
  }
}

c10::intrusive_ptr<c10d::Backend> GlooStagingCommunicator::data() const {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (!data_) {
    C10_THROW_ERROR(DistBackendError,
                    "the pccl communicator is broken by an earlier failure: " +
                        broken_reason_);
  }
  return data_;
}

c10::intrusive_ptr<c10d::Backend> GlooStagingCommunicator::control() const {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (!control_) {
    C10_THROW_ERROR(DistBackendError,
                    "the pccl communicator is broken by an earlier failure: " +
                        broken_reason_);
  }
  return control_;
}

void GlooStagingCommunicator::orderAfter(const PhantomStream& waiting,
                                         const PhantomStream& /*stream*/) {
  // Waited for by this communicator's thread, not by the stream: the
  // stream then only ever waits for the collectives themselves. A stream
  // with nothing left to run needs no mark.
  const ph_stream_t handle = waiting.handle();
  if (ph_stream_query(handle) == PH_SUCCESS) {
    return;
  }
  auto mark = std::make_shared<ReadyMark>();
  mark->readiness = readiness_;
  const ph_host_task_t task{"pccl inputs ready", &MarkReady::run, &MarkReady::release,
                            new MarkReady{mark}};
  // A stream that already failed refuses the task (and released it, which
  // set the mark); its error is the caller's to see, not this collective's.
  (void)ph_launch_host_func(handle, &task);
  ready_.push_back(std::move(mark));
}

Job& GlooStagingCommunicator::pendingJob(const PhantomStream& stream) {
  (void)control();  // a broken communicator refuses at the call
  if (!pending_) {
    pending_ = std::make_shared<Job>(stream);
  }
  TORCH_CHECK(pending_->stream == stream,
              "the calls of one pccl group must all use one stream; got ",
              stream, " after ", pending_->stream);
  return *pending_;
}

template <typename Build>
void GlooStagingCommunicator::addCall(CallRecord call, size_t host_bytes,
                                      const PhantomStream& stream, Build build) {
  Job& job = pendingJob(stream);
  const size_t base = job.host_bytes;
  job.calls.push_back(call);
  build(job, base);
  job.host_bytes = base + alignUp(host_bytes);
  if (group_depth_ == 0) {
    submitPending();
  }
}

void GlooStagingCommunicator::allReduce(const DeviceBuffer& send,
                                        const DeviceBuffer& recv, ReduceOp op,
                                        const PhantomStream& stream) {
  const size_t es = c10::elementSize(send.dtype);
  addCall({Kind::AllReduce, send.dtype, send.count, op, -1}, send.bytes(), stream,
          [&](Job& job, size_t base) {
            for (const auto& [first, n] : chunksOf(send.count, es)) {
              const size_t offset = base + first * es;
              Step step;
              step.to_host = {{advance(send.data, first * es), offset, n * es}};
              step.to_device = {{advance(recv.data, first * es), offset, n * es}};
              step.exchange = [this, offset, n = n, dtype = send.dtype, op](
                                  uint8_t* host, GlooWorks& works) {
                works.push_back(
                    glooAllReduce(*data(), hostView(host, offset, n, dtype), op));
              };
              if (orderFree(send.dtype, op, config_.size)) {
                step.combine = [offset, n = n, dtype = send.dtype, op](
                                   uint8_t* host, const auto& ranks) {
                  combineReduction(host, ranks, offset, n, dtype, op);
                };
              }
              job.steps.push_back(std::move(step));
            }
            // Zero-copy: Gloo reduces the whole buffer in place, as it does a
            // CPU tensor (an out-of-place call copies the input over first).
            job.views.need(send.data, send.bytes());
            job.views.need(recv.data, recv.bytes());
            DirectStep direct;
            direct.exchange = [this, in_device = send.data, out_device = recv.data,
                               n = send.count, dtype = send.dtype,
                               op](const KernelViews& views, GlooWorks& works) {
              at::Tensor out = viewOf(views, out_device, n, dtype);
              if (in_device != out_device) {
                out.copy_(viewOf(views, in_device, n, dtype));
              }
              works.push_back(glooAllReduce(*data(), out, op));
            };
            job.direct_steps.push_back(std::move(direct));
          });
}

void GlooStagingCommunicator::broadcast(const DeviceBuffer& buffer, int root,
                                        const PhantomStream& stream) {
  const size_t es = c10::elementSize(buffer.dtype);
  const bool is_root = root == config_.rank;
  addCall({Kind::Broadcast, buffer.dtype, buffer.count, ReduceOp::Sum, root},
          buffer.bytes(), stream, [&](Job& job, size_t base) {
            for (const auto& [first, n] : chunksOf(buffer.count, es)) {
              const size_t offset = base + first * es;
              const Transfer transfer{advance(buffer.data, first * es), offset, n * es};
              Step step;
              (is_root ? step.to_host : step.to_device).push_back(transfer);
              step.exchange = [this, offset, bytes = n * es, root](uint8_t* host,
                                                                   GlooWorks& works) {
                works.push_back(glooBroadcast(
                    *data(), hostView(host, offset, static_cast<int64_t>(bytes), c10::kByte),
                    root));
              };
              step.combine = [offset, bytes = n * es, root](uint8_t* host,
                                                            const auto& ranks) {
                std::memcpy(host + offset, ranks[root] + offset, bytes);
              };
              job.steps.push_back(std::move(step));
            }
            job.views.need(buffer.data, buffer.bytes());
            DirectStep direct;
            direct.exchange = [this, device = buffer.data, bytes = buffer.bytes(), root](
                                  const KernelViews& views, GlooWorks& works) {
              works.push_back(glooBroadcast(
                  *data(), viewOf(views, device, static_cast<int64_t>(bytes), c10::kByte),
                  root));
            };
            job.direct_steps.push_back(std::move(direct));
          });
}

void GlooStagingCommunicator::reduce(const DeviceBuffer& send,
                                     const DeviceBuffer& recv, ReduceOp op,
                                     int root, const PhantomStream& stream) {
  const size_t es = c10::elementSize(send.dtype);
  const bool is_root = root == config_.rank;
  addCall({Kind::Reduce, send.dtype, send.count, op, root}, send.bytes(), stream,
          [&](Job& job, size_t base) {
            for (const auto& [first, n] : chunksOf(send.count, es)) {
              const size_t offset = base + first * es;
              Step step;
              step.to_host = {{advance(send.data, first * es), offset, n * es}};
              if (is_root) {
                step.to_device = {{advance(recv.data, first * es), offset, n * es}};
              }
              step.exchange = [this, offset, n = n, dtype = send.dtype, op, root](
                                  uint8_t* host, GlooWorks& works) {
                std::vector<at::Tensor> tensors{hostView(host, offset, n, dtype)};
                c10d::ReduceOptions options;
                options.reduceOp = toC10d(op);
                options.rootRank = root;
                works.push_back(data()->reduce(tensors, options));
              };
              // Every rank or none: whether a job is small must not depend
              // on the rank.
              if (orderFree(send.dtype, op, config_.size)) {
                step.combine = [offset, n = n, dtype = send.dtype, op, is_root](
                                   uint8_t* host, const auto& ranks) {
                  if (is_root) {  // a non-root keeps its input
                    combineReduction(host, ranks, offset, n, dtype, op);
                  }
                };
              }
              job.steps.push_back(std::move(step));
            }
            // Staged only: Gloo's reduce uses a non-root's buffer as scratch
            // (StagingJob.h).
            job.direct_capable = false;
          });
}

void GlooStagingCommunicator::allGather(const DeviceBuffer& send,
                                        const DeviceBuffer& recv,
                                        const PhantomStream& stream) {
  const size_t in_bytes = send.bytes();
  const size_t out_bytes = in_bytes * config_.size;
  addCall({Kind::AllGather, send.dtype, send.count, ReduceOp::Sum, -1},
          alignUp(in_bytes) + out_bytes, stream, [&](Job& job, size_t base) {
            const size_t out_offset = base + alignUp(in_bytes);
            Step step;
            step.to_host = {{send.data, base, in_bytes}};
            step.to_device = {{recv.data, out_offset, out_bytes}};
            step.exchange = [this, base, out_offset, in_bytes, out_bytes](
                                uint8_t* host, GlooWorks& works) {
              at::Tensor in = hostView(host, base, in_bytes, c10::kByte);
              at::Tensor out = hostView(host, out_offset, out_bytes, c10::kByte);
              works.push_back(data()->_allgather_base(out, in));
            };
            step.combine = [base, out_offset, in_bytes](uint8_t* host,
                                                        const auto& ranks) {
              for (size_t r = 0; r < ranks.size(); ++r) {
                std::memcpy(host + out_offset + r * in_bytes, ranks[r] + base, in_bytes);
              }
            };
            job.steps.push_back(std::move(step));
            job.views.need(send.data, in_bytes);
            job.views.need(recv.data, out_bytes);
            DirectStep direct;
            direct.exchange = [this, in_device = send.data, out_device = recv.data, in_bytes,
                               out_bytes](const KernelViews& views, GlooWorks& works) {
              at::Tensor in = viewOf(views, in_device, in_bytes, c10::kByte);
              at::Tensor out = viewOf(views, out_device, out_bytes, c10::kByte);
              works.push_back(data()->_allgather_base(out, in));
            };
            job.direct_steps.push_back(std::move(direct));
          });
}

void GlooStagingCommunicator::reduceScatter(const DeviceBuffer& send,
                                            const DeviceBuffer& recv, ReduceOp op,
                                            const PhantomStream& stream) {
  const size_t out_bytes = recv.bytes();
  const size_t in_bytes = out_bytes * config_.size;
  addCall({Kind::ReduceScatter, recv.dtype, recv.count, op, -1},
          alignUp(in_bytes) + out_bytes, stream, [&](Job& job, size_t base) {
            const size_t out_offset = base + alignUp(in_bytes);
            Step step;
            step.to_host = {{send.data, base, in_bytes}};
            step.to_device = {{recv.data, out_offset, out_bytes}};
            step.exchange = [this, base, out_offset, count = recv.count,
                             size = config_.size, dtype = recv.dtype,
                             op](uint8_t* host, GlooWorks& works) {
              works.push_back(glooReduceScatter(
                  *data(), hostView(host, out_offset, count, dtype),
                  hostView(host, base, count * size, dtype), op));
            };
            job.steps.push_back(std::move(step));
            job.views.need(send.data, in_bytes);
            job.views.need(recv.data, out_bytes);
            DirectStep direct;
            direct.exchange = [this, in_device = send.data, out_device = recv.data,
                               count = recv.count, size = config_.size,
                               dtype = recv.dtype,
                               op](const KernelViews& views, GlooWorks& works) {
              works.push_back(glooReduceScatter(
                  *data(), viewOf(views, out_device, count, dtype),
                  viewOf(views, in_device, count * size, dtype), op));
            };
            job.direct_steps.push_back(std::move(direct));
          });
}

void GlooStagingCommunicator::allToAll(const DeviceBuffer& send,
                                       const std::vector<int64_t>& send_counts,
                                       const DeviceBuffer& recv,
                                       const std::vector<int64_t>& recv_counts,
                                       const PhantomStream& stream) {
  const size_t es = c10::elementSize(send.dtype);
  const size_t in_bytes = send.bytes();
  const size_t out_bytes = recv.bytes();
  // The element count in the fingerprint is this rank's total, which ranks
  // may differ in: -1 keeps it out of the comparison; the split check
  // compares what each pair sends and receives.
  addCall({Kind::AllToAll, send.dtype, -1, ReduceOp::Sum, -1},
          alignUp(in_bytes) + out_bytes, stream, [&](Job& job, size_t base) {
            const size_t out_offset = base + alignUp(in_bytes);
            std::vector<int64_t> in_splits, out_splits;
            for (int64_t c : send_counts) in_splits.push_back(c * es);
            for (int64_t c : recv_counts) out_splits.push_back(c * es);
            Step step;
            step.to_host = {{send.data, base, in_bytes}};
            step.to_device = {{recv.data, out_offset, out_bytes}};
            step.exchange = [this, base, out_offset, in_bytes, out_bytes, in_splits,
                             out_splits](uint8_t* host, GlooWorks& works) mutable {
              at::Tensor in = hostView(host, base, in_bytes, c10::kByte);
              at::Tensor out = hostView(host, out_offset, out_bytes, c10::kByte);
              works.push_back(data()->alltoall_base(out, in, out_splits, in_splits));
            };
            job.steps.push_back(std::move(step));
            job.views.need(send.data, in_bytes);
            job.views.need(recv.data, out_bytes);
            DirectStep direct;
            direct.exchange = [this, in_device = send.data, out_device = recv.data, in_bytes,
                               out_bytes, in_splits, out_splits](
                                  const KernelViews& views, GlooWorks& works) mutable {
              at::Tensor in = viewOf(views, in_device, in_bytes, c10::kByte);
              at::Tensor out = viewOf(views, out_device, out_bytes, c10::kByte);
              works.push_back(data()->alltoall_base(out, in, out_splits, in_splits));
            };
            job.direct_steps.push_back(std::move(direct));
            job.split_checks.push_back(
                {job.calls.size() - 1, send_counts, recv_counts, {}, {}});
          });
}

void GlooStagingCommunicator::send(const DeviceBuffer& buffer, int peer,
                                   const PhantomStream& stream) {
  pointToPoint(Kind::Send, buffer, peer, stream);
}

void GlooStagingCommunicator::recv(const DeviceBuffer& buffer, int peer,
                                   const PhantomStream& stream) {
  pointToPoint(Kind::Recv, buffer, peer, stream);
}

void GlooStagingCommunicator::pointToPoint(Kind kind, const DeviceBuffer& buffer,
                                           int peer, const PhantomStream& stream) {
  const bool sending = kind == Kind::Send;
  addCall({kind, buffer.dtype, buffer.count, ReduceOp::Sum, peer}, buffer.bytes(),
          stream, [&](Job& job, size_t base) {
            Step step;
            step.point_to_point = true;
            const Transfer transfer{buffer.data, base, buffer.bytes()};
            (sending ? step.to_host : step.to_device).push_back(transfer);
            step.exchange = [this, base, bytes = buffer.bytes(), peer, sending](
                                uint8_t* host, GlooWorks& works) {
              std::vector<at::Tensor> tensors{
                  hostView(host, base, static_cast<int64_t>(bytes), c10::kByte)};
              works.push_back(sending ? data()->send(tensors, peer, kDataTag)
                                      : data()->recv(tensors, peer, kDataTag));
            };
            job.steps.push_back(std::move(step));
            job.views.need(buffer.data, buffer.bytes());
            DirectStep direct;
            direct.point_to_point = true;
            direct.exchange = [this, device = buffer.data, bytes = buffer.bytes(), peer,
                               sending](const KernelViews& views, GlooWorks& works) {
              std::vector<at::Tensor> tensors{
                  viewOf(views, device, static_cast<int64_t>(bytes), c10::kByte)};
              works.push_back(sending ? data()->send(tensors, peer, kDataTag)
                                      : data()->recv(tensors, peer, kDataTag));
            };
            job.direct_steps.push_back(std::move(direct));
          });
}

void GlooStagingCommunicator::groupEnd() {
  TORCH_CHECK(group_depth_ > 0, "groupEnd() without groupStart()");
  if (--group_depth_ == 0 && pending_) {
    submitPending();
  }
}

std::unique_ptr<ccl::Communicator> GlooStagingCommunicator::split(
    const std::vector<int>& ranks, const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& name) {
  const auto me = std::find(ranks.begin(), ranks.end(), config_.rank);
  if (me == ranks.end()) {
    return nullptr;
  }
  TORCH_CHECK(config_.make_backends,
              "this Gloo staging communicator cannot split: it was made "
              "without a way to make Gloo backends");
  GlooStagingConfig config;
  config.make_backends = config_.make_backends;
  config.store = store;
  config.rank = static_cast<int>(me - ranks.begin());
  config.size = static_cast<int>(ranks.size());
  config.timeout = config_.timeout;
  config.group_name = name;
  std::tie(config.data, config.control) =
      config_.make_backends(store, config.rank, config.size, config.timeout);
  return std::make_unique<GlooStagingCommunicator>(std::move(config));
}

namespace {

// A group's sends and receives become one step (at the first one's place),
// so that all of them are started before any is waited for. `absorb`
// moves a step's transfers (if any) into the merged step.
template <typename StepType, typename Absorb>
void mergePointToPoint(std::vector<StepType>& job_steps, Absorb absorb) {
  using Exchange = decltype(StepType::exchange);
  std::vector<StepType> steps;
  std::vector<Exchange> exchanges;
  size_t merged = SIZE_MAX;
  for (StepType& step : job_steps) {
    if (!step.point_to_point) {
      steps.push_back(std::move(step));
      continue;
    }
    if (merged == SIZE_MAX) {
      merged = steps.size();
      steps.emplace_back();
      steps.back().point_to_point = true;
    }
    absorb(steps[merged], step);
    exchanges.push_back(std::move(step.exchange));
  }
  if (merged != SIZE_MAX) {
    steps[merged].exchange = [exchanges = std::move(exchanges)](auto&& where,
                                                                GlooWorks& works) {
      for (const auto& exchange : exchanges) {
        exchange(where, works);
      }
    };
  }
  job_steps = std::move(steps);
}

void mergePointToPoint(Job& job) {
  mergePointToPoint(job.steps, [](Step& into, Step& step) {
    into.to_host.insert(into.to_host.end(), step.to_host.begin(), step.to_host.end());
    into.to_device.insert(into.to_device.end(), step.to_device.begin(),
                          step.to_device.end());
  });
  mergePointToPoint(job.direct_steps, [](DirectStep&, DirectStep&) {});
}

}  // namespace

std::string GlooStagingCommunicator::labelOf(const Job& job) const {
  std::ostringstream out;
  const CallRecord* first = nullptr;
  size_t collectives = 0;
  for (const CallRecord& call : job.calls) {
    if (!isPointToPoint(call.kind)) {
      first = first ? first : &call;
      ++collectives;
    }
  }
  if (first != nullptr) {
    out << kindName(first->kind) << " #" << job.collective << " (";
    if (first->count >= 0) {
      out << first->count << " x ";
    }
    out << c10::toString(first->dtype);
    if (first->kind == Kind::AllReduce || first->kind == Kind::Reduce ||
        first->kind == Kind::ReduceScatter) {
      out << ", " << ccl::reduceOpName(first->op);
    }
    out << ")";
    if (collectives > 1) {
      out << " and " << (collectives - 1) << " more in its group";
    }
  } else if (job.calls.size() == 1) {
    out << describeCall(job.calls.front());
  } else {
    out << "a group of " << job.calls.size() << " sends and receives";
  }
  out << " of group '" << config_.group_name << "'";
  return out.str();
}

void GlooStagingCommunicator::submitPending() {
  std::shared_ptr<Job> job = std::move(pending_);
  job->ready = std::move(ready_);
  ready_.clear();
  mergePointToPoint(*job);
  job->zero_copy =
      zero_copy_ && job->direct_capable && job->host_bytes >= kZeroCopyMinBytes;
  if (job->zero_copy) {
    {
      std::lock_guard<std::mutex> lock(direct_mutex_);
      ++direct_outstanding_;
    }
    job->run_direct = [this](Job& j) { runDirect(j); };
    job->released = [this](Job& j, bool ran) { directReleased(j, ran); };
  }
  const bool collective =
      std::any_of(job->calls.begin(), job->calls.end(),
                  [](const CallRecord& c) { return !isPointToPoint(c.kind); });
  job->collective = collective ? ++collectives_ : collectives_;
  job->label = labelOf(*job);
  if (collective) {
    diagnosis_.called(job->collective, job->label);
  }
  job->small = !job->zero_copy && job->host_bytes <= kSmallJobBytes &&
               std::all_of(job->steps.begin(), job->steps.end(),
                           [](const Step& step) { return bool(step.combine); });
  // With a kernel view, a small job runs in its stream task, on the
  // stream's worker (runSmallInTask): no hand-over to this communicator's
  // thread and back.
  const bool in_task = job->small && zero_copy_ && job->direct_capable;
  if (in_task) {
    {
      std::lock_guard<std::mutex> lock(direct_mutex_);
      ++direct_outstanding_;
    }
    job->run_direct = [this](Job& j) { runSmallInTask(j); };
    job->released = [this](Job& j, bool ran) { directReleased(j, ran); };
    last_in_task_ = job;
  } else {
    job->after_in_task = last_in_task_;
  }
  {
    // The agreement messages go out in call order, the same on every rank.
    // A small job's carries its data, so it is sent once the data is on
    // the host (sendSmallAgreement), and those of the jobs after it then.
    std::lock_guard<std::mutex> lock(agreement_mutex_);
    if (job->small || !unsent_.empty()) {
      unsent_.push_back(job);
    } else {
      startAgreement(*job);
    }
  }
  // The fault injector counts a collective as one kernel of its stream, as
  // an NCCL collective is one kernel: fail_kernel(k) can hit it.
  job->prologue = [] {};
  faultHookLaunch(job->stream, "pccl collective", job->prologue, /*waited=*/false);
  try {
    queueStreamTask(job);
  } catch (const std::exception& e) {
    // The agreement has gone out, or will: peers will wait for this job, so
    // it still goes to the thread, which breaks the communicator.
    job->submit_error = messageOf(e);
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      queue_.push_back(std::move(job));
    }
    queue_cv_.notify_one();
    throw;
  }
  if (in_task) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(std::move(job));
  }
  queue_cv_.notify_one();
}

void GlooStagingCommunicator::startAgreement(Job& job) {
  const at::ThreadLocalStateGuard clean(*clean_state_);  // see clean_state_
  const auto backend = control();
  bool collective = false;
  for (size_t i = 0; i < job.calls.size(); ++i) {
    const CallRecord& call = job.calls[i];
    if (call.kind == Kind::Send) {
      std::vector<at::Tensor> header{pointToPointHeader(call)};
      job.outgoing_headers.push_back(backend->send(header, call.root, kHeaderTag));
    } else if (call.kind == Kind::Recv) {
      std::vector<at::Tensor> header{at::empty({kHeaderWords}, at::kLong)};
      job.incoming_headers.push_back(
          {i, backend->recv(header, call.root, kHeaderTag), header[0]});
    } else {
      collective = true;
    }
  }
  if (collective) {
    if (!job.slot.defined()) {
      job.slot = agreementSlot(job);
    }
    job.slots = at::empty({config_.size * static_cast<int64_t>(kSlotBytes)}, at::kByte);
    job.fingerprint_work = backend->_allgather_base(job.slots, job.slot);
  }
  for (Job::SplitCheck& check : job.split_checks) {
    at::Tensor mine = at::empty({2 * config_.size}, at::kLong);
    int64_t* words = mine.data_ptr<int64_t>();
    std::copy(check.send_counts.begin(), check.send_counts.end(), words);
    std::copy(check.recv_counts.begin(), check.recv_counts.end(), words + config_.size);
    check.gathered = at::empty({2 * config_.size * config_.size}, at::kLong);
    check.work = backend->_allgather_base(check.gathered, mine);
  }
  job.agreement_sent = true;
}

void GlooStagingCommunicator::sendSmallAgreement(Job& job) {
  std::unique_lock<std::mutex> lock(agreement_mutex_);
  // Each earlier job has sent its message: the jobs of one communicator
  // share a stream, whose order the tasks keep, and this waits only if
  // that ever changes.
  agreement_sent_cv_.wait(lock, [&] {
    return unsent_.empty() || unsent_.front().get() == &job || broken_.load();
  });
  if (unsent_.empty() || unsent_.front().get() != &job) {
    throw std::runtime_error(
        "the communicator broke before this collective's message was sent");
  }
  unsent_.pop_front();
  startAgreement(job);
  agreement_sent_cv_.notify_all();
  // Then the jobs queued behind it, up to the next small one. One that
  // cannot send (a broken communicator) stays unsent and fails when run.
  try {
    while (!unsent_.empty() && !unsent_.front()->small) {
      startAgreement(*unsent_.front());
      unsent_.pop_front();
    }
  } catch (const std::exception&) {
  }
}

void GlooStagingCommunicator::queueStreamTask(const std::shared_ptr<Job>& job) {
  const ph_stream_t handle = job->stream.handle();
  const ph_host_task_t task{"pccl collective", &JobWait::run, &JobWait::release,
                            new JobWait{job}};
  // A refusal (the stream already failed) released the task; check()
  // reports the stream's error to the caller and resets it.
  job->stream.check(ph_launch_host_func(handle, &task), handle);
}

std::unique_ptr<ccl::Communicator> makeGlooStagingCommunicator(
    GlooStagingConfig config) {
  return std::make_unique<GlooStagingCommunicator>(std::move(config));
}

}  // namespace phantom::gloo_staging
