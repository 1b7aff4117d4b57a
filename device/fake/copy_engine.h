// The copy engine: validates a copy request and turns it into a plan of two
// host-addressable ranges.
//
// Every device side is checked to be device memory inside one live
// allocation and translated to its kernel view; every host side is checked
// not to be device memory, and if it is pinned, to stay inside its pinned
// block, and translated to the block's alias (host_memory.h), so that
// protecting the user's mapping of a pinned block does not stop a copy. The plan records whether a host side is pageable, which decides
// whether ph_memcpy_async may return before the copy ran (pinned / D2D) or
// must wait for it (pageable). Executing a plan moves the bytes between the
// two views (ChannelCopy, copy_channels.h: large copies over two threads),
// on the calling thread (ph_memcpy, and a pageable ph_memcpy_async on an
// idle stream) or on a stream's worker.
#ifndef PHANTOM_FAKE_COPY_ENGINE_H_
#define PHANTOM_FAKE_COPY_ENGINE_H_

#include <cstddef>

#include "phantom/hal.h"

namespace phantom::fake {

struct CopyPlan {
  void* dst = nullptr;        // host-addressable destination
  const void* src = nullptr;  // host-addressable source
  size_t size = 0;
  bool pageable_host = false;  // a host side is ordinary (pageable) memory
};

// Validates a copy of `size` (> 0) bytes; on failure sets the message
// (prefixed with `function`) and returns PH_ERROR_INVALID_ARGUMENT.
ph_status_t PlanCopy(const char* function, void* dst, const void* src,
                     size_t size, ph_memcpy_kind_t kind, CopyPlan* out_plan);

// Validates a fill of `size` (> 0) bytes of device memory at `dst` and
// returns its kernel-view address in *out_view.
ph_status_t PlanFill(const char* function, void* dst, size_t size,
                     void** out_view);

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_COPY_ENGINE_H_
