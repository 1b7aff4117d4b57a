// Graph capture and replay for phantom: torch's at::GraphImplInterface over
// the HAL's OPTIONAL "Graph capture and replay" section (Graph.cpp), and the
// graphs' private memory pools (GraphPool.cpp).
//
// While a stream captures, the device allocator serves allocations made
// for that stream from the capture's pool (graphPoolAllocate), as CUDA's
// caching allocator does: the captured work keeps reading and writing those
// addresses on every replay, so no other tensor may ever get them. A pool
// never reuses memory (each allocation is its own ph_malloc; captures are
// few and made once), and keeps it reserved until every graph using the
// pool is reset; memory a user still holds then (a graph's static output)
// is returned to the driver when its tensor dies.
#pragma once

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

#include <phantom/hal.h>

namespace phantom {

// True while some phantom stream captures (one relaxed load).
bool graphCaptureUnderway() noexcept;

// The capture's pool serves an allocation on (device, stream) when that
// stream captures; else returns a DataPtr with a null context and no
// deleter (the caller allocates as usual).
c10::DataPtr graphPoolAllocate(size_t nbytes, c10::DeviceIndex device,
                               c10::StreamId stream);

// Pool bookkeeping used by the graph implementation.
c10::MempoolId_t newGraphPoolId(bool user_created);
void graphPoolBeginCapture(c10::MempoolId_t pool, c10::DeviceIndex device,
                           c10::StreamId stream);
// Streams that join the capture `capture_id` (the driver's) allocate from
// the pool of the capture begun on (device, stream) too.
void graphPoolBindCaptureId(c10::DeviceIndex device, c10::StreamId stream,
                            uint64_t capture_id);
void graphPoolEndCapture(c10::DeviceIndex device, c10::StreamId stream);
// One graph stopped using the pool; the last one releases its free memory.
void graphPoolRelease(c10::MempoolId_t pool);
// Bytes the pool holds from the driver (0 for an unknown pool).
size_t graphPoolReservedBytes(c10::MempoolId_t pool);

// Whether `stream`'s driver stream is capturing (a driver without graphs:
// never).
bool isStreamCapturing(const c10::Stream& stream);

}  // namespace phantom
