// The Gloo staging communicator, its own thread: running the jobs, and
// what happens when one fails (GlooStagingCommunicator.h).
#include "GlooStagingCommunicator.h"

#include <phantom/HostAllocator.h>

#include <c10/util/Exception.h>

#include <cstring>
#include <optional>

#include <pthread.h>

namespace phantom::gloo_staging {

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

namespace {

void copy(void* dst, const void* src, size_t bytes, ph_memcpy_kind_t kind) {
  if (bytes == 0) {
    return;
  }
  const ph_status_t status = ph_memcpy(dst, src, bytes, kind);
  if (status != PH_SUCCESS) {
    throw std::runtime_error(
        std::string(kind == PH_MEMCPY_DEVICE_TO_HOST ? "copying its input to the host"
                                                     : "copying its result to the device") +
        " failed: " + ph_last_error_message());
  }
}

void copyIn(const Step& step, uint8_t* host) {
  for (const Transfer& t : step.to_host) {
    copy(host + t.host_offset, t.device, t.bytes, PH_MEMCPY_DEVICE_TO_HOST);
  }
}

void copyOut(const Step& step, uint8_t* host) {
  for (const Transfer& t : step.to_device) {
    copy(t.device, host + t.host_offset, t.bytes, PH_MEMCPY_HOST_TO_DEVICE);
  }
}

// The same, inside stream work, through the job's kernel views.
void copyInThroughViews(const Step& step, const KernelViews& views, uint8_t* host) {
  for (const Transfer& t : step.to_host) {
    if (t.bytes > 0) {
      std::memcpy(host + t.host_offset, views.at(t.device), t.bytes);
    }
  }
}

void copyOutThroughViews(const Step& step, const KernelViews& views, uint8_t* host) {
  for (const Transfer& t : step.to_device) {
    if (t.bytes > 0) {
      std::memcpy(views.at(t.device), host + t.host_offset, t.bytes);
    }
  }
}

void waitAll(GlooWorks& works) {
  for (auto& work : works) {
    work->wait();
  }
  works.clear();
}

std::atomic<uint64_t> zero_copy_jobs{0};
std::atomic<uint64_t> staged_jobs{0};
std::atomic<uint64_t> small_jobs{0};

}  // namespace

DataPathCounts dataPathCounts() {
  return {zero_copy_jobs.load(), staged_jobs.load(), small_jobs.load()};
}

void GlooStagingCommunicator::serve() {
  pthread_setname_np(pthread_self(), "pccl-comm");  // in top -H, perf, gdb
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
    run(job);
  }
}

void GlooStagingCommunicator::run(const std::shared_ptr<Job>& shared) {
  Job& job = *shared;
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
    waitForInputs(job);
    if (job.after_in_task && !job.zero_copy) {  // a zero-copy job's task follows it
      waitForEnd(*job.after_in_task);
    }
    job.after_in_task.reset();
    job.prologue();  // the fault injector's kernel
    cause = Cause::Exchange;
    if (job.small) {
      waitForDirect();
      runSmall(job, cause, /*through_views=*/false);
      end(job);
      return;
    }
    waitForAgreement(job);
    if (job.zero_copy) {
      // A zero-copy job on another stream than the last is not ordered
      // after it by its stream.
      if (last_direct_ && !(last_direct_->stream == job.stream)) {
        waitForDirect();
      }
      {
        std::lock_guard<std::mutex> lock(job.mutex);
        job.prepared = true;
      }
      job.ended.notify_all();
      last_direct_ = shared;
      return;  // the stream task runs it (runDirect)
    }
    waitForDirect();
    runStaged(job, cause);
    end(job);
  } catch (const DisagreementError& e) {
    fail(job, Cause::Agreement, e.what());
  } catch (const std::exception& e) {
    fail(job, cause, messageOf(e));
  }
  job.pinned.clear();
}

// The inputs are ready once the streams the job was ordered after have run
// their marks (a failed stream drops its mark, which also sets it: that
// stream reports its own error).
void GlooStagingCommunicator::waitForInputs(const Job& job) {
  for (const auto& mark : job.ready) {
    if (!mark->reached.load(std::memory_order_acquire)) {
      std::unique_lock<std::mutex> lock(readiness_->mutex);
      readiness_->changed.wait(
          lock, [&] { return mark->reached.load(std::memory_order_acquire); });
    }
  }
}

void GlooStagingCommunicator::waitForEnd(Job& job) {
  std::unique_lock<std::mutex> lock(job.mutex);
  job.ended.wait(lock, [&] { return job.done.load(std::memory_order_acquire); });
}

void GlooStagingCommunicator::waitForDirect() {
  if (!last_direct_) {
    return;
  }
  waitForEnd(*last_direct_);
  last_direct_.reset();
}

// On the stream's worker, inside the job's stream task: the stream has run
// the work queued on it before the collective, and holds still until the
// task returns, so the views are valid throughout.
void GlooStagingCommunicator::runDirect(Job& job) {
  Cause cause = Cause::Local;
  try {
    if (job.views.resolve() != PH_SUCCESS) {
      throw std::runtime_error(
          std::string("the driver gave no kernel view of its buffers: ") +
          ph_last_error_message());
    }
    {
      std::unique_lock<std::mutex> lock(job.mutex);
      job.ended.wait(lock, [&] {
        return job.prepared || job.done.load(std::memory_order_acquire);
      });
      if (job.done.load(std::memory_order_acquire)) {
        return;  // failed while the thread prepared it
      }
    }
    if (broken_.load()) {
      cause = Cause::Broken;
      std::lock_guard<std::mutex> lock(broken_mutex_);
      throw std::runtime_error(broken_reason_);
    }
    zero_copy_jobs.fetch_add(1, std::memory_order_relaxed);
    cause = Cause::Exchange;
    GlooWorks in_flight;
    for (const DirectStep& step : job.direct_steps) {
      step.exchange(job.views, in_flight);
      waitAll(in_flight);
    }
    end(job);
  } catch (const std::exception& e) {
    fail(job, cause, messageOf(e));
  }
}

void GlooStagingCommunicator::directReleased(Job& job, bool ran) {
  if (!ran && !job.done.load(std::memory_order_acquire)) {
    // The stream failed before the collective (its own error is the
    // caller's to see); the peers must not wait for this rank.
    fail(job, Cause::Local, "its communication stream failed before the collective started");
  }
  {
    std::lock_guard<std::mutex> lock(direct_mutex_);
    --direct_outstanding_;
  }
  direct_done_.notify_all();
}

void GlooStagingCommunicator::runStaged(Job& job, Cause& cause) {
  staged_jobs.fetch_add(1, std::memory_order_relaxed);
  // The staging memory is taken here, not when the job is queued: the
  // caller may queue many collectives ahead, and each would hold its own
  // block (fresh pages, and memory without bound). One job at a time
  // reuses one cached block, whose pages stay mapped and warm.
  if (job.host_bytes > 0) {
    job.pinned = pinnedHostAllocator()->allocate(job.host_bytes);
  }
  // The pipeline: step s+1 is copied in and step s-1 copied out while
  // Gloo's threads exchange step s.
  auto* host = static_cast<uint8_t*>(job.pinned.get());
  const size_t steps = job.steps.size();
  GlooWorks in_flight;
  cause = Cause::Local;
  copyIn(job.steps[0], host);
  cause = Cause::Exchange;
  job.steps[0].exchange(host, in_flight);
  for (size_t s = 0; s < steps; ++s) {
    if (s + 1 < steps) {
      cause = Cause::Local;
      copyIn(job.steps[s + 1], host);
    }
    cause = Cause::Exchange;
    waitAll(in_flight);
    if (s + 1 < steps) {
      job.steps[s + 1].exchange(host, in_flight);
    }
    cause = Cause::Local;
    copyOut(job.steps[s], host);
  }
}

// A small job needs no data backend: its exchange is its agreement message
// (Agreement.h), on the control backend, which keeps call order by itself.
// The communicator's thread copies with ph_memcpy; a stream task, inside
// stream work, through the kernel views (`through_views`).
void GlooStagingCommunicator::runSmall(Job& job, Cause& cause, bool through_views) {
  small_jobs.fetch_add(1, std::memory_order_relaxed);
  job.slot = agreementSlot(job);
  uint8_t* mine = slotPayload(job.slot);
  cause = Cause::Local;
  for (const Step& step : job.steps) {
    through_views ? copyInThroughViews(step, job.views, mine) : copyIn(step, mine);
  }
  cause = Cause::Exchange;
  sendSmallAgreement(job);
  waitForAgreement(job);
  std::vector<const uint8_t*> ranks(config_.size);
  for (int r = 0; r < config_.size; ++r) {
    ranks[r] = gatheredPayload(job.slots, r);
  }
  cause = Cause::Local;
  for (const Step& step : job.steps) {
    step.combine(mine, ranks);  // the slot has been sent: reused for the result
    through_views ? copyOutThroughViews(step, job.views, mine) : copyOut(step, mine);
  }
}

// On the stream's worker, inside the job's stream task: what run() does
// before a small job, then runSmall through the kernel views.
void GlooStagingCommunicator::runSmallInTask(Job& job) {
  Cause cause = Cause::Local;
  try {
    waitForInputs(job);
    job.prologue();  // the fault injector's kernel
    if (broken_.load()) {
      cause = Cause::Broken;
      std::lock_guard<std::mutex> lock(broken_mutex_);
      throw std::runtime_error(broken_reason_);
    }
    if (job.views.resolve() != PH_SUCCESS) {
      throw std::runtime_error(
          std::string("the driver gave no kernel view of its buffers: ") +
          ph_last_error_message());
    }
    runSmall(job, cause, /*through_views=*/true);
    end(job);
  } catch (const DisagreementError& e) {
    fail(job, Cause::Agreement, e.what());
  } catch (const std::exception& e) {
    fail(job, cause, messageOf(e));
  }
}

void GlooStagingCommunicator::waitForAgreement(Job& job) {
  {
    // A job queued behind a small one sends when that one does.
    std::unique_lock<std::mutex> lock(agreement_mutex_);
    agreement_sent_cv_.wait(lock, [&] { return job.agreement_sent || broken_.load(); });
    if (!job.agreement_sent) {
      throw std::runtime_error(
          "the communicator broke before this collective's message was sent");
    }
  }
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
void GlooStagingCommunicator::checkSplits(const Job::SplitCheck& check) const {
  const int64_t* all = check.gathered.const_data_ptr<int64_t>();
  const int size = config_.size;
  const auto sends = [&](int from, int to) { return all[from * 2 * size + to]; };
  const auto expects = [&](int at, int from) { return all[at * 2 * size + size + from]; };
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

void GlooStagingCommunicator::end(Job& job) {
  {
    std::lock_guard<std::mutex> lock(job.mutex);
    job.done.store(true, std::memory_order_release);
  }
  job.ended.notify_all();
}

void GlooStagingCommunicator::fail(Job& job, Cause cause, std::string reason) {
  if (job.done.load(std::memory_order_acquire)) {
    return;  // a zero-copy job's thread and stream task may both fail it
  }
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
  } else if (cause != Cause::Broken) {
    // The peers' own errors will point here.
    diagnosis_.reportLocalFailure(message);
  }
  {
    std::lock_guard<std::mutex> lock(job.mutex);
    if (job.done.load(std::memory_order_acquire)) {
      return;  // a zero-copy job's thread and stream task may both fail it
    }
    job.error = message;
    job.failed.store(true, std::memory_order_release);
    job.done.store(true, std::memory_order_release);
  }
  job.ended.notify_all();
  if (cause != Cause::Broken) {
    breakCommunicator(message);
  }
}

void GlooStagingCommunicator::breakCommunicator(const std::string& reason) {
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
  {
    // Their messages will not go out; they fail when run.
    std::lock_guard<std::mutex> lock(agreement_mutex_);
    unsent_.clear();
  }
  agreement_sent_cv_.notify_all();
  // Destroying the backends closes their connections: peers waiting in
  // this collective fail now rather than at their timeout. Data first: a
  // peer blocked there is what breaks the peer's own control backend.
  data.reset();
  control.reset();
}

}  // namespace phantom::gloo_staging
