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
#pragma once

#include "StagingJob.h"

#include <ATen/Tensor.h>

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

// "all_reduce of 1000 x float32 (sum)", "broadcast of 16 x int64 from rank 0".
std::string describeCall(const CallRecord& call);

// This rank's fingerprint of the job's collective calls (int64 CPU tensor).
at::Tensor collectiveFingerprint(const Job& job);

// Throws DisagreementError naming every rank's call if the gathered
// fingerprints (job.fingerprints, size x kFingerprintWords) differ.
void checkFingerprints(const Job& job, int size);

// The header a send carries to its receiver, and the receiver's check.
at::Tensor pointToPointHeader(const CallRecord& send);
void checkHeader(const CallRecord& recv, const at::Tensor& header);

}  // namespace phantom::gloo_staging
