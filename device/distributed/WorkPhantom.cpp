// See phantom/distributed/WorkPhantom.h.
#include <phantom/distributed/WorkPhantom.h>

#include <phantom/Exception.h>
#include <phantom/GpuTrace.h>

#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace phantom::distributed {
namespace {

using Holder = std::shared_ptr<Completion>;

// The driver prefixes a task's sentence with "work 'NAME' failed on phantom
// device D: "; the collective's own sentence already names it.
std::string withoutTaskPrefix(std::string message) {
  const std::string prefix = "work 'pccl collective' failed on phantom device ";
  if (message.compare(0, prefix.size(), prefix) == 0) {
    const size_t colon = message.find(": ", prefix.size());
    if (colon != std::string::npos) {
      message.erase(0, colon + 2);
    }
  }
  return message;
}

// Queued on the waiting stream behind the event wait: fails that stream if
// the collective failed.
ph_status_t checkRun(void* self, char* error, size_t error_size) {
  Completion& completion = **static_cast<Holder*>(self);
  if (completion.state() != Completion::kFailed) {
    return PH_SUCCESS;
  }
  std::snprintf(error, error_size, "%s", completion.failureMessage().c_str());
  return PH_ERROR_DEVICE;
}

void checkRelease(void* self) {
  delete static_cast<Holder*>(self);
}

}  // namespace

Completion::Completion(std::string label, std::shared_ptr<GroupHealth> group)
    : label_(std::move(label)), group_(std::move(group)) {}

Completion::~Completion() {
  if (done_ != nullptr) {
    (void)ph_event_destroy(done_);
  }
}

void Completion::queueAfter(const PhantomStream& stream) {
  stream_ = stream;
  handle_ = stream.handle();
  const ph_host_task_t task{"pccl completion", &Completion::run,
                            &Completion::release,
                            new Holder(shared_from_this())};
  // A refusal (the stream already failed) released the task, which marked
  // this collective failed; check() reports the stream's error to the caller.
  stream.check(ph_launch_host_func(handle_, &task), handle_);
  ph_event_t done = nullptr;
  PHANTOM_CHECK(ph_event_create(PH_EVENT_DISABLE_TIMING, &done));
  PHANTOM_CHECK(ph_event_record(done, handle_));
  done_ = done;
  // Traced (phantom/GpuTrace.h) so that a stream waiting on it, or the host
  // synchronizing or querying it, is seen ordered after the collective.
  gpu_trace::eventRecorded(done, handle_);
}

ph_status_t Completion::run(void* self, char*, size_t) {
  Completion& completion = **static_cast<Holder*>(self);
  int pending = kPending;
  completion.state_.compare_exchange_strong(pending, kSucceeded,
                                            std::memory_order_acq_rel);
  return PH_SUCCESS;
}

void Completion::release(void* self) {
  auto* holder = static_cast<Holder*>(self);
  Completion& completion = **holder;
  int pending = kPending;
  if (completion.state_.compare_exchange_strong(pending, kFailed,
                                                std::memory_order_acq_rel)) {
    // Released without running: the stream failed before reaching it.
    GroupHealth& group = *completion.group_;
    std::lock_guard<std::mutex> lock(group.mutex);
    if (!group.first_failure) {
      group.first_failure = *holder;
    }
    group.broken.store(true, std::memory_order_release);
  }
  delete holder;
}

bool Completion::finished() const {
  const State now = state();
  if (now == kFailed) {
    return true;
  }
  if (now != kSucceeded || done_ == nullptr || ph_event_query(done_) != PH_SUCCESS) {
    return false;
  }
  gpu_trace::queryFinished(true, gpu_trace::id(done_));  // the host saw it end
  return true;
}

std::string Completion::failureMessage() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (message_.empty()) {
    const ph_status_t status =
        handle_ != nullptr ? ph_stream_query(handle_) : PH_SUCCESS;
    if (status != PH_SUCCESS && status != PH_NOT_READY) {
      message_ = withoutTaskPrefix(ph_last_error_message());
    } else {
      message_ = label_ +
                 " failed; its communication stream's error was reported "
                 "earlier (by a synchronize or another wait)";
    }
  }
  return message_;
}

WorkPhantom::WorkPhantom(int rank, c10d::OpType type, uint64_t sequence,
                         std::shared_ptr<Completion> completion,
                         std::vector<at::Tensor> outputs,
                         bool host_blocking_wait)
    : c10d::Work(rank, type),
      sequence_(sequence),
      completion_(std::move(completion)),
      outputs_(std::move(outputs)),
      host_blocking_wait_(host_blocking_wait) {}

void WorkPhantom::checkQueued() const {
  TORCH_CHECK(completion_->queued() ||
                  completion_->state() == Completion::kFailed,
              "pccl: this Work belongs to a coalesced group that has not "
              "ended yet; wait for the Work the group's end returns");
}

bool WorkPhantom::isCompleted() {
  return completion_->queued() && completion_->finished();
}

bool WorkPhantom::isSuccess() const {
  return completion_->state() == Completion::kSucceeded;
}

std::exception_ptr WorkPhantom::exception() const {
  if (completion_->state() != Completion::kFailed) {
    return nullptr;
  }
  try {
    raiseFailure();
  } catch (...) {
    return std::current_exception();
  }
}

void WorkPhantom::raiseFailure() const {
  C10_THROW_ERROR(DistBackendError, completion_->failureMessage());
}

std::vector<at::Tensor> WorkPhantom::result() {
  return outputs_;
}

void WorkPhantom::blockCurrentStream() {
  checkQueued();
  if (completion_->state() == Completion::kSucceeded && completion_->finished()) {
    return;  // nothing left to wait for
  }
  const PhantomStream waiting =
      getCurrentPhantomStream(completion_->stream().device_index());
  const ph_stream_t handle = waiting.handle();
  waiting.check(ph_stream_wait_event(handle, completion_->doneEvent()), handle);
  gpu_trace::eventWaited(completion_->doneEvent(), handle);
  const ph_host_task_t task{"pccl wait", &checkRun, &checkRelease,
                            new Holder(completion_)};
  waiting.check(ph_launch_host_func(handle, &task), handle);
}

void WorkPhantom::synchronize() {
  blockCurrentStream();
}

void WorkPhantom::waitOnHost(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout) {
    // The state says how it ended; a failed stream's event still fires.
    (void)ph_event_synchronize(completion_->doneEvent());
    gpu_trace::eventSynchronized(completion_->doneEvent());
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(20);
  while (!completion_->finished()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      C10_THROW_ERROR(DistBackendError,
                      "pccl: " + completion_->label() + " did not finish within " +
                          std::to_string(timeout.count()) +
                          " ms (Work.wait(timeout)); it is still queued or "
                          "waiting for its peers");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

bool WorkPhantom::wait(std::chrono::milliseconds timeout) {
  checkQueued();
  if (completion_->state() == Completion::kFailed) {
    raiseFailure();
  }
  if (timeout != kNoTimeout || host_blocking_wait_) {
    waitOnHost(timeout);
    if (completion_->state() == Completion::kFailed) {
      raiseFailure();
    }
    return true;
  }
  blockCurrentStream();
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkPhantom::getFuture() {
  checkQueued();
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (!future_) {
    const PhantomStream& stream = completion_->stream();
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()),
        std::vector<c10::Device>{stream.device()});
    if (completion_->state() == Completion::kFailed) {
      future_->setError(exception());
    } else {
      // Completed now, with events on the communication stream: whoever
      // uses the value waits for them on its own stream (NCCL's future).
      c10::StreamGuard on_comm_stream(stream.unwrap());
      future_->markCompleted(c10::IValue(outputs_));
    }
  }
  return future_;
}

uint64_t WorkPhantom::getSequencenumber() const {
  return sequence_;
}

}  // namespace phantom::distributed
