// The collective-library seam: what NCCL is to CUDA and HCCL to Ascend.
//
// phantom's c10d backend ("pccl", device/distributed/ProcessGroupPhantom)
// does everything PyTorch expects of a process group — argument checks,
// ordering after the caller's stream, Work objects and futures, coalescing,
// error reporting — and moves data only through this interface. A vendor
// replaces the implementation behind it with their collective library and
// keeps the rest; phantom's own implementation stages the data through
// pinned host memory and moves it with Gloo (device/distributed/gloo).
//
// The contract is the one NCCL and HCCL have:
//
//  - Every call queues its collective on `stream` and returns at once. It
//    starts after the work already queued on `stream`, and after the work
//    queued on any stream the caller named with orderAfter() before the
//    call; work queued on `stream` later starts after it has finished.
//  - Buffers are dense device memory on `stream`'s device; `count` is in
//    elements of `dtype`. The host never dereferences them. send and recv
//    buffers may be the same memory (in-place).
//  - All ranks call the collectives of a communicator in the same order.
//    A peer ignores tags and matches point-to-point messages in order.
//  - Between groupStart() and groupEnd() calls are only collected; groupEnd()
//    queues them together, so that a group of sends and receives cannot
//    deadlock however the ranks order them (batch_isend_irecv). Groups nest;
//    only the outermost groupEnd() queues.
//  - Bad arguments throw at the call (c10::Error and friends). A failure
//    while the collective runs (a peer that died, timed out or disagreed, a
//    device error) becomes `stream`'s sticky error, with a sentence naming
//    the collective, its number in the communicator and, where known, the
//    peer at fault. After a failure the communicator is broken: it fails
//    every later collective and makes its peers fail promptly rather than
//    wait for their timeout (what ncclCommAbort does).
//  - Reductions accept the (dtype, op) pairs for which supportsReduction()
//    is true; the caller checks before calling. Everything else moves bytes
//    and accepts any dtype.
//
// Threading: calls come from one host thread at a time (the caller
// serialises them); the implementation may run its own threads.
#pragma once

#include <phantom/Stream.h>

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace phantom::ccl {

enum class ReduceOp : uint8_t {
  Sum,
  Avg,
  Product,
  Min,
  Max,
  BitwiseAnd,
  BitwiseOr,
  BitwiseXor,
};

const char* reduceOpName(ReduceOp op);

// `count` elements of `dtype`, contiguous, in device memory.
struct DeviceBuffer {
  void* data = nullptr;
  int64_t count = 0;
  c10::ScalarType dtype = c10::ScalarType::Byte;

  size_t bytes() const {
    return static_cast<size_t>(count) * c10::elementSize(dtype);
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Whether allReduce / reduce / reduceScatter take this pair.
  virtual bool supportsReduction(c10::ScalarType dtype, ReduceOp op) const = 0;

  // The next collective queued on `stream` starts after the work queued on
  // `waiting` so far (the caller's current stream). The default records an
  // event on `waiting` and makes `stream` wait for it, which is what a
  // library whose collectives run on the device needs (ProcessGroupNCCL
  // does it). A library that runs collectives on a host thread can wait
  // for the event there instead and keep `stream` free of the wait.
  virtual void orderAfter(const PhantomStream& waiting,
                          const PhantomStream& stream);

  // recv = op over every rank's send. send.count == recv.count.
  virtual void allReduce(const DeviceBuffer& send, const DeviceBuffer& recv,
                         ReduceOp op, const PhantomStream& stream) = 0;
  // Every rank's buffer becomes root's.
  virtual void broadcast(const DeviceBuffer& buffer, int root,
                         const PhantomStream& stream) = 0;
  // Root's recv = op over every rank's send; other ranks' recv untouched.
  virtual void reduce(const DeviceBuffer& send, const DeviceBuffer& recv,
                      ReduceOp op, int root, const PhantomStream& stream) = 0;
  // recv (size() * send.count elements) = every rank's send, in rank order.
  virtual void allGather(const DeviceBuffer& send, const DeviceBuffer& recv,
                         const PhantomStream& stream) = 0;
  // recv = block `rank()` of op over every rank's send (size() * recv.count).
  virtual void reduceScatter(const DeviceBuffer& send, const DeviceBuffer& recv,
                             ReduceOp op, const PhantomStream& stream) = 0;
  // Block p of send (sendCounts[p] elements, in order) goes to rank p; block
  // p of recv (recvCounts[p]) comes from rank p.
  virtual void allToAll(const DeviceBuffer& send,
                        const std::vector<int64_t>& sendCounts,
                        const DeviceBuffer& recv,
                        const std::vector<int64_t>& recvCounts,
                        const PhantomStream& stream) = 0;
  virtual void send(const DeviceBuffer& buffer, int peer,
                    const PhantomStream& stream) = 0;
  virtual void recv(const DeviceBuffer& buffer, int peer,
                    const PhantomStream& stream) = 0;

  virtual void groupStart() = 0;
  virtual void groupEnd() = 0;

  // A communicator over `ranks` (this communicator's numbers, sorted), or
  // nullptr if this rank is not among them: what ncclCommSplit gives, for
  // torch.distributed's split_group (a DeviceMesh over a group bound to a
  // device). Every member calls it with the same `ranks`; `store` is the
  // new group's, for any rendezvous it needs. A library that cannot split
  // throws.
  virtual std::unique_ptr<Communicator> split(
      const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& name) = 0;

  // Breaks the communicator on purpose (ProcessGroup abort/shutdown): later
  // collectives fail with `reason`. Safe from any thread.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace phantom::ccl
