// Resizing phantom storages (tensor.resize_, storage.resize_).
#pragma once

#include <c10/core/StorageImpl.h>

namespace phantom {

// Gives `storage` a new device buffer of `nbytes`, keeping the first
// min(old, new) bytes. The copy is ordered on the current stream; the old
// buffer is freed safely by the allocator.
void resizeStorageBytes(c10::StorageImpl* storage, size_t nbytes);

}  // namespace phantom
