// The Work a pccl collective returns, and how it learns whether the
// collective succeeded.
//
// After the collective library has queued a collective on the group's
// communication stream, the group queues a completion task there and
// records an event after it (Completion). The task marks the collective
// succeeded when it runs; if the stream failed (the library's sticky error:
// a peer died, a device error) the driver releases it without running it,
// which marks the collective failed and the group broken. So the event
// says "the collective's device work is over" and the state says how it
// ended, with no host thread watching.
//
// WorkPhantom::wait() is NCCL's: it makes the caller's current stream wait
// for the event and returns without blocking the host. Behind the event
// wait it queues a check on the caller's stream that fails that stream if
// the collective failed, so the error surfaces at the caller's next
// synchronization (.item(), .cpu(), synchronize()), naming the collective,
// instead of leaving wrong data behind. wait(timeout) with a timeout, and
// barrier's wait, block the host until the collective is over (or the
// timeout passes) and raise its error there. getFuture() is NCCL's too: a
// future completed at once, whose value's users wait for the event on
// their own streams.
#pragma once

#include <phantom/Stream.h>
#include <phantom/hal.h>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace phantom::distributed {

// What a group shares with its collectives' completions: broken after the
// first failure.
struct Completion;
struct GroupHealth {
  std::atomic<bool> broken{false};
  std::mutex mutex;
  std::shared_ptr<Completion> first_failure;  // set once; cleared by the group
};

struct Completion : std::enable_shared_from_this<Completion> {
  enum State : int { kPending = 0, kSucceeded = 1, kFailed = 2 };

  Completion(std::string label, std::shared_ptr<GroupHealth> group);
  ~Completion();

  // Queues the completion task and the event on `stream`, after the
  // collective. Throws (and leaves the state pending) if the stream refuses.
  void queueAfter(const PhantomStream& stream);

  bool queued() const { return done_ != nullptr; }
  State state() const { return static_cast<State>(state_.load(std::memory_order_acquire)); }
  // True once the collective's device work is over (the event reached).
  bool finished() const;
  // Why it failed: the communication stream's error, fetched once.
  std::string failureMessage();

  const std::string& label() const { return label_; }
  ph_event_t doneEvent() const { return done_; }
  const PhantomStream& stream() const { return *stream_; }

 private:
  static ph_status_t run(void* self, char* error, size_t error_size);
  static void release(void* self);

  const std::string label_;
  std::shared_ptr<GroupHealth> group_;
  std::atomic<int> state_{kPending};
  std::optional<PhantomStream> stream_;
  ph_stream_t handle_ = nullptr;
  ph_event_t done_ = nullptr;
  std::mutex mutex_;
  std::string message_;
};

class WorkPhantom : public c10d::Work {
 public:
  WorkPhantom(int rank, c10d::OpType type, uint64_t sequence,
              std::shared_ptr<Completion> completion,
              std::vector<at::Tensor> outputs, bool host_blocking_wait);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void blockCurrentStream() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override;

 private:
  [[noreturn]] void raiseFailure() const;
  void checkQueued() const;
  void waitOnHost(std::chrono::milliseconds timeout);

  const uint64_t sequence_;
  const std::shared_ptr<Completion> completion_;
  const std::vector<at::Tensor> outputs_;
  const bool host_blocking_wait_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace phantom::distributed
