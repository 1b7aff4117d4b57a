// Finding the places where the host waits for the device
// (torch.phantom.set_sync_debug_mode, as torch.cuda.set_sync_debug_mode).
//
// Fast accelerator code keeps the host ahead of the device; every hidden
// wait (an .item() in a loop, a .cpu() for a log line, an op whose output
// size depends on the data) stalls the queue. With the mode at kWarn each
// such wait warns, naming the operation; at kError it raises instead,
// before waiting: nothing is queued and nothing changes. The check sits
// at every point where phantom makes the host wait on an op's behalf:
//   - before every launchAndWait (Launch.h): a generic-path op's
//     synchronous half (nonzero, unique, masked_select, an op returning a
//     Python value, and the ops phantom cannot queue yet, each with the
//     reason ops_report() gives), and the kernels phantom computes on the
//     host and waits for (convolution, the fused RNN cells), which a
//     device kernel would not wait for: the message says so;
//   - copies: device to pageable host memory (.cpu(), .tolist(),
//     .numpy()), .item() and every read of one value (if tensor:, int(t)),
//     host to device from pageable memory (the copy must read the source
//     before returning), a blocking copy to or from pinned memory, and a
//     copy between two phantom devices.
// Waiting that the program asks for in so many words (torch.phantom
// .synchronize(), Stream.synchronize(), Event.synchronize()) is not
// reported, and neither is the caching allocator's wait before it gives
// memory back to the driver, as on CUDA.
//
// Off (the default), a check is one relaxed atomic load.
#pragma once

#include <c10/macros/Macros.h>

#include <atomic>

namespace phantom {

enum class SyncDebugMode : int { kDefault = 0, kWarn = 1, kError = 2 };

// Throws c10::ValueError for a value outside the enum.
void setSyncDebugMode(SyncDebugMode mode);
SyncDebugMode syncDebugMode() noexcept;

namespace detail {
extern std::atomic<int> sync_debug_mode;
// Warns or raises for a wait caused by `what`, as the mode says.
void reportHostWait(const char* what, const char* why);
}  // namespace detail

// Call before making the host wait for the device on behalf of `what`
// (naming the op, e.g. "aten::nonzero"), with `why` it waits when that is
// not plain from the op (may be null).
inline void noteHostWait(const char* what, const char* why = nullptr) {
  if (C10_UNLIKELY(detail::sync_debug_mode.load(std::memory_order_relaxed) !=
                   0)) {
    detail::reportHostWait(what, why);
  }
}

}  // namespace phantom
