// The Gloo staging communicator (phantom/gloo_staging/GlooStaging.h).
//
// A call builds a Job (StagingJob.h) and, on the calling thread, in call
// order (GlooStagingCalls.cpp): starts the agreement exchange on the
// control backend (Agreement.h), counts the collective for the fault
// injector as one kernel, queues on the stream the one task that holds it
// until the job has ended, and hands the job to the communicator's thread.
// A small job (at most 8 KiB) is the exception: its agreement message
// carries its data, so it is sent once the data is on the host, and the
// messages of the calls after it wait in unsent_ until then; with a kernel
// view the small job runs in its stream task and never reaches the thread.
//
// The thread (GlooStagingThread.cpp) runs the jobs one at a time in call
// order, the order every rank uses: it waits until the job's inputs are
// ready (the marks of orderAfter), then either
//   - zero-copy (the driver has a kernel view, the job moves 64 KiB or
//     more and every call of it has a direct form): marks the job prepared
//     and goes on to the next; the job's stream task, when the stream
//     reaches it, resolves the kernel views of the job's buffers, waits for
//     that mark, and has Gloo exchange the buffers in place, holding the
//     stream meanwhile as a kernel would; or
//   - staged: pipelines the job's steps — the device-to-host copy of a
//     step, Gloo's exchange of it on Gloo's threads, the host-to-device
//     copy — with ph_memcpy calls made by this host thread;
// and releases the stream's task. Either way the buffers are ordered with
// the device by those marks and by the task: nothing else touches a
// collective's buffers until it has ended (NCCL's rule for its buffers).
// The thread never waits for a stream, except that a staged job waits for
// the zero-copy job before it to end (so the ranks issue their data calls
// in one order), and that job's task waits only for this thread's earlier
// work: no cycle. A stream worker in Gloo blocks only its own stream.
//
// So no stream worker ever waits for the network except through the one
// task per job, and the thread never waits for its own stream: back-to-back
// collectives start as soon as their inputs are ready. Failures: whatever
// fails — the fault injector's kernel, a copy, the agreement, the exchange
// — fails the job with a sentence naming it (and, for an exchange, the
// peer at fault: PeerDiagnosis.h); the stream's task returns that sentence,
// so the stream gets a sticky error; and the communicator breaks: a local
// failure is written to the store, then both Gloo backends are destroyed,
// which closes their connections, so peers blocked in this collective fail
// at once instead of at their timeout. Later jobs fail without running.
#pragma once

#include "Agreement.h"
#include "PeerDiagnosis.h"
#include "StagingJob.h"

#include <phantom/gloo_staging/GlooStaging.h>

#include <ATen/ThreadLocalState.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace phantom::gloo_staging {

class GlooStagingCommunicator final : public ccl::Communicator {
 public:
  explicit GlooStagingCommunicator(GlooStagingConfig config);
  ~GlooStagingCommunicator() override;

  int rank() const override { return config_.rank; }
  int size() const override { return config_.size; }
  bool supportsReduction(c10::ScalarType dtype, ccl::ReduceOp op) const override;

  void orderAfter(const PhantomStream& waiting, const PhantomStream& stream) override;
  void allReduce(const ccl::DeviceBuffer& send, const ccl::DeviceBuffer& recv,
                 ccl::ReduceOp op, const PhantomStream& stream) override;
  void broadcast(const ccl::DeviceBuffer& buffer, int root,
                 const PhantomStream& stream) override;
  void reduce(const ccl::DeviceBuffer& send, const ccl::DeviceBuffer& recv,
              ccl::ReduceOp op, int root, const PhantomStream& stream) override;
  void allGather(const ccl::DeviceBuffer& send, const ccl::DeviceBuffer& recv,
                 const PhantomStream& stream) override;
  void reduceScatter(const ccl::DeviceBuffer& send, const ccl::DeviceBuffer& recv,
                     ccl::ReduceOp op, const PhantomStream& stream) override;
  void allToAll(const ccl::DeviceBuffer& send, const std::vector<int64_t>& send_counts,
                const ccl::DeviceBuffer& recv, const std::vector<int64_t>& recv_counts,
                const PhantomStream& stream) override;
  void send(const ccl::DeviceBuffer& buffer, int peer,
            const PhantomStream& stream) override;
  void recv(const ccl::DeviceBuffer& buffer, int peer,
            const PhantomStream& stream) override;
  void groupStart() override { ++group_depth_; }
  void groupEnd() override;
  std::unique_ptr<ccl::Communicator> split(
      const std::vector<int>& ranks, const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& name) override;
  void abort(const std::string& reason) override { breakCommunicator(reason); }

 private:
  enum class Cause { Local, Agreement, Exchange, Broken };

  // --- the calling thread (GlooStagingCalls.cpp) ---
  c10::intrusive_ptr<c10d::Backend> data() const;
  c10::intrusive_ptr<c10d::Backend> control() const;
  Job& pendingJob(const PhantomStream& stream);
  template <typename Build>
  void addCall(CallRecord call, size_t host_bytes, const PhantomStream& stream,
               Build build);
  void pointToPoint(Kind kind, const ccl::DeviceBuffer& buffer, int peer,
                    const PhantomStream& stream);
  std::string labelOf(const Job& job) const;
  void submitPending();
  void startAgreement(Job& job);
  // On the communicator's thread: a small job's agreement (its slot filled),
  // then those of the jobs queued behind it (unsent_).
  void sendSmallAgreement(Job& job);
  void queueStreamTask(const std::shared_ptr<Job>& job);

  // --- the communicator's thread (GlooStagingThread.cpp) ---
  void serve();
  void run(const std::shared_ptr<Job>& job);
  void runStaged(Job& job, Cause& cause);
  void waitForInputs(const Job& job);
  // --- a small job: on the thread, or (through the kernel views) in its
  // stream task, runSmallInTask (GlooStagingThread.cpp) ---
  void runSmall(Job& job, Cause& cause, bool through_views);
  void runSmallInTask(Job& job);
  void waitForDirect();
  static void waitForEnd(Job& job);
  // --- a zero-copy job's stream task (GlooStagingThread.cpp) ---
  void runDirect(Job& job);
  void directReleased(Job& job, bool ran);
  void waitForAgreement(Job& job);
  void checkSplits(const Job::SplitCheck& check) const;
  void end(Job& job);
  void fail(Job& job, Cause cause, std::string reason);
  void breakCommunicator(const std::string& reason);

  GlooStagingConfig config_;
  // The driver offers a kernel view: jobs with a direct form run zero-copy.
  const bool zero_copy_;
  c10::intrusive_ptr<c10d::Backend> data_;
  c10::intrusive_ptr<c10d::Backend> control_;
  PeerDiagnosis diagnosis_;

  // A thread-local state with nothing of the caller's in it (no Python
  // dispatch or function modes, no saved-tensor hooks): the agreement's Gloo
  // calls, made on the calling thread, run under it. A Gloo work keeps the
  // thread-local state it was made under until it is destroyed, and the job
  // holding it is destroyed by the stream's worker; a Python object in that
  // state would make the worker take the GIL, which a caller waiting for the
  // stream (a DTensor op) holds.
  std::unique_ptr<const at::ThreadLocalState> clean_state_;

  // The calling thread's state (callers are serialised).
  int group_depth_ = 0;
  std::shared_ptr<Job> pending_;
  std::shared_ptr<Job> last_in_task_;  // the last small job run in its task
  std::vector<std::shared_ptr<ReadyMark>> ready_;  // orderAfter's, for the next job
  std::shared_ptr<Readiness> readiness_ = std::make_shared<Readiness>();
  uint64_t collectives_ = 0;

  // The last zero-copy job prepared: a staged job (whose Gloo calls this
  // thread makes) starts after it has ended, so every rank makes its data
  // backend's calls in one order. The thread's own.
  std::shared_ptr<Job> last_direct_;
  // Zero-copy jobs whose stream task has not been released yet.
  std::mutex direct_mutex_;
  std::condition_variable direct_done_;
  size_t direct_outstanding_ = 0;

  // Jobs whose agreement message has not gone out, in call order: a small
  // job waiting for its data, and the jobs queued behind it. Messages are
  // sent under the mutex, by the calling thread or the communicator's.
  std::mutex agreement_mutex_;
  std::condition_variable agreement_sent_cv_;
  std::deque<std::shared_ptr<Job>> unsent_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::thread thread_;

  mutable std::mutex broken_mutex_;
  std::atomic<bool> broken_{false};
  std::string broken_reason_;
};

// Gloo's sentence without its source location and its boilerplate advice.
std::string messageOf(const std::exception& e);

}  // namespace phantom::gloo_staging
