// Private memory pools: memory set apart from the caching allocator's
// shared pools for one owner, as CUDA's allocator keeps them for graphs
// and for torch.cuda.MemPool (PrivatePool.cpp).
//
// Two owners route allocations into a pool:
//  - a graph capture: while a stream captures, allocations made for that
//    stream (and for streams that joined the capture) come from the
//    graph's pool. The captured work keeps reading and writing those
//    addresses on every replay, so no tensor outside the pool may ever get
//    them;
//  - torch.phantom.use_mem_pool(pool): allocations the calling thread makes
//    on the pool's device come from a torch.phantom.MemPool.
// A pool keeps memory a dead tensor gave back and hands it out again to a
// later allocation routed into the same pool on the same stream, when it
// fits (at most twice the request): work captured later, or replayed
// later, is ordered after the work that used it on that stream. Memory a
// tensor marked with record_stream gave back is never handed out again
// (another stream may still use it). A pool holds its memory from the
// driver until its last user goes (every graph captured into it reset,
// and the MemPool object, if any, deleted); memory a tensor still holds
// then goes back to the driver when the tensor dies.
//
// Pools count in memory_stats as CUDA's do (their memory is reserved, and
// allocated while a tensor holds it) and appear in memory_snapshot as
// segments owned by the pool's id.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <vector>

namespace phantom {

// True while some allocation may be routed into a private pool: a stream
// captures, or a thread is inside use_mem_pool (one relaxed load).
bool privatePoolRoutingActive() noexcept;

// Serves an allocation on (device, stream) from the private pool it is
// routed to, if any; else returns a DataPtr with a null context and no
// deleter (the caller allocates as usual). Raises c10::OutOfMemoryError
// when the driver has no room.
c10::DataPtr privatePoolAllocate(size_t nbytes, c10::DeviceIndex device,
                                 c10::StreamId stream);

// Marks memory served by a private pool as used on another stream: it is
// not handed out again once freed. False if `ptr` is not pool memory.
bool privatePoolRecordStream(const c10::DataPtr& ptr);

// A new pool id. CUDA's convention: {n, 0} for one a user asked for
// (graph_pool_handle, MemPool), {0, n} for a graph's own.
c10::MempoolId_t newPrivatePoolId(bool user_created);

// Graph captures (Graph.cpp). Begin adds a user to the pool (creating it).
void graphPoolBeginCapture(c10::MempoolId_t pool, c10::DeviceIndex device,
                           c10::StreamId stream);
// Streams that join the capture `capture_id` (the driver's) allocate from
// the pool of the capture begun on (device, stream) too.
void graphPoolBindCaptureId(c10::DeviceIndex device, c10::StreamId stream,
                            uint64_t capture_id);
void graphPoolEndCapture(c10::DeviceIndex device, c10::StreamId stream);

// One user of the pool went away; the last one releases its free memory.
void privatePoolRelease(c10::MempoolId_t pool);

// torch.phantom.MemPool: a pool with the MemPool object as its first user.
c10::MempoolId_t memPoolCreate();
// use_mem_pool: the calling thread's allocations on `device` come from
// `pool` until the matching end. Contexts nest. Begin raises
// c10::ValueError for a pool that does not exist (deleted, or an id no
// pool was made for); end raises if `pool` is not the innermost one.
void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool);
void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool);

// Users of the pool (graphs captured into it and not reset, plus the
// MemPool object); 0 for an unknown pool.
int privatePoolUseCount(c10::MempoolId_t pool);
// Bytes the pool holds from the driver (0 for an unknown pool).
size_t privatePoolReservedBytes(c10::MempoolId_t pool);
// Every pool's memory as snapshot segments (one per driver allocation).
void privatePoolSnapshot(std::vector<c10::CachingDeviceAllocator::SegmentInfo>& out);

}  // namespace phantom
