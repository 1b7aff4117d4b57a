// pccl: the c10d backend for phantom tensors.
//
// torch.distributed calls it for every collective on a phantom tensor
// (registered by python/torch_phantom/distributed.py for device type
// "phantom"). It checks the arguments at the call, orders the collective
// after the work already queued on the caller's current stream (an event
// recorded there, waited for by the group's communication stream), keeps
// the tensors' memory alive for that stream (record_stream), hands the
// device buffers to the collective library (phantom/ccl/Communicator.h) on
// the communication stream, and returns a WorkPhantom
// (phantom/distributed/WorkPhantom.h). Each device the group uses has its
// own communication stream, a high-priority stream of the device's pool,
// as ProcessGroupNCCL takes one per device.
//
// Everything PyTorch's collectives need beyond the library's few calls is
// composed here: list forms (all_gather, reduce_scatter, all_to_all) stage
// through a flat device buffer, gather and scatter are groups of sends and
// receives, barrier is an all-reduce of one byte whose wait blocks the
// host, and coalescing (_coalescing_manager, batch_isend_irecv) is a
// library group.
//
// After a collective fails, the group is broken, as an NCCL group is after
// its communicator aborts: every later call raises at once, naming the
// first failure. Destroy the group and make a new one.
#pragma once

#include <phantom/ccl/Communicator.h>
#include <phantom/distributed/WorkPhantom.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace phantom::distributed {

constexpr const char* kBackendName = "pccl";

class ProcessGroupPhantom final : public c10d::Backend {
 public:
  // The timeout and group name; no settings of pccl's own.
  struct PcclOptions : c10d::Backend::Options {
    explicit PcclOptions(std::chrono::milliseconds timeout)
        : c10d::Backend::Options(kBackendName, timeout) {}
  };

  ProcessGroupPhantom(int rank, int size, std::chrono::milliseconds timeout,
                      std::string group_name,
                      std::unique_ptr<ccl::Communicator> communicator);
  ~ProcessGroupPhantom() override;

  const std::string getBackendName() const override { return kBackendName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  bool supportsCoalescing() const override { return true; }
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<PcclOptions> options() const { return options_; }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = {}) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override;
  c10d::ErrorType getError() override;
  void abort() override;
  void shutdown() override;

 private:
  struct Call;  // one collective being issued (ProcessGroupCall.h)

  c10::intrusive_ptr<c10d::Work> issue(Call& call);
  const PhantomStream& commStream(c10::DeviceIndex device);
  void throwIfBroken(const char* op);

  const std::string group_name_;
  c10::intrusive_ptr<PcclOptions> options_;
  std::shared_ptr<GroupHealth> health_ = std::make_shared<GroupHealth>();
  std::mutex call_mutex_;  // calls reach the library one at a time
  std::unique_ptr<ccl::Communicator> communicator_;
  std::array<std::optional<PhantomStream>, 64> comm_streams_;
  uint64_t sequence_ = 0;
  bool shut_down_ = false;

  // Coalescing: the group's completion, its device and its outputs.
  bool coalescing_ = false;
  std::shared_ptr<Completion> coalesced_;
  std::optional<c10::DeviceIndex> coalesced_device_;
  std::vector<at::Tensor> coalesced_outputs_;
};

}  // namespace phantom::distributed
