// The Gloo staging communicator (phantom/gloo_staging/GlooStaging.h).
//
// A call builds a Job (StagingJob.h) and, on the calling thread, in call
// order: starts the agreement exchange on the control backend (Agreement.h),
// counts the collective for the fault injector as one kernel, and queues
// the job's device work on the stream — the device-to-host copies of every
// step, then per step a task that waits for the step's exchange, and the
// step's host-to-device copies. The job then goes to the communicator's own
// thread, which for each step waits for the step's copies (a host wait on
// an event), hands the pinned bytes to the data backend and, when Gloo is
// done, releases the task that holds the stream.
//
// So the stream never runs Gloo itself: it only copies and waits. Gloo runs
// on the communicator's thread (and Gloo's own threads), one job at a time
// in call order, which is the order every rank uses. The blocking is where
// NCCL has it — the communication stream waits for the network — and a
// group's stream can be shared with other work without Gloo ever holding a
// stream worker that another group's progress needs.
//
// Failures. Whatever fails — the fault injector's kernel, a copy, the
// agreement, the exchange — the job fails with a sentence naming it (and,
// for an exchange, the peer at fault: PeerDiagnosis.h); the waiting task
// returns that sentence, so the stream gets a sticky error; and the
// communicator breaks: a local failure is written to the store, then both
// Gloo backends are destroyed, which closes their connections, so peers
// blocked in this collective fail at once instead of at their timeout.
// Later jobs fail without running.
#include "Agreement.h"
#include "PeerDiagnosis.h"
#include "StagingJob.h"

#include <phantom/gloo_staging/GlooStaging.h>

#include <phantom/FaultInjection.h>
#include <phantom/HostAllocator.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <sstream>
#include <thread>
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

Job::~Job() {
  for (ph_event_t event : staged) {
    if (event != nullptr) {
      (void)ph_event_destroy(event);
    }
  }
}

namespace {

using ccl::DeviceBuffer;
using ccl::ReduceOp;

constexpr int kDataTag = 0;
constexpr int kHeaderTag = 0;
constexpr size_t kHostAlignment = 64;

// Chunking of all-reduce, broadcast and reduce: below 2 MiB one step;
// above, eighths, from 1 MiB to 16 MiB a chunk (docs/performance.md).
constexpr size_t kMinChunkBytes = size_t{1} << 20;
constexpr size_t kMaxChunkBytes = size_t{16} << 20;
constexpr size_t kChunksWanted = 8;

size_t alignUp(size_t n) {
  return (n + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
}

std::string messageOf(const std::exception& e) {
  std::string message = e.what();
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    message = error->what_without_backtrace();
  }
  // Gloo's sentences start with its source location and end with advice
  // to read the peer's logs; the peer is named after them instead.
  if (!message.empty() && message[0] == '[') {
    const size_t close = message.find("] ");
    if (close != std::string::npos) {
      message.erase(0, close + 2);
    }
  }
  const size_t advice = message.find(" This is typically caused by");
  if (advice != std::string::npos) {
    message.erase(advice);
  }
  return message;
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

// [first element, element count) of each chunk of `count` elements.
std::vector<std::pair<int64_t, int64_t>> chunksOf(int64_t count,
                                                  size_t element_size) {
  const size_t bytes = static_cast<size_t>(count) * element_size;
  size_t chunk = std::clamp(bytes / kChunksWanted, kMinChunkBytes, kMaxChunkBytes);
  if (bytes < 2 * kMinChunkBytes) {
    chunk = std::max<size_t>(bytes, 1);
  }
  const int64_t per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(chunk / element_size));
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

// The task each step queues on the stream: holds the stream until the
// communicator's thread has exchanged that step.
struct StepWait {
  std::shared_ptr<Job> job;
  int step;

  static ph_status_t run(void* self, char* error, size_t error_size) {
    auto* wait = static_cast<StepWait*>(self);
    Job& job = *wait->job;
    const auto ready = [&] {
      return job.steps_done.load(std::memory_order_acquire) > wait->step ||
             job.failed.load(std::memory_order_acquire);
    };
    // Spin briefly: a small collective's exchange often ends within the
    // microseconds a sleeping thread would take to be woken.
    for (int i = 0; i < 2000 && !ready(); ++i) {
      if ((i & 63) == 63) {
        std::this_thread::yield();
      }
    }
    if (!ready()) {
      std::unique_lock<std::mutex> lock(job.mutex);
      job.progressed.wait(lock, ready);
    }
    if (job.steps_done.load(std::memory_order_acquire) > wait->step) {
      return PH_SUCCESS;
    }
    std::snprintf(error, error_size, "%s", job.error.c_str());
    return PH_ERROR_DEVICE;
  }

  static void release(void* self) {
    delete static_cast<StepWait*>(self);
  }
};

class GlooStagingCommunicator final : public ccl::Communicator {
 public:
  explicit GlooStagingCommunicator(GlooStagingConfig config)
      : config_(std::move(config)),
        data_(std::move(config_.data)),
        control_(std::move(config_.control)),
        diagnosis_(config_.store->clone(), config_.rank, config_.size) {
    // data_ and control_ hold the only references: breaking the
    // communicator must destroy the backends to close their connections.
    TORCH_CHECK(data_ && control_, "the Gloo staging communicator needs two CPU backends");
    thread_ = std::thread([this] { serve(); });
  }

  ~GlooStagingCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    thread_.join();
    diagnosis_.stop();
  }

  int rank() const override { return config_.rank; }
  int size() const override { return config_.size; }

  bool supportsReduction(c10::ScalarType dtype, ReduceOp op) const override {
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

  void allReduce(const DeviceBuffer& send, const DeviceBuffer& recv,
                 ReduceOp op, const PhantomStream& stream) override {
    const size_t es = c10::elementSize(send.dtype);
    addCall({Kind::AllReduce, send.dtype, send.count, op, -1}, send.bytes(),
            stream, [&](Job& job, size_t base) {
              for (const auto& [first, n] : chunksOf(send.count, es)) {
                const size_t offset = base + first * es;
                const size_t bytes = n * es;
                Step step;
                step.to_host = {{advance(send.data, first * es), offset, bytes}};
                step.to_device = {{advance(recv.data, first * es), offset, bytes}};
                step.exchange = [this, offset, n = n, dtype = send.dtype, op](
                                    uint8_t* host, GlooWorks& works) {
                  std::vector<at::Tensor> tensors{hostView(host, offset, n, dtype)};
                  c10d::AllreduceOptions options;
                  options.reduceOp = toC10d(op);
                  works.push_back(data()->allreduce(tensors, options));
                };
                job.steps.push_back(std::move(step));
              }
            });
  }

  void broadcast(const DeviceBuffer& buffer, int root,
                 const PhantomStream& stream) override {
    const size_t es = c10::elementSize(buffer.dtype);
    const bool is_root = root == config_.rank;
    addCall({Kind::Broadcast, buffer.dtype, buffer.count, ReduceOp::Sum, root},
            buffer.bytes(), stream, [&](Job& job, size_t base) {
              for (const auto& [first, n] : chunksOf(buffer.count, es)) {
                const size_t offset = base + first * es;
                const Transfer transfer{advance(buffer.data, first * es), offset, n * es};
                Step step;
                (is_root ? step.to_host : step.to_device).push_back(transfer);
                step.exchange = [this, offset, bytes = n * es, root](
                                    uint8_t* host, GlooWorks& works) {
                  std::vector<at::Tensor> tensors{
                      hostView(host, offset, static_cast<int64_t>(bytes), c10::kByte)};
                  c10d::BroadcastOptions options;
                  options.rootRank = root;
                  works.push_back(data()->broadcast(tensors, options));
                };
                job.steps.push_back(std::move(step));
              }
            });
  }

  void reduce(const DeviceBuffer& send, const DeviceBuffer& recv, ReduceOp op,
              int root, const PhantomStream& stream) override {
    const size_t es = c10::elementSize(send.dtype);
    const bool is_root = root == config_.rank;
    addCall({Kind::Reduce, send.dtype, send.count, op, root}, send.bytes(),
            stream, [&](Job& job, size_t base) {
              for (const auto& [first, n] : chunksOf(send.count, es)) {
                const size_t offset = base + first * es;
                const size_t bytes = n * es;
                Step step;
                step.to_host = {{advance(send.data, first * es), offset, bytes}};
                if (is_root) {
                  step.to_device = {{advance(recv.data, first * es), offset, bytes}};
                }
                step.exchange = [this, offset, n = n, dtype = send.dtype, op, root](
                                    uint8_t* host, GlooWorks& works) {
                  std::vector<at::Tensor> tensors{hostView(host, offset, n, dtype)};
                  c10d::ReduceOptions options;
                  options.reduceOp = toC10d(op);
                  options.rootRank = root;
                  works.push_back(data()->reduce(tensors, options));
                };
                job.steps.push_back(std::move(step));
              }
            });
  }

  void allGather(const DeviceBuffer& send, const DeviceBuffer& recv,
                 const PhantomStream& stream) override {
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
              job.steps.push_back(std::move(step));
            });
  }

  void reduceScatter(const DeviceBuffer& send, const DeviceBuffer& recv,
                     ReduceOp op, const PhantomStream& stream) override {
    const size_t out_bytes = recv.bytes();
    const size_t in_bytes = out_bytes * config_.size;
    addCall({Kind::ReduceScatter, recv.dtype, recv.count, op, -1},
            alignUp(in_bytes) + out_bytes, stream, [&](Job& job, size_t base) {
              const size_t out_offset = base + alignUp(in_bytes);
              Step step;
              step.to_host = {{send.data, base, in_bytes}};
              step.to_device = {{recv.data, out_offset, out_bytes}};
              step.exchange = [this, base, out_offset, count = recv.count,
                               size = config_.size, dtype = recv.dtype, op](
                                  uint8_t* host, GlooWorks& works) {
                at::Tensor in = hostView(host, base, count * size, dtype);
                at::Tensor out = hostView(host, out_offset, count, dtype);
                c10d::ReduceScatterOptions options;
                options.reduceOp = toC10d(op);
                works.push_back(data()->_reduce_scatter_base(out, in, options));
              };
              job.steps.push_back(std::move(step));
            });
  }

  void allToAll(const DeviceBuffer& send, const std::vector<int64_t>& send_counts,
                const DeviceBuffer& recv, const std::vector<int64_t>& recv_counts,
                const PhantomStream& stream) override {
    const size_t es = c10::elementSize(send.dtype);
    const size_t in_bytes = send.bytes();
    const size_t out_bytes = recv.bytes();
    // The element count in the fingerprint is this rank's total, which
    // ranks may differ in: -1 keeps it out of the comparison; the split
    // check below compares what each pair sends and receives.
    addCall({Kind::AllToAll, send.dtype, -1, ReduceOp::Sum, -1},
            alignUp(in_bytes) + out_bytes, stream, [&](Job& job, size_t base) {
              const size_t out_offset = base + alignUp(in_bytes);
              std::vector<int64_t> in_splits, out_splits;
              for (int64_t c : send_counts) in_splits.push_back(c * es);
              for (int64_t c : recv_counts) out_splits.push_back(c * es);
              Step step;
              step.to_host = {{send.data, base, in_bytes}};
              step.to_device = {{recv.data, out_offset, out_bytes}};
              step.exchange = [this, base, out_offset, in_bytes, out_bytes,
                               in_splits, out_splits](uint8_t* host,
                                                      GlooWorks& works) mutable {
                at::Tensor in = hostView(host, base, in_bytes, c10::kByte);
                at::Tensor out = hostView(host, out_offset, out_bytes, c10::kByte);
                works.push_back(data()->alltoall_base(out, in, out_splits, in_splits));
              };
              job.steps.push_back(std::move(step));
              job.split_checks.push_back({job.calls.size() - 1, send_counts, recv_counts});
            });
  }

  void send(const DeviceBuffer& buffer, int peer,
            const PhantomStream& stream) override {
    pointToPoint(Kind::Send, buffer, peer, stream);
  }

  void recv(const DeviceBuffer& buffer, int peer,
            const PhantomStream& stream) override {
    pointToPoint(Kind::Recv, buffer, peer, stream);
  }

  void groupStart() override { ++group_depth_; }

  void groupEnd() override {
    TORCH_CHECK(group_depth_ > 0, "groupEnd() without groupStart()");
    if (--group_depth_ == 0 && pending_) {
      submitPending();
    }
  }

  void abort(const std::string& reason) override {
    breakCommunicator(reason);
  }

  std::unique_ptr<ccl::Communicator> split(
      const std::vector<int>& ranks, const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& name) override {
    const auto me = std::find(ranks.begin(), ranks.end(), config_.rank);
    if (me == ranks.end()) {
      return nullptr;
    }
    TORCH_CHECK(config_.make_backends, "this Gloo staging communicator cannot split: "
                "it was made without a way to make Gloo backends");
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

 private:
  enum class Cause { Local, Agreement, Exchange, Broken };

  c10::intrusive_ptr<c10d::Backend> data() const {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    if (!data_) {
      C10_THROW_ERROR(DistBackendError,
                      "the pccl communicator is broken by an earlier failure: " +
                          broken_reason_);
    }
    return data_;
  }

  c10::intrusive_ptr<c10d::Backend> control() const {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    if (!control_) {
      C10_THROW_ERROR(DistBackendError,
                      "the pccl communicator is broken by an earlier failure: " +
                          broken_reason_);
    }
    return control_;
  }

  void pointToPoint(Kind kind, const DeviceBuffer& buffer, int peer,
                    const PhantomStream& stream) {
    const bool sending = kind == Kind::Send;
    addCall({kind, buffer.dtype, buffer.count, ReduceOp::Sum, peer},
            buffer.bytes(), stream, [&](Job& job, size_t base) {
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
            });
  }

  template <typename Build>
  void addCall(CallRecord call, size_t host_bytes, const PhantomStream& stream,
               Build build) {
    (void)control();  // a broken communicator refuses at the call
    if (!pending_) {
      pending_ = std::make_shared<Job>(stream);
    }
    TORCH_CHECK(pending_->stream == stream,
                "the calls of one pccl group must all use one stream; got ",
                stream, " after ", pending_->stream);
    Job& job = *pending_;
    const size_t base = job.host_bytes;
    job.calls.push_back(call);
    build(job, base);
    job.host_bytes = base + alignUp(host_bytes);
    if (group_depth_ == 0) {
      submitPending();
    }
  }

  // A group's sends and receives become one step, so that all of them are
  // started before any is waited for.
  static void mergePointToPoint(Job& job) {
    std::vector<Step> steps;
    std::vector<std::function<void(uint8_t*, GlooWorks&)>> exchanges;
    size_t merged = SIZE_MAX;
    for (Step& step : job.steps) {
      if (!step.point_to_point) {
        steps.push_back(std::move(step));
        continue;
      }
      if (merged == SIZE_MAX) {
        merged = steps.size();
        steps.emplace_back();
        steps.back().point_to_point = true;
      }
      Step& into = steps[merged];
      into.to_host.insert(into.to_host.end(), step.to_host.begin(), step.to_host.end());
      into.to_device.insert(into.to_device.end(), step.to_device.begin(), step.to_device.end());
      exchanges.push_back(std::move(step.exchange));
    }
    if (merged != SIZE_MAX) {
      steps[merged].exchange = [exchanges = std::move(exchanges)](
                                   uint8_t* host, GlooWorks& works) {
        for (const auto& exchange : exchanges) {
          exchange(host, works);
        }
      };
    }
    job.steps = std::move(steps);
  }

  std::string labelOf(const Job& job) const {
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

  void submitPending() {
    std::shared_ptr<Job> job = std::move(pending_);
    mergePointToPoint(*job);
    const bool collective = std::any_of(
        job->calls.begin(), job->calls.end(),
        [](const CallRecord& c) { return !isPointToPoint(c.kind); });
    job->collective = collective ? ++collectives_ : collectives_;
    job->label = labelOf(*job);
    if (collective) {
      diagnosis_.called(job->collective, job->label);
    }
    startAgreement(*job);
    // The fault injector counts a collective as one kernel of its stream,
    // as an NCCL collective is one kernel: fail_kernel(k) can hit it.
    job->prologue = [] {};
    faultHookLaunch(job->stream, "pccl collective", job->prologue,
                    /*waited=*/false);
    try {
      queueDeviceWork(job);
    } catch (const std::exception& e) {
      // The agreement has gone out: peers will wait for this job, so it
      // still goes to the thread, which breaks the communicator.
      job->submit_error = messageOf(e);
      push(std::move(job));
      throw;
    }
    push(std::move(job));
  }

  void startAgreement(Job& job) {
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
      at::Tensor mine = collectiveFingerprint(job);
      job.fingerprints = at::empty({config_.size * kFingerprintWords}, at::kLong);
      job.fingerprint_work = backend->_allgather_base(job.fingerprints, mine);
    }
    for (Job::SplitCheck& check : job.split_checks) {
      at::Tensor mine = at::empty({2 * config_.size}, at::kLong);
      int64_t* words = mine.data_ptr<int64_t>();
      std::copy(check.send_counts.begin(), check.send_counts.end(), words);
      std::copy(check.recv_counts.begin(), check.recv_counts.end(),
                words + config_.size);
      check.gathered = at::empty({2 * config_.size * config_.size}, at::kLong);
      check.work = backend->_allgather_base(check.gathered, mine);
    }
  }

  void queueDeviceWork(const std::shared_ptr<Job>& owner) {
    Job& job = *owner;
    if (job.host_bytes > 0) {
      job.pinned = pinnedHostAllocator()->allocate(job.host_bytes);
    }
    auto* host = static_cast<uint8_t*>(job.pinned.get());
    const ph_stream_t handle = job.stream.handle();
    job.staged.assign(job.steps.size(), nullptr);
    for (size_t s = 0; s < job.steps.size(); ++s) {
      for (const Transfer& t : job.steps[s].to_host) {
        if (t.bytes > 0) {
          job.stream.check(ph_memcpy_async(host + t.host_offset, t.device, t.bytes,
                                           PH_MEMCPY_DEVICE_TO_HOST, handle),
                           handle);
        }
      }
      job.stream.check(ph_event_create(PH_EVENT_DISABLE_TIMING, &job.staged[s]), handle);
      job.stream.check(ph_event_record(job.staged[s], handle), handle);
    }
    for (size_t s = 0; s < job.steps.size(); ++s) {
      const ph_host_task_t task{"pccl collective", &StepWait::run,
                                &StepWait::release,
                                new StepWait{owner, static_cast<int>(s)}};
      job.stream.check(ph_launch_host_func(handle, &task), handle);
      for (const Transfer& t : job.steps[s].to_device) {
        if (t.bytes > 0) {
          job.stream.check(ph_memcpy_async(t.device, host + t.host_offset, t.bytes,
                                           PH_MEMCPY_HOST_TO_DEVICE, handle),
                           handle);
        }
      }
    }
    if (job.pinned) {
      // Freed by the thread once the exchange is done; the allocator keeps
      // the block until the stream has copied out of it.
      recordPinnedUse(job.pinned.get(), job.pinned.get_context(), job.stream);
    }
  }

  void push(std::shared_ptr<Job> job) {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      queue_.push_back(std::move(job));
    }
    queue_cv_.notify_one();
  }

  // --- the communicator's thread -------------------------------------------

  void serve() {
    while (true) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) {
          return;  // stopping, and everything queued has run
        }
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      run(*job);
    }
  }

  void run(Job& job) {
    Cause cause = Cause::Local;
    try {
      if (!job.submit_error.empty()) {
        throw std::runtime_error(job.submit_error);
      }
      if (broken_.load()) {
        cause = Cause::Broken;
        std::lock_guard<std::mutex> lock(broken_mutex_);
        throw std::runtime_error(broken_reason_);
      }
      job.prologue();  // the fault injector's kernel
      cause = Cause::Exchange;
      waitForAgreement(job);
      auto* host = static_cast<uint8_t*>(job.pinned.get());
      for (size_t s = 0; s < job.steps.size(); ++s) {
        cause = Cause::Local;
        if (ph_event_synchronize(job.staged[s]) != PH_SUCCESS) {
          throw std::runtime_error(
              std::string("copying its input to the host failed: ") +
              ph_last_error_message());
        }
        cause = Cause::Exchange;
        GlooWorks works;
        job.steps[s].exchange(host, works);
        for (auto& work : works) {
          work->wait();
        }
        stepDone(job);
      }
    } catch (const DisagreementError& e) {
      fail(job, Cause::Agreement, e.what());
    } catch (const std::exception& e) {
      fail(job, cause, messageOf(e));
    }
    job.pinned.clear();
  }

  void waitForAgreement(Job& job) {
    for (auto& work : job.outgoing_headers) {
      work->wait();
    }
    for (Job::IncomingHeader& incoming : job.incoming_headers) {
      incoming.work->wait();
      checkHeader(job.calls[incoming.call], incoming.header);
    }
    if (job.fingerprint_work) {
      job.fingerprint_work->wait();
      checkFingerprints(job, config_.size);
    }
    for (Job::SplitCheck& check : job.split_checks) {
      check.work->wait();
      checkSplits(check);
    }
  }

  // Every rank gathered every rank's send and receive counts, so every rank
  // finds a disagreement (and raises it) whichever pair it is between.
  void checkSplits(const Job::SplitCheck& check) const {
    const int64_t* all = check.gathered.const_data_ptr<int64_t>();
    const int size = config_.size;
    const auto sends = [&](int from, int to) { return all[from * 2 * size + to]; };
    const auto expects = [&](int at, int from) {
      return all[at * 2 * size + size + from];
    };
    for (int from = 0; from < size; ++from) {
      for (int to = 0; to < size; ++to) {
        if (sends(from, to) != expects(to, from)) {
          throw DisagreementError(
              "the ranks disagree on the split sizes of this all_to_all: rank " +
              std::to_string(from) + " sends " + std::to_string(sends(from, to)) +
              " elements to rank " + std::to_string(to) + ", which expects " +
              std::to_string(expects(to, from)) +
              " from it; rank q's output split for rank p must equal rank p's "
              "input split for rank q");
        }
      }
    }
  }

  void stepDone(Job& job) {
    {
      std::lock_guard<std::mutex> lock(job.mutex);
      job.steps_done.fetch_add(1, std::memory_order_release);
    }
    job.progressed.notify_all();
  }

  void fail(Job& job, Cause cause, std::string reason) {
    while (!reason.empty() && (reason.back() == '.' || reason.back() == ' ')) {
      reason.pop_back();
    }
    const std::string on_rank = " on rank " + std::to_string(config_.rank);
    std::string message =
        cause == Cause::Broken
            ? job.label + " was not run" + on_rank +
                  ": the communicator broke earlier: " + reason
            : job.label + " failed" + on_rank + ": " + reason;
    if (cause == Cause::Exchange) {
      std::optional<int> peer;
      if (job.calls.size() == 1 && isPointToPoint(job.calls[0].kind)) {
        peer = job.calls[0].root;
      }
      message += ". Peers: " + diagnosis_.explain(job.collective, peer);
    }
    if (cause == Cause::Local) {
      diagnosis_.reportLocalFailure(message);
    }
    {
      std::lock_guard<std::mutex> lock(job.mutex);
      job.error = message;
      job.failed.store(true, std::memory_order_release);
    }
    job.progressed.notify_all();
    if (cause != Cause::Broken) {
      breakCommunicator(message);
    }
  }

  void breakCommunicator(const std::string& reason) {
    c10::intrusive_ptr<c10d::Backend> data, control;
    {
      std::lock_guard<std::mutex> lock(broken_mutex_);
      if (broken_.load()) {
        return;
      }
      broken_reason_ = reason;
      broken_.store(true);
      data = std::move(data_);
      control = std::move(control_);
    }
    // Destroying the backends closes their connections: peers waiting in
    // this collective fail now rather than at their timeout. Data first:
    // a peer blocked there is what breaks the peer's own control backend.
    data.reset();
    control.reset();
  }

  GlooStagingConfig config_;
  c10::intrusive_ptr<c10d::Backend> data_;
  c10::intrusive_ptr<c10d::Backend> control_;
  PeerDiagnosis diagnosis_;

  // The calling thread's state (callers are serialised).
  int group_depth_ = 0;
  std::shared_ptr<Job> pending_;
  uint64_t collectives_ = 0;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::thread thread_;

  mutable std::mutex broken_mutex_;
  std::atomic<bool> broken_{false};
  std::string broken_reason_;
};

}  // namespace

std::unique_ptr<ccl::Communicator> makeGlooStagingCommunicator(
    GlooStagingConfig config) {
  return std::make_unique<GlooStagingCommunicator>(std::move(config));
}

}  // namespace phantom::gloo_staging
