// One collective being issued by ProcessGroupPhantom: the record its
// collectives (ProcessGroupCollectives.cpp) fill and issue()
// (ProcessGroupPhantom.cpp) runs. Private to device/distributed.
#ifndef PHANTOM_DISTRIBUTED_PROCESS_GROUP_CALL_H_
#define PHANTOM_DISTRIBUTED_PROCESS_GROUP_CALL_H_

#include <phantom/DeviceAllocator.h>
#include <phantom/Stream.h>
#include <phantom/distributed/ProcessGroupPhantom.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

namespace phantom::distributed {

// One collective being issued, in three phases (issue()): `before` runs
// with the caller's stream current, ahead of the point the collective is
// ordered after (input staging of list forms, a gather's own block);
// `body` makes the library calls; `after` queues work on the communication
// stream behind the collective (output staging). Device scratch comes from
// scratch(): allocated on the caller's stream, kept for the communication
// stream, so it is reused only once the collective is over.
struct ProcessGroupPhantom::Call {
  c10d::OpType type;
  const char* name;                  // "all_reduce", as torch.distributed names it
  std::vector<at::Tensor> used;      // kept alive for the communication stream
  std::vector<at::Tensor> outputs;   // the Work's result
  std::optional<c10::Device> device;
  std::function<void(const PhantomStream& comm)> body;
  bool host_blocking_wait = false;
  std::function<void(const PhantomStream& waiting)> before = nullptr;
  std::function<void(const PhantomStream& comm)> after = nullptr;
  std::vector<c10::DataPtr> scratch_buffers = {};

  void* scratch(size_t bytes) {
    scratch_buffers.push_back(deviceAllocator().allocate(std::max<size_t>(bytes, 1)));
    return scratch_buffers.back().get();
  }
};

}  // namespace phantom::distributed

#endif  // PHANTOM_DISTRIBUTED_PROCESS_GROUP_CALL_H_
