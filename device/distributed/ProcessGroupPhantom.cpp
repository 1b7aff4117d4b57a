// See phantom/distributed/ProcessGroupPhantom.h. The group's life (its
// streams, health, split, coalescing, abort and shutdown) and issue(), which
// every collective goes through; the collectives themselves are in
// ProcessGroupCollectives.cpp.
#include <phantom/distributed/ProcessGroupPhantom.h>

#include "ProcessGroupCall.h"

#include <phantom/DeviceAllocator.h>
#include <phantom/Exception.h>
#include <phantom/GpuTrace.h>
#include <phantom/Stream.h>

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

namespace phantom::distributed {

ProcessGroupPhantom::ProcessGroupPhantom(
    int rank, int size, std::chrono::milliseconds timeout,
    std::string group_name, std::unique_ptr<ccl::Communicator> communicator)
    : c10d::Backend(rank, size),
      group_name_(std::move(group_name)),
      options_(c10::make_intrusive<PcclOptions>(timeout)),
      communicator_(std::move(communicator)) {
  TORCH_CHECK(communicator_ && communicator_->rank() == rank &&
                  communicator_->size() == size,
              "pccl: the communicator's rank and size must be the group's");
  init();
}

ProcessGroupPhantom::~ProcessGroupPhantom() {
  communicator_.reset();
  std::lock_guard<std::mutex> lock(health_->mutex);
  health_->first_failure.reset();
}

const PhantomStream& ProcessGroupPhantom::commStream(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < static_cast<int>(comm_streams_.size()),
              "pccl: device index ", static_cast<int>(device), " out of range");
  std::optional<PhantomStream>& stream = comm_streams_[device];
  if (!stream) {
    stream = getStreamFromPool(/*high_priority=*/true, device);
  }
  return *stream;
}

void ProcessGroupPhantom::throwIfBroken(const char* op) {
  TORCH_CHECK(!shut_down_, "pccl ", op, ": group '", group_name_,
              "' has been shut down (destroy_process_group)");
  if (!health_->broken.load(std::memory_order_acquire)) {
    return;
  }
  std::shared_ptr<Completion> failed;
  {
    std::lock_guard<std::mutex> lock(health_->mutex);
    failed = health_->first_failure;
  }
  const std::string why = failed ? failed->failureMessage() : "it was aborted";
  // The failure is being reported now: take it off the communication
  // streams, so that a later synchronize does not report it again.
  for (const auto& stream : comm_streams_) {
    if (stream) {
      try {
        (void)stream->query();
      } catch (const std::exception&) {
      }
    }
  }
  C10_THROW_ERROR(DistBackendError,
                  std::string("pccl ") + op + " refused: group '" + group_name_ +
                      "' is broken by an earlier failure: " + why +
                      ". Destroy it (destroy_process_group) and create a new one");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::issue(Call& call) {
  std::lock_guard<std::mutex> lock(call_mutex_);
  throwIfBroken(call.name);
  TORCH_CHECK(!(coalescing_ && call.after), "pccl ", call.name,
              " cannot be part of a coalesced group (its outputs are copied "
              "after the collective); call it outside the group");
  TORCH_INTERNAL_ASSERT(call.device.has_value());
  const c10::DeviceIndex index = call.device->index();
  c10::DeviceGuard device_guard(*call.device);
  const PhantomStream& comm = commStream(index);
  const PhantomStream waiting = getCurrentPhantomStream(index);
  if (call.before) {
    call.before(waiting);
  }
  // After the work already queued on the caller's stream.
  communicator_->orderAfter(waiting, comm);
  // For the race detector (phantom/GpuTrace.h): the collective's accesses
  // happen on the communication stream, after the caller's stream, and
  // its tensors are held back for that stream as by record_stream.
  gpu_trace::workQueuedOn(waiting.handle(), index, comm.id(), comm.handle());
  for (const at::Tensor& t : call.used) {
    deviceAllocator().recordStream(t.storage().data_ptr(), comm.unwrap());
    gpu_trace::streamRecordedOn(t.storage().data_ptr().get(),
                                gpu_trace::id(comm.handle()));
  }
  call.body(comm);
  if (call.after) {
    call.after(comm);
  }
  for (const c10::DataPtr& buffer : call.scratch_buffers) {
    deviceAllocator().recordStream(buffer, comm.unwrap());
  }
  const uint64_t sequence = ++sequence_;
  if (coalescing_) {
    TORCH_CHECK(!coalesced_device_ || *coalesced_device_ == index,
                "pccl: the calls of a coalesced group must use one device; got ",
                static_cast<int>(*coalesced_device_), " and ", static_cast<int>(index));
    coalesced_device_ = index;
    coalesced_outputs_.insert(coalesced_outputs_.end(), call.outputs.begin(),
                              call.outputs.end());
    return c10::make_intrusive<WorkPhantom>(rank_, call.type, sequence,
                                            coalesced_, std::move(call.outputs),
                                            false);
  }
  auto completion = std::make_shared<Completion>(
      std::string(call.name) + " (call " + std::to_string(sequence) +
          " of pccl group '" + group_name_ + "')",
      health_);
  completion->queueAfter(comm);
  return c10::make_intrusive<WorkPhantom>(rank_, call.type, sequence,
                                          std::move(completion),
                                          std::move(call.outputs),
                                          call.host_blocking_wait);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupPhantom::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  std::lock_guard<std::mutex> lock(call_mutex_);
  throwIfBroken("split_group");
  std::unique_ptr<ccl::Communicator> communicator =
      communicator_->split(ranks, store, opts->group_name);
  if (!communicator) {
    return nullptr;  // this rank is not in `ranks`
  }
  const int rank = communicator->rank();
  const int size = communicator->size();
  auto group = c10::make_intrusive<ProcessGroupPhantom>(
      rank, size, opts->timeout, opts->group_name, std::move(communicator));
  group->setBoundDeviceId(bound_device_id_);
  return group;
}

void ProcessGroupPhantom::startCoalescing() {
  std::lock_guard<std::mutex> lock(call_mutex_);
  TORCH_CHECK(!coalescing_, "pccl: startCoalescing() twice without endCoalescing()");
  communicator_->groupStart();
  coalescing_ = true;
  coalesced_ = std::make_shared<Completion>(
      "coalesced group of pccl group '" + group_name_ + "'", health_);
  coalesced_device_.reset();
  coalesced_outputs_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::endCoalescing() {
  std::lock_guard<std::mutex> lock(call_mutex_);
  TORCH_CHECK(coalescing_, "pccl: endCoalescing() without startCoalescing()");
  coalescing_ = false;
  const c10::DeviceIndex device =
      coalesced_device_ ? *coalesced_device_ : getCurrentPhantomStream().device_index();
  communicator_->groupEnd();
  coalesced_->queueAfter(commStream(device));
  return c10::make_intrusive<WorkPhantom>(
      rank_, c10d::OpType::COALESCED, sequence_, std::move(coalesced_),
      std::move(coalesced_outputs_), false);
}


uint64_t ProcessGroupPhantom::getSequenceNumberForGroup() {
  return sequence_;
}

c10d::ErrorType ProcessGroupPhantom::getError() {
  return health_->broken.load() ? c10d::ErrorType::COMM_ERROR
                                : c10d::ErrorType::SUCCESS;
}

void ProcessGroupPhantom::abort() {
  std::lock_guard<std::mutex> lock(call_mutex_);
  if (communicator_) {
    communicator_->abort("the group was aborted (ProcessGroup.abort())");
  }
  health_->broken.store(true);
}

void ProcessGroupPhantom::shutdown() {
  std::lock_guard<std::mutex> lock(call_mutex_);
  shut_down_ = true;
  communicator_.reset();  // its thread finishes what was queued, then exits
}

}  // namespace phantom::distributed
