// Graph capture and replay for phantom: torch's at::GraphImplInterface over
// the HAL's OPTIONAL "Graph capture and replay" section (Graph.cpp). While
// a stream captures, its allocations come from the graph's private memory
// pool (phantom/PrivatePool.h).
#pragma once

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

#include <phantom/PrivatePool.h>
#include <phantom/hal.h>

namespace phantom {

// Whether `stream`'s driver stream is capturing (a driver without graphs:
// never).
bool isStreamCapturing(const c10::Stream& stream);

}  // namespace phantom
