// phantom's implementation of the collective-library seam
// (phantom/ccl/Communicator.h): device data moved by Gloo, over TCP, so it
// runs across machines as it runs across processes. When the driver has a
// kernel view (ph_kernel_address), Gloo works on the device memory in
// place (zero-copy); otherwise the data is staged through pinned host
// memory (StagingJob.h).
//
// Gloo comes in as two CPU c10d backends (torch's ProcessGroupGloo, built by
// the Python side because the wheel ships no Gloo headers): `data` moves
// the staged bytes, `control` carries a small agreement message per
// collective (every rank's op, dtype and element count), checked before any
// data moves. Gloo itself aborts the process when ranks disagree on a
// message's size; the check turns that into an error naming each rank's
// call. The two backends are separate because the agreement message is sent
// by the calling thread, in call order, while the data is sent later by the
// communicator's own thread. A collective of at most 8 KiB sends its data
// in its agreement message and makes no call on `data`.
#pragma once

#include <phantom/ccl/Communicator.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace phantom::gloo_staging {

// Makes the two CPU backends of a group over `store` (the Python side:
// torch.distributed.ProcessGroupGloo): at creation and for each split.
using MakeCpuBackends = std::function<
    std::pair<c10::intrusive_ptr<c10d::Backend>, c10::intrusive_ptr<c10d::Backend>>(
        const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
        std::chrono::milliseconds timeout)>;

struct GlooStagingConfig {
  MakeCpuBackends make_backends;
  c10::intrusive_ptr<c10d::Backend> data;     // CPU backend for the data
  c10::intrusive_ptr<c10d::Backend> control;  // CPU backend for agreement
  // The group's store: each rank records its process and its progress
  // there, so that a failure can name the peer at fault.
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  std::string group_name;
};

std::unique_ptr<ccl::Communicator> makeGlooStagingCommunicator(
    GlooStagingConfig config);

// How many jobs (a collective, a send or receive, or a group of calls) this
// process's communicators ran zero-copy, over the device memory's kernel
// view, how many staged through pinned memory, and how many were small
// enough to travel in their agreement message: which data path ran.
struct DataPathCounts {
  uint64_t zero_copy = 0;
  uint64_t staged = 0;
  uint64_t small = 0;
};
DataPathCounts dataPathCounts();

}  // namespace phantom::gloo_staging
