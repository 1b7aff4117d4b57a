// What the Gloo staging communicator queues: a job per collective (or per
// group of calls between groupStart and groupEnd), cut into steps.
//
// A job runs one of three ways. Zero-copy (the analogue of GPUDirect RDMA,
// where NCCL reads device memory directly): when the driver offers a kernel
// view (ph_kernel_address: host-visible addresses of device memory, valid
// while work on a stream runs), the job's stream task resolves the views of
// the job's device buffers when the stream reaches it and, once the
// communicator's thread has prepared the job (inputs ready, agreement
// checked), has Gloo exchange those buffers in place, itself, on the
// stream's worker: no pinned block, no copies, and back-to-back collectives
// pass from one to the next on that worker with no thread hand-over.
// Staged: otherwise, as below, and for jobs under 64 KiB
// (GlooStagingCalls.cpp, kZeroCopyMinBytes). A job is zero-copy only if every call in it has a
// direct form (DirectStep). reduce has none: Gloo's reduce leaves
// partial sums in a non-root rank's buffer (torch 2.13's ProcessGroupGloo
// does, on CPU tensors too), and pccl's reduce, like NCCL's, leaves a
// non-root's tensor as it was.
// Small: a job of at most kSmallJobBytes (Agreement.h) whose every step has
// a local form (Step::combine) sends its input in its agreement message and
// finishes from the gathered messages, with no data backend call. With a
// kernel view its stream task runs it on the stream's worker, reaching the
// buffers through their views, so that no other thread is woken for it;
// without one the communicator's thread runs it with ph_memcpy. Either way
// it sends its message only when every earlier job has sent its own.
//
// A step copies some device ranges into pinned host memory, exchanges that
// memory with Gloo, and copies some ranges back. The communicator's thread
// runs the steps as a pipeline: while Gloo's threads exchange step s, it
// copies step s+1 in and step s-1 out, so a large all-reduce costs about
// its exchanges, not three passes one after the other (and each chunk is
// still in cache when Gloo reduces it).
//
// The job's stream only holds one task, which waits for the whole job: the
// stream's later work (the caller's wait, the completion record) is
// ordered after the collective, while the copies and the exchange run on
// the communicator's thread, which starts the job as soon as the streams
// the job was ordered after (orderAfter) have run what was queued on them
// before the call. Each of those streams says so with a small task that
// sets a ReadyMark: the thread sleeps on a condition variable, where a
// host wait on an event would spin first, and on two cores shared by two
// ranks every spin is taken from Gloo.
#pragma once

#include <phantom/ccl/Communicator.h>

#include <phantom/Stream.h>
#include <phantom/hal.h>

#include <c10/core/Allocator.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace phantom::gloo_staging {

enum class Kind : uint8_t {
  AllReduce = 1,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  Send,
  Recv,
};

const char* kindName(Kind kind);  // "all_reduce", ...
inline bool isPointToPoint(Kind kind) {
  return kind == Kind::Send || kind == Kind::Recv;
}

// One call as all ranks must agree on it (peer-specific fields aside).
struct CallRecord {
  Kind kind;
  c10::ScalarType dtype;
  int64_t count;        // elements per rank (the send side's)
  ccl::ReduceOp op;     // reductions only
  int root;             // broadcast/reduce root; the peer of send/recv
};

// One dense copy between device memory and the job's pinned block.
struct Transfer {
  void* device;
  size_t host_offset;
  size_t bytes;
};

using GlooWorks = std::vector<c10::intrusive_ptr<c10d::Work>>;

// The communicator's thread waits here for its jobs' marks.
struct Readiness {
  std::mutex mutex;
  std::condition_variable changed;
};

// Set by a task queued on a stream a job was ordered after, when it runs
// (or is released unrun: a failed stream reports its own error, and the
// job must not wait for it forever).
struct ReadyMark {
  std::shared_ptr<Readiness> readiness;
  std::atomic<bool> reached{false};
};

struct Step {
  std::vector<Transfer> to_host;    // before the exchange
  std::vector<Transfer> to_device;  // after it
  // Starts the exchange over the pinned block `base` on the data backend
  // and appends the Gloo works to wait for.
  std::function<void(uint8_t* base, GlooWorks& works)> exchange;
  // The same exchange finished locally, for a small job: `ranks[r]` is
  // rank r's copy of the block (from the gathered agreement slots), and
  // the result goes into this rank's `base`. Empty for a call that has no
  // such form, or whose result would not be Gloo's bits (a float sum over
  // three or more ranks: Gloo adds in its ring's order).
  std::function<void(uint8_t* base, const std::vector<const uint8_t*>& ranks)> combine;
  bool point_to_point = false;  // merged with the group's other sends/recvs
};

// Host-visible addresses of a zero-copy job's device buffers, resolved by
// the job's stream task (ph_kernel_address is only valid inside stream
// work) and valid while that task runs, which is until the job has ended.
class KernelViews {
 public:
  // Registers a device buffer the job's direct steps will reach.
  void need(const void* device, size_t bytes) {
    if (bytes > 0) {
      needed_.push_back(device);
    }
  }
  // Inside the stream task: resolves every registered buffer. Returns the
  // failing status (ph_last_error_message says why) or PH_SUCCESS.
  ph_status_t resolve() {
    for (const void* device : needed_) {
      void* view = nullptr;
      const ph_status_t status = ph_kernel_address(device, &view);
      if (status != PH_SUCCESS) {
        return status;
      }
      views_.emplace_back(device, static_cast<uint8_t*>(view));
    }
    return PH_SUCCESS;
  }
  // The view of a registered buffer (nullptr for an empty one).
  uint8_t* at(const void* device) const {
    for (const auto& [d, view] : views_) {
      if (d == device) {
        return view;
      }
    }
    return nullptr;
  }

 private:
  std::vector<const void*> needed_;
  std::vector<std::pair<const void*, uint8_t*>> views_;
};

// A step of a zero-copy job: starts Gloo's exchange directly over the
// views of the device buffers and appends the Gloo works to wait for.
struct DirectStep {
  std::function<void(const KernelViews& views, GlooWorks& works)> exchange;
  bool point_to_point = false;  // merged with the group's other sends/recvs
};

struct Job {
  // Collectives are numbered in call order (the same on every rank);
  // point-to-point jobs carry the number of the last collective before them.
  uint64_t collective = 0;
  std::string label;  // "all_reduce #12 (1048576 x float32, sum)"
  std::vector<CallRecord> calls;
  std::vector<Step> steps;
  size_t host_bytes = 0;
  // The zero-copy form: used when the communicator runs zero-copy and
  // every call had one (`direct_capable`); decided when the job is queued.
  std::vector<DirectStep> direct_steps;
  KernelViews views;
  bool direct_capable = true;
  bool zero_copy = false;
  c10::DataPtr pinned;  // taken and freed by the communicator's thread
  PhantomStream stream;
  // One per stream the job was ordered after: its inputs are ready once
  // all are reached.
  std::vector<std::shared_ptr<ReadyMark>> ready;
  // For a job the communicator's thread runs: the last small job before it
  // that runs in its stream task, which must end before this one touches
  // any buffer (the two may share one; the stream orders everything else).
  std::shared_ptr<Job> after_in_task;

  // Small (Agreement.h): every step has a combine and the job moves at
  // most kSmallJobBytes, so its data travels in its agreement slot and no
  // data backend call is made. Decided when the job is queued.
  bool small = false;

  // Agreement: this rank's slot and the gathered slots, and the headers of
  // the point-to-point messages this rank receives (control backend).
  // `agreement_sent` once those calls are made (under the communicator's
  // agreement mutex: by the calling thread, or for a small job and those
  // queued after it by whichever thread runs the small job).
  bool agreement_sent = false;
  c10::intrusive_ptr<c10d::Work> fingerprint_work;
  at::Tensor slot;   // kSlotBytes
  at::Tensor slots;  // size x kSlotBytes
  struct IncomingHeader {
    size_t call;  // index into `calls`
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor header;
  };
  std::vector<IncomingHeader> incoming_headers;
  GlooWorks outgoing_headers;
  // An all-to-all's split sizes: what each rank sends each peer, gathered,
  // against what this rank expects to receive.
  struct SplitCheck {
    size_t call;
    std::vector<int64_t> send_counts;
    std::vector<int64_t> recv_counts;
    at::Tensor gathered;  // per rank: its send counts, then its receive counts
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<SplitCheck> split_checks;

  // The "kernel" the fault injector counts: runs before any data moves.
  std::function<void()> prologue;
  // Set when queueing the job's stream task failed on this rank.
  std::string submit_error;

  // A zero-copy job: set by the communicator's thread once its inputs are
  // ready and the ranks agree (under `mutex`, signalled by `ended`); the
  // stream task then runs `run_direct`. `released` runs when the stream
  // task is released, run or not (`ran`).
  bool prepared = false;
  std::function<void(Job&)> run_direct;
  std::function<void(Job&, bool ran)> released;

  // How it ended, shared with the task that holds the stream.
  std::mutex mutex;
  std::condition_variable ended;
  std::atomic<bool> done{false};
  std::atomic<bool> failed{false};
  std::string error;  // written once, before `failed` is set

  explicit Job(PhantomStream s) : stream(s) {}
};

}  // namespace phantom::gloo_staging
