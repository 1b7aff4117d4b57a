// Pinned (page-locked) host memory for tensor.pin_memory().
//
// Pinned memory is what the copy engine can read and write after the host
// has moved on, so it is what makes non_blocking copies truly asynchronous.
// Each allocation is a driver allocation (ph_host_malloc); caching pinned
// blocks is the streams-and-memory issue's work.
#pragma once

#include <c10/core/Allocator.h>

namespace phantom {

c10::Allocator* pinnedHostAllocator();

// True if `ptr` points into pinned memory from the driver.
bool isPinnedPointer(const void* ptr);

}  // namespace phantom
