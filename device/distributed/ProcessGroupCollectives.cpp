// The collectives of ProcessGroupPhantom (see
// phantom/distributed/ProcessGroupPhantom.h): each checks its arguments,
// fills a Call (ProcessGroupCall.h) with the library calls to make on the
// communication stream and the staging around them, and hands it to
// issue() (ProcessGroupPhantom.cpp).
#include <phantom/distributed/ProcessGroupPhantom.h>

#include "ProcessGroupCall.h"

#include <phantom/DeviceAllocator.h>
#include <phantom/Exception.h>
#include <phantom/Stream.h>

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <functional>
#include <numeric>
#include <string>

namespace phantom::distributed {

using ccl::DeviceBuffer;
using ccl::ReduceOp;

namespace {

void checkTensor(const at::Tensor& t, const char* op, const char* what) {
  TORCH_CHECK(t.defined(), "pccl ", op, ": ", what, " is an undefined tensor");
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "pccl ", op,
              ": ", what, " is on ", t.device(),
              "; pccl moves phantom tensors only. For CPU tensors give the "
              "group a CPU backend as well: "
              "init_process_group(backend=\"cpu:gloo,phantom:pccl\")");
  TORCH_CHECK(t.layout() == c10::kStrided, "pccl ", op, ": ", what, " is ",
              t.layout(), "; pccl moves dense tensors only");
  TORCH_CHECK(t.is_contiguous(t.suggest_memory_format()), "pccl ", op, ": ",
              what, " is not contiguous; call .contiguous() first");
}

void checkSameDevice(const at::Tensor& t, const at::Tensor& first,
                     const char* op) {
  TORCH_CHECK(t.device() == first.device(), "pccl ", op,
              ": all tensors must be on one device; got ", first.device(),
              " and ", t.device());
}

void checkLike(const at::Tensor& t, const at::Tensor& like, const char* op,
               const char* what) {
  checkTensor(t, op, what);
  checkSameDevice(t, like, op);
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "pccl ", op, ": ", what,
              " is ", t.scalar_type(), " but the input is ", like.scalar_type());
  TORCH_CHECK(t.numel() == like.numel(), "pccl ", op, ": ", what, " has ",
              t.numel(), " elements but the input has ", like.numel());
}

DeviceBuffer bufferOf(const at::Tensor& t) {
  return {t.data_ptr(), t.numel(), t.scalar_type()};
}

DeviceBuffer bufferAt(void* data, int64_t count, c10::ScalarType dtype) {
  return {data, count, dtype};
}

size_t bytesOf(const at::Tensor& t) {
  return t.numel() * t.element_size();
}

void copyOn(const PhantomStream& stream, void* dst, const void* src,
            size_t bytes) {
  if (bytes == 0) {
    return;
  }
  const ph_stream_t handle = stream.handle();
  stream.check(ph_memcpy_async(dst, src, bytes, PH_MEMCPY_DEVICE_TO_DEVICE, handle),
               handle);
}

void* at_offset(void* base, size_t bytes) {
  return static_cast<uint8_t*>(base) + bytes;
}

// True if the tensors are consecutive ranges of one buffer, as the outputs
// of all_gather_into_tensor's views or of a pre-split buffer are.
bool consecutive(const std::vector<at::Tensor>& tensors) {
  const auto* base = static_cast<const uint8_t*>(tensors[0].const_data_ptr());
  size_t offset = 0;
  for (const at::Tensor& t : tensors) {
    if (static_cast<const uint8_t*>(t.const_data_ptr()) != base + offset) {
      return false;
    }
    offset += bytesOf(t);
  }
  return true;
}

ReduceOp reduceOpOf(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return ReduceOp::Avg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::Product;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    case c10d::ReduceOp::BAND: return ReduceOp::BitwiseAnd;
    case c10d::ReduceOp::BOR: return ReduceOp::BitwiseOr;
    case c10d::ReduceOp::BXOR: return ReduceOp::BitwiseXor;
    default:
      break;
  }
  TORCH_CHECK(false, "pccl ", name, ": ReduceOp.PREMUL_SUM is not supported; "
              "scale the tensor and use ReduceOp.SUM (or AVG)");
}

void checkRank(int rank, int size, const char* op, const char* what) {
  TORCH_CHECK(rank >= 0 && rank < size, "pccl ", op, ": ", what, " ", rank,
              " is not a rank of this group (0..", size - 1, ")");
}

void checkReducible(const ccl::Communicator& communicator, c10::ScalarType dtype,
                    ReduceOp op, const char* name, const char* advice = "") {
  TORCH_CHECK(communicator.supportsReduction(dtype, op), "pccl ", name,
              ": cannot reduce ", dtype, " with ", ccl::reduceOpName(op), advice);
}

// An output and an input of one dtype on one device.
void checkPair(const at::Tensor& output, const at::Tensor& input,
               const char* name) {
  checkTensor(input, name, "the input");
  checkTensor(output, name, "the output");
  checkSameDevice(output, input, name);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "pccl ", name,
              ": the output is ", output.scalar_type(), " but the input is ",
              input.scalar_type());
}

// A flat collective's tensors: `big` holds `small`'s elements once per rank
// (all_gather_into_tensor's output, reduce_scatter_tensor's input).
void checkFlatPair(const at::Tensor& output, const at::Tensor& input,
                   bool output_is_big, int size, const char* name) {
  checkPair(output, input, name);
  const at::Tensor& big = output_is_big ? output : input;
  const at::Tensor& small = output_is_big ? input : output;
  TORCH_CHECK(big.numel() == small.numel() * size, "pccl ", name, ": ",
              output_is_big ? "the output" : "the input", " has ", big.numel(),
              " elements; it needs ", output_is_big ? "the input's " : "the output's ",
              small.numel(), " times the ", size, " ranks");
}

// The coalesced form of checkFlatPair, pair by pair; returns every tensor
// the collective uses.
std::vector<at::Tensor> checkCoalescedPairs(const std::vector<at::Tensor>& outputs,
                                            const std::vector<at::Tensor>& inputs,
                                            bool output_is_big, int size,
                                            const char* name) {
  TORCH_CHECK(!inputs.empty() && inputs.size() == outputs.size(), "pccl ", name,
              ": needs as many outputs as inputs (", outputs.size(), " and ",
              inputs.size(), ")");
  std::vector<at::Tensor> used;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], name, "an input");
    checkTensor(outputs[i], name, "an output");
    checkSameDevice(inputs[i], inputs[0], name);
    checkSameDevice(outputs[i], inputs[0], name);
    const at::Tensor& big = output_is_big ? outputs[i] : inputs[i];
    const at::Tensor& small = output_is_big ? inputs[i] : outputs[i];
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                    big.numel() == small.numel() * size,
                "pccl ", name, ": ", output_is_big ? "output " : "input ", i,
                " must be the ", output_is_big ? "input's" : "output's",
                " dtype and hold its elements times the number of ranks");
    used.push_back(inputs[i]);
    used.push_back(outputs[i]);
  }
  return used;
}

// A list of one tensor per rank, each like `like` ("the output list" of
// all_gather, "the input list" of reduce_scatter).
void checkRankList(const std::vector<at::Tensor>& list, const at::Tensor& like,
                   int size, const char* name, const char* list_name,
                   const char* each) {
  TORCH_CHECK(static_cast<int>(list.size()) == size, "pccl ", name, ": ",
              list_name, " has ", list.size(),
              " tensors; it needs one per rank (", size, ")");
  for (const at::Tensor& t : list) {
    checkLike(t, like, name, each);
  }
}

// gather's and scatter's list ("gather"/"scatter"): the root's has one
// tensor per rank, like `like`; the others give none. Returns the root's.
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists,
                                 const at::Tensor& like, bool is_root, int root,
                                 int size, const char* name) {
  if (!is_root) {
    TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()),
                "pccl ", name, ": only the root (rank ", root, ") takes a ",
                name, " list");
    return {};
  }
  TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size,
              "pccl ", name, ": the root needs a ", name, " list of one tensor "
              "per rank (", size, ")");
  const std::string each = std::string("a ") + name + " list tensor";
  for (const at::Tensor& t : lists[0]) {
    checkLike(t, like, name, each.c_str());
  }
  return lists[0];
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  constexpr const char* name = "all_reduce";
  TORCH_CHECK(tensors.size() == 1, "pccl ", name,
              " takes one tensor per process; got ", tensors.size());
  const at::Tensor& t = tensors[0];
  checkTensor(t, name, "the tensor");
  const ReduceOp op = reduceOpOf(opts.reduceOp, name);
  checkReducible(*communicator_, t.scalar_type(), op, name,
                 "; avg needs a floating-point dtype, the bitwise ops an integer "
                 "or bool one, and the dtypes reduced are float32, float64, "
                 "float16, bfloat16, int8, uint8, int32, int64 and bool");
  Call call{c10d::OpType::ALLREDUCE, name, {t}, {t}, t.device(),
            [&](const PhantomStream& comm) {
              communicator_->allReduce(bufferOf(t), bufferOf(t), op, comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::allreduce_sparse(
    std::vector<at::Tensor>&, const c10d::AllreduceOptions&) {
  TORCH_CHECK(false, "pccl all_reduce: sparse tensors are not supported; "
              "reduce their dense form (tensor.to_dense())");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  constexpr const char* name = "all_reduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "pccl ", name, ": no tensors");
  const ReduceOp op = reduceOpOf(opts.reduceOp, name);
  for (const at::Tensor& t : tensors) {
    checkTensor(t, name, "a tensor");
    checkSameDevice(t, tensors[0], name);
    checkReducible(*communicator_, t.scalar_type(), op, name);
  }
  Call call{c10d::OpType::ALLREDUCE_COALESCED, name, tensors, tensors,
            tensors[0].device(), [&](const PhantomStream& comm) {
              communicator_->groupStart();
              for (const at::Tensor& t : tensors) {
                communicator_->allReduce(bufferOf(t), bufferOf(t), op, comm);
              }
              communicator_->groupEnd();
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  constexpr const char* name = "broadcast";
  TORCH_CHECK(tensors.size() == 1, "pccl ", name,
              " takes one tensor per process; got ", tensors.size());
  const at::Tensor& t = tensors[0];
  checkTensor(t, name, "the tensor");
  const int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, name, "root");
  Call call{c10d::OpType::BROADCAST, name, {t}, {t}, t.device(),
            [&](const PhantomStream& comm) {
              communicator_->broadcast(bufferOf(t), root, comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  constexpr const char* name = "reduce";
  TORCH_CHECK(tensors.size() == 1, "pccl ", name,
              " takes one tensor per process; got ", tensors.size());
  const at::Tensor& t = tensors[0];
  checkTensor(t, name, "the tensor");
  const int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, name, "root");
  const ReduceOp op = reduceOpOf(opts.reduceOp, name);
  checkReducible(*communicator_, t.scalar_type(), op, name);
  Call call{c10d::OpType::REDUCE, name, {t}, {t}, t.device(),
            [&](const PhantomStream& comm) {
              communicator_->reduce(bufferOf(t), bufferOf(t), op, root, comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  constexpr const char* name = "all_gather_into_tensor";
  checkFlatPair(output, input, /*output_is_big=*/true, size_, name);
  Call call{c10d::OpType::_ALLGATHER_BASE, name, {input, output}, {output},
            input.device(), [&](const PhantomStream& comm) {
              communicator_->allGather(bufferOf(input), bufferOf(output), comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  constexpr const char* name = "all_gather";
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "pccl ", name,
              " takes one input and one output list per process");
  const at::Tensor& input = inputs[0];
  std::vector<at::Tensor>& outs = outputs[0];
  checkTensor(input, name, "the input");
  checkRankList(outs, input, size_, name, "the output list", "an output");
  std::vector<at::Tensor> used = outs;
  used.push_back(input);
  const int64_t total = input.numel() * size_;
  void* flat = nullptr;  // the gathered blocks, when the outputs are apart
  Call call{c10d::OpType::ALLGATHER, name, used, outs, input.device(),
            [&](const PhantomStream& comm) {
              flat = consecutive(outs) ? outs[0].data_ptr()
                                       : call.scratch(bytesOf(input) * size_);
              communicator_->allGather(
                  bufferOf(input), bufferAt(flat, total, input.scalar_type()), comm);
            }};
  if (!consecutive(outs)) {
    call.after = [&](const PhantomStream& comm) {
      for (int p = 0; p < size_; ++p) {
        copyOn(comm, outs[p].data_ptr(), at_offset(flat, p * bytesOf(input)),
               bytesOf(input));
      }
    };
  }
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  constexpr const char* name = "all_gather_into_tensor_coalesced";
  const std::vector<at::Tensor> used =
      checkCoalescedPairs(outputs, inputs, /*output_is_big=*/true, size_, name);
  Call call{c10d::OpType::COALESCED, name, used, outputs, inputs[0].device(),
            [&](const PhantomStream& comm) {
              communicator_->groupStart();
              for (size_t i = 0; i < inputs.size(); ++i) {
                communicator_->allGather(bufferOf(inputs[i]), bufferOf(outputs[i]), comm);
              }
              communicator_->groupEnd();
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  constexpr const char* name = "reduce_scatter_tensor";
  checkFlatPair(output, input, /*output_is_big=*/false, size_, name);
  const ReduceOp op = reduceOpOf(opts.reduceOp, name);
  checkReducible(*communicator_, input.scalar_type(), op, name);
  Call call{c10d::OpType::_REDUCE_SCATTER_BASE, name, {input, output}, {output},
            input.device(), [&](const PhantomStream& comm) {
              communicator_->reduceScatter(bufferOf(input), bufferOf(output), op, comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  constexpr const char* name = "reduce_scatter";
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "pccl ", name,
              " takes one output and one input list per process");
  const at::Tensor& output = outputs[0];
  std::vector<at::Tensor>& ins = inputs[0];
  checkTensor(output, name, "the output");
  checkRankList(ins, output, size_, name, "the input list", "an input");
  const ReduceOp op = reduceOpOf(opts.reduceOp, name);
  checkReducible(*communicator_, output.scalar_type(), op, name);
  std::vector<at::Tensor> used = ins;
  used.push_back(output);
  const int64_t total = output.numel() * size_;
  const size_t block = bytesOf(output);
  void* flat = consecutive(ins) ? ins[0].data_ptr() : nullptr;
  Call call{c10d::OpType::REDUCE_SCATTER, name, used, {output}, output.device(),
            [&](const PhantomStream& comm) {
              communicator_->reduceScatter(bufferAt(flat, total, output.scalar_type()),
                                           bufferOf(output), op, comm);
            }};
  if (flat == nullptr) {  // the blocks are apart: one flat input first
    call.before = [&](const PhantomStream& waiting) {
      flat = call.scratch(block * size_);
      for (int p = 0; p < size_; ++p) {
        copyOn(waiting, at_offset(flat, p * block), ins[p].const_data_ptr(), block);
      }
    };
  }
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  constexpr const char* name = "reduce_scatter_tensor_coalesced";
  const ReduceOp op = reduceOpOf(opts.reduceOp, name);
  const std::vector<at::Tensor> used =
      checkCoalescedPairs(outputs, inputs, /*output_is_big=*/false, size_, name);
  for (const at::Tensor& input : inputs) {
    checkReducible(*communicator_, input.scalar_type(), op, name);
  }
  Call call{c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, name, used, outputs,
            inputs[0].device(), [&](const PhantomStream& comm) {
              communicator_->groupStart();
              for (size_t i = 0; i < inputs.size(); ++i) {
                communicator_->reduceScatter(bufferOf(inputs[i]), bufferOf(outputs[i]),
                                             op, comm);
              }
              communicator_->groupEnd();
            }};
  return issue(call);
}

namespace {

// Element counts per rank of an all_to_all_single side: `splits` are rows
// (dim 0), empty meaning equal parts.
std::vector<int64_t> splitCounts(const at::Tensor& t,
                                 const std::vector<int64_t>& splits, int size,
                                 const char* what) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t per_row = rows == 0 ? 0 : t.numel() / rows;
  std::vector<int64_t> counts;
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "pccl all_to_all_single: the ", what,
                " has ", rows, " rows, which do not split evenly over ", size,
                " ranks; pass split sizes");
    counts.assign(size, rows / size * per_row);
    return counts;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == size,
              "pccl all_to_all_single: ", splits.size(), " ", what,
              " split sizes for ", size, " ranks");
  int64_t sum = 0;
  for (int64_t split : splits) {
    TORCH_CHECK(split >= 0, "pccl all_to_all_single: negative ", what, " split size");
    sum += split;
    counts.push_back(split * per_row);
  }
  TORCH_CHECK(sum == rows, "pccl all_to_all_single: the ", what,
              " split sizes add up to ", sum, " but the ", what, " has ",
              rows, " rows");
  return counts;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions&) {
  constexpr const char* name = "all_to_all_single";
  checkPair(output, input, name);
  const std::vector<int64_t> send_counts =
      splitCounts(input, input_split_sizes, size_, "input");
  const std::vector<int64_t> recv_counts =
      splitCounts(output, output_split_sizes, size_, "output");
  Call call{c10d::OpType::ALLTOALL_BASE, name, {input, output}, {output},
            input.device(), [&](const PhantomStream& comm) {
              communicator_->allToAll(bufferOf(input), send_counts,
                                      bufferOf(output), recv_counts, comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions&) {
  constexpr const char* name = "all_to_all";
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                  static_cast<int>(outputs.size()) == size_,
              "pccl ", name, ": needs one input and one output per rank (",
              size_, "); got ", inputs.size(), " and ", outputs.size());
  std::vector<int64_t> send_counts, recv_counts;
  for (int p = 0; p < size_; ++p) {
    checkTensor(inputs[p], name, "an input");
    checkTensor(outputs[p], name, "an output");
    checkSameDevice(inputs[p], inputs[0], name);
    checkSameDevice(outputs[p], inputs[0], name);
    TORCH_CHECK(inputs[p].scalar_type() == inputs[0].scalar_type() &&
                    outputs[p].scalar_type() == inputs[0].scalar_type(),
                "pccl ", name, ": all tensors must have one dtype");
    send_counts.push_back(inputs[p].numel());
    recv_counts.push_back(outputs[p].numel());
  }
  std::vector<at::Tensor> used = inputs;
  used.insert(used.end(), outputs.begin(), outputs.end());
  const c10::ScalarType dtype = inputs[0].scalar_type();
  const size_t es = c10::elementSize(dtype);
  const int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  void* in = nullptr;
  void* out = nullptr;
  Call call{c10d::OpType::ALLTOALL, name, used, outputs, inputs[0].device(),
            [&](const PhantomStream& comm) {
              communicator_->allToAll(bufferAt(in, sent, dtype), send_counts,
                                      bufferAt(out, received, dtype), recv_counts, comm);
            }};
  call.before = [&](const PhantomStream& waiting) {
    in = call.scratch(sent * es);
    out = call.scratch(received * es);
    size_t offset = 0;
    for (const at::Tensor& t : inputs) {
      copyOn(waiting, at_offset(in, offset), t.const_data_ptr(), bytesOf(t));
      offset += bytesOf(t);
    }
  };
  call.after = [&](const PhantomStream& comm) {
    size_t offset = 0;
    for (const at::Tensor& t : outputs) {
      copyOn(comm, t.data_ptr(), at_offset(out, offset), bytesOf(t));
      offset += bytesOf(t);
    }
  };
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  constexpr const char* name = "gather";
  TORCH_CHECK(inputs.size() == 1, "pccl ", name, " takes one input per process");
  const at::Tensor& input = inputs[0];
  checkTensor(input, name, "the input");
  const int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, name, "root");
  const bool is_root = root == rank_;
  const std::vector<at::Tensor> outs =
      rootList(outputs, input, is_root, root, size_, name);
  std::vector<at::Tensor> used = outs;
  used.push_back(input);
  Call call{c10d::OpType::GATHER, name, used, outs, input.device(),
            [&](const PhantomStream& comm) {
              communicator_->groupStart();
              if (is_root) {
                for (int p = 0; p < size_; ++p) {
                  if (p != rank_) {
                    communicator_->recv(bufferOf(outs[p]), p, comm);
                  }
                }
              } else {
                communicator_->send(bufferOf(input), root, comm);
              }
              communicator_->groupEnd();
            }};
  if (is_root) {  // the root's own block, in the caller's stream order
    call.before = [&](const PhantomStream& waiting) {
      copyOn(waiting, outs[rank_].data_ptr(), input.const_data_ptr(), bytesOf(input));
    };
  }
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts) {
  constexpr const char* name = "scatter";
  TORCH_CHECK(outputs.size() == 1, "pccl ", name, " takes one output per process");
  const at::Tensor& output = outputs[0];
  checkTensor(output, name, "the output");
  const int root = static_cast<int>(opts.rootRank);
  checkRank(root, size_, name, "root");
  const bool is_root = root == rank_;
  const std::vector<at::Tensor> ins =
      rootList(inputs, output, is_root, root, size_, name);
  std::vector<at::Tensor> used = ins;
  used.push_back(output);
  Call call{c10d::OpType::SCATTER, name, used, {output}, output.device(),
            [&](const PhantomStream& comm) {
              communicator_->groupStart();
              if (is_root) {
                for (int p = 0; p < size_; ++p) {
                  if (p != rank_) {
                    communicator_->send(bufferOf(ins[p]), p, comm);
                  }
                }
              } else {
                communicator_->recv(bufferOf(output), root, comm);
              }
              communicator_->groupEnd();
            }};
  if (is_root) {  // the root's own block, in the caller's stream order
    call.before = [&](const PhantomStream& waiting) {
      copyOn(waiting, output.data_ptr(), ins[rank_].const_data_ptr(), bytesOf(output));
    };
  }
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::send(
    std::vector<at::Tensor>& tensors, int dst_rank, int /*tag*/) {
  constexpr const char* name = "send";
  TORCH_CHECK(tensors.size() == 1, "pccl ", name, " takes one tensor");
  const at::Tensor& t = tensors[0];
  checkTensor(t, name, "the tensor");
  checkRank(dst_rank, size_, name, "destination");
  TORCH_CHECK(dst_rank != rank_, "pccl send: a rank cannot send to itself");
  Call call{c10d::OpType::SEND, name, {t}, {}, t.device(),
            [&](const PhantomStream& comm) {
              communicator_->send(bufferOf(t), dst_rank, comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::recv(
    std::vector<at::Tensor>& tensors, int src_rank, int /*tag*/) {
  constexpr const char* name = "recv";
  TORCH_CHECK(tensors.size() == 1, "pccl ", name, " takes one tensor");
  const at::Tensor& t = tensors[0];
  checkTensor(t, name, "the tensor");
  checkRank(src_rank, size_, name, "source");
  TORCH_CHECK(src_rank != rank_, "pccl recv: a rank cannot receive from itself");
  Call call{c10d::OpType::RECV, name, {t}, {t}, t.device(),
            [&](const PhantomStream& comm) {
              communicator_->recv(bufferOf(t), src_rank, comm);
            }};
  return issue(call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::recvAnysource(
    std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false, "pccl recv: receiving from any source is not supported "
              "(as with NCCL); pass the source rank (src=)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPhantom::barrier(
    const c10d::BarrierOptions& opts) {
  c10::Device device(c10::DeviceType::PrivateUse1, getCurrentPhantomStream().device_index());
  if (opts.device && opts.device->type() == c10::DeviceType::PrivateUse1 &&
      opts.device->has_index()) {
    device = *opts.device;
  } else if (bound_device_id_) {
    device = *bound_device_id_;
  }
  Call call{c10d::OpType::BARRIER, "barrier", {}, {}, device,
            [&](const PhantomStream& comm) {
              void* token = call.scratch(1);
              communicator_->allReduce(bufferAt(token, 1, c10::kByte),
                                       bufferAt(token, 1, c10::kByte),
                                       ReduceOp::Max, comm);
            },
            /*host_blocking_wait=*/true};
  return issue(call);
}

}  // namespace phantom::distributed
