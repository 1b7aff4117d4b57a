// Checking that the ranks agree on a collective before any data moves.
//
// Gloo aborts the whole process (std::terminate from its network thread)
// when a peer sends more bytes than a receive expects, which is what a rank
// calling all_reduce on 2000 elements while another passes 1000 produces.
// So before a job's data moves, every rank publishes a fingerprint of its
// calls (op, dtype, element count, reduce op, root, and the collective's
// number), gathered over the control backend; a receive also gets a header
// from its sender. A difference is an error on every rank, naming each
// rank's call, and no data is exchanged.
//
// The fingerprint travels in a slot of fixed size, kSlotBytes, whatever the
// call: the first kFingerprintWords words, then kSmallJobBytes of payload.
// Fixed, because the ranks cannot yet know that they agree on anything
// else. A small job (StagingJob.h) puts its whole input in the payload, and
// its agreement message is then also its data exchange: each rank finishes
// the collective from the gathered slots by itself, so a small all_reduce
// costs one Gloo exchange instead of two, one after the other.
#pragma once

#include "StagingJob.h"

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace phantom::gloo_staging {

// Thrown when the ranks disagree: every rank sees the same gathered
// fingerprints, so every rank raises it, and no data has moved.
struct DisagreementError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int64_t kFingerprintWords = 8;
constexpr int64_t kHeaderWords = 4;
// A job moving at most this much host memory is small (carried in its
// slot): the 5 KB of gradients of a small model's one DDP bucket, a
// logged loss, a barrier.
constexpr size_t kSmallJobBytes = size_t{8} << 10;
constexpr size_t kFingerprintBytes = kFingerprintWords * sizeof(int64_t);
constexpr size_t kSlotBytes = kFingerprintBytes + kSmallJobBytes;

// "all_reduce of 1000 x float32 (sum)", "broadcast of 16 x int64 from rank 0".
std::string describeCall(const CallRecord& call);

// This rank's slot for the job (a uint8 CPU tensor of kSlotBytes): the
// fingerprint of its collective calls, then a zeroed payload.
at::Tensor agreementSlot(const Job& job);

// The payload of a slot: this rank's own (`slot`), or rank r's among the
// gathered slots (`gathered`, size x kSlotBytes).
uint8_t* slotPayload(const at::Tensor& slot);
const uint8_t* gatheredPayload(const at::Tensor& gathered, int rank);

// Throws DisagreementError naming every rank's call if the fingerprints in
// the gathered slots (job.slots) differ.
void checkFingerprints(const Job& job, int size);

// The header a send carries to its receiver, and the receiver's check.
at::Tensor pointToPointHeader(const CallRecord& send);
void checkHeader(const CallRecord& recv, const at::Tensor& header);

}  // namespace phantom::gloo_staging
