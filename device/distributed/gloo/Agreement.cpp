// See Agreement.h.
#include "Agreement.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <sstream>

namespace phantom::gloo_staging {
namespace {

constexpr int64_t kFingerprintMagic = 0x70636331;  // "pcc1"
constexpr int64_t kHeaderMagic = 0x70637031;       // "pcp1"

// Field 6 of a fingerprint: the reduce op and the root, packed.
int64_t packOpAndRoot(const CallRecord& call) {
  return static_cast<int64_t>(call.op) |
         (static_cast<int64_t>(call.root + 1) << 8);
}

int64_t mix(int64_t hash, int64_t value) {
  // FNV-1a over the value's bytes: order-sensitive, cheap, good enough to
  // tell two call lists apart (the first call is also compared exactly).
  uint64_t h = static_cast<uint64_t>(hash);
  for (int i = 0; i < 8; ++i) {
    h ^= (static_cast<uint64_t>(value) >> (8 * i)) & 0xff;
    h *= 0x100000001b3ULL;
  }
  return static_cast<int64_t>(h);
}

bool isReduction(Kind kind) {
  return kind == Kind::AllReduce || kind == Kind::Reduce ||
         kind == Kind::ReduceScatter;
}

std::string describeWords(const int64_t* words) {
  if (words[0] != kFingerprintMagic) {
    return "something that is not a pccl collective";
  }
  CallRecord first{static_cast<Kind>(words[3]),
                   static_cast<c10::ScalarType>(words[4]), words[5],
                   static_cast<ccl::ReduceOp>(words[6] & 0xff),
                   static_cast<int>((words[6] >> 8) - 1)};
  std::ostringstream out;
  out << describeCall(first) << " as collective #" << words[1];
  if (words[2] > 1) {
    out << " (with " << (words[2] - 1) << " more in its group)";
  }
  return out.str();
}

}  // namespace

std::string describeCall(const CallRecord& call) {
  std::ostringstream out;
  out << kindName(call.kind) << " of " << call.count << " x "
      << c10::toString(call.dtype);
  if (isReduction(call.kind)) {
    out << " (" << ccl::reduceOpName(call.op) << ")";
  }
  if (call.kind == Kind::Broadcast || call.kind == Kind::Reduce) {
    out << " rooted at rank " << call.root;
  } else if (call.kind == Kind::Send) {
    out << " to rank " << call.root;
  } else if (call.kind == Kind::Recv) {
    out << " from rank " << call.root;
  }
  return out.str();
}

at::Tensor agreementSlot(const Job& job) {
  at::Tensor slot = at::empty({static_cast<int64_t>(kSlotBytes)}, at::kByte);
  std::memset(slot.data_ptr(), 0, kSlotBytes);
  auto* w = static_cast<int64_t*>(slot.data_ptr());
  w[0] = kFingerprintMagic;
  w[1] = static_cast<int64_t>(job.collective);
  int64_t hash = static_cast<int64_t>(0xcbf29ce484222325ULL);
  int64_t calls = 0;
  for (const CallRecord& call : job.calls) {
    if (isPointToPoint(call.kind)) {
      continue;
    }
    if (calls == 0) {
      w[3] = static_cast<int64_t>(call.kind);
      w[4] = static_cast<int64_t>(call.dtype);
      w[5] = call.count;
      w[6] = packOpAndRoot(call);
    }
    ++calls;
    hash = mix(hash, static_cast<int64_t>(call.kind));
    hash = mix(hash, static_cast<int64_t>(call.dtype));
    hash = mix(hash, call.count);
    hash = mix(hash, packOpAndRoot(call));
  }
  w[2] = calls;
  w[7] = hash;
  return slot;
}

uint8_t* slotPayload(const at::Tensor& slot) {
  return static_cast<uint8_t*>(slot.data_ptr()) + kFingerprintBytes;
}

const uint8_t* gatheredPayload(const at::Tensor& gathered, int rank) {
  return static_cast<const uint8_t*>(gathered.const_data_ptr()) +
         rank * kSlotBytes + kFingerprintBytes;
}

void checkFingerprints(const Job& job, int size) {
  const auto* base = static_cast<const uint8_t*>(job.slots.const_data_ptr());
  const auto words = [&](int r) {
    return reinterpret_cast<const int64_t*>(base + r * kSlotBytes);
  };
  bool agree = true;
  for (int r = 1; r < size && agree; ++r) {
    agree = std::memcmp(words(0), words(r), kFingerprintBytes) == 0;
  }
  if (agree) {
    return;
  }
  std::ostringstream out;
  out << "the ranks disagree on this collective, so no data was exchanged:";
  for (int r = 0; r < size; ++r) {
    out << (r == 0 ? " " : "; ") << "rank " << r << " called "
        << describeWords(words(r));
  }
  out << ". Every rank must make the same collective calls, in the same "
         "order, with the same element count and dtype";
  throw DisagreementError(out.str());
}

at::Tensor pointToPointHeader(const CallRecord& send) {
  at::Tensor words = at::empty({kHeaderWords}, at::kLong);
  int64_t* w = words.data_ptr<int64_t>();
  w[0] = kHeaderMagic;
  w[1] = static_cast<int64_t>(send.kind);
  w[2] = static_cast<int64_t>(send.dtype);
  w[3] = send.count;
  return words;
}

void checkHeader(const CallRecord& recv, const at::Tensor& header) {
  const int64_t* w = header.const_data_ptr<int64_t>();
  if (w[0] == kHeaderMagic && w[2] == static_cast<int64_t>(recv.dtype) &&
      w[3] == recv.count) {
    return;
  }
  std::ostringstream out;
  out << describeCall(recv) << " does not match what rank " << recv.root
      << " sent: ";
  if (w[0] != kHeaderMagic) {
    out << "something that is not a pccl send";
  } else {
    out << w[3] << " x " << c10::toString(static_cast<c10::ScalarType>(w[2]));
  }
  out << "; a recv must have the element count and dtype of its send, so no "
         "data was exchanged";
  throw DisagreementError(out.str());
}

}  // namespace phantom::gloo_staging
