// Private memory pools (graphs' and MemPool's); see phantom/PrivatePool.h.
//
// Each piece of pool memory is its own driver allocation (a PoolBlock), so
// a block is a segment of one block in the snapshot. A pool's free blocks
// sit in a size-ordered map; a request takes the smallest free block of
// its stream that is big enough and at most twice the request.
#include <phantom/DeviceAllocator.h>
#include <phantom/Exception.h>
#include <phantom/GpuTrace.h>
#include <phantom/PrivatePool.h>
#include <phantom/Stream.h>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace phantom {
namespace {

struct PrivatePool;

struct PoolBlock {
  void* ptr = nullptr;
  size_t size = 0;
  size_t requested = 0;       // of the allocation holding it (0 when free)
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;
  bool allocated = true;
  bool used_on_other_streams = false;  // record_stream: never handed out again
  std::shared_ptr<PrivatePool> pool;
};

struct PrivatePool {
  c10::MempoolId_t id{0, 0};
  int users = 0;          // graphs captured into it not yet reset, MemPool
  size_t reserved = 0;    // bytes held from the driver
  std::unordered_set<PoolBlock*> blocks;        // every block it holds
  std::multimap<size_t, PoolBlock*> free_blocks;  // by size, reusable
};

std::mutex g_mutex;  // guards what follows and every pool's fields
std::map<c10::MempoolId_t, std::shared_ptr<PrivatePool>> g_pools;
std::map<std::pair<c10::DeviceIndex, c10::StreamId>, std::shared_ptr<PrivatePool>>
    g_capturing;
// The same pools by the driver's capture id, for streams that joined a
// capture (fork/join): their allocations belong to the graph too.
std::map<uint64_t, std::shared_ptr<PrivatePool>> g_by_capture_id;
// Captures underway plus threads inside use_mem_pool.
std::atomic<int> g_routing_count{0};
std::atomic<c10::CaptureId_t> g_next_id{1};
// Pools whose users are gone but whose memory tensors still hold (a
// graph's static output), for the snapshot.
std::vector<std::weak_ptr<PrivatePool>> g_released;

// The calling thread's use_mem_pool contexts, innermost last.
thread_local std::vector<std::pair<c10::DeviceIndex, std::shared_ptr<PrivatePool>>>
    t_allocate_to;

void account(const PoolBlock& block, PrivatePoolChange change) noexcept {
  try {
    deviceAllocator().accountPrivatePool(block.device, change, block.size,
                                         block.requested);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phantom: private pool statistics: %s\n", e.what());
  }
}

void freeToDriver(PoolBlock* block) noexcept {
  account(*block, PrivatePoolChange::kSegmentFreed);
  if (ph_free(block->ptr) != PH_SUCCESS) {
    std::fprintf(stderr,
                 "phantom: returning private pool memory %p failed (kept): %s\n",
                 block->ptr, ph_last_error_message());
  }
  delete block;
}

// Takes every free block out of `pool` (its last user went away).
std::vector<PoolBlock*> takeFreeBlocks(PrivatePool& pool) {
  std::vector<PoolBlock*> out;
  for (auto& [size, block] : pool.free_blocks) out.push_back(block);
  pool.free_blocks.clear();
  for (PoolBlock* block : pool.blocks) {
    if (!block->allocated && block->used_on_other_streams) out.push_back(block);
  }
  for (PoolBlock* block : out) {
    pool.blocks.erase(block);
    pool.reserved -= block->size;
  }
  return out;
}

void deletePoolBlock(void* context) {
  auto* block = static_cast<PoolBlock*>(context);
  gpu_trace::memoryFreed(block->ptr);
  account(*block, PrivatePoolChange::kBlockFreed);
  std::unique_lock<std::mutex> lock(g_mutex);
  block->allocated = false;
  block->requested = 0;
  PrivatePool& pool = *block->pool;
  if (pool.users > 0) {  // kept for the pool's later allocations
    if (!block->used_on_other_streams) pool.free_blocks.emplace(block->size, block);
    return;
  }
  pool.blocks.erase(block);
  pool.reserved -= block->size;
  lock.unlock();
  freeToDriver(block);
}

// The pool an allocation on (device, stream) is routed to, or null.
std::shared_ptr<PrivatePool> routedPool(c10::DeviceIndex device,
                                        c10::StreamId stream) {
  for (auto it = t_allocate_to.rbegin(); it != t_allocate_to.rend(); ++it) {
    if (it->first == device) return it->second;
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_capturing.empty()) return nullptr;
    auto it = g_capturing.find({device, stream});
    if (it != g_capturing.end()) return it->second;
    if (g_by_capture_id.empty()) return nullptr;
  }
  // A stream that joined a capture by waiting on one of its events.
  const ph_stream_t handle = PhantomStream(c10::Stream(
      c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
      stream)).handle();
  ph_capture_status_t status = PH_CAPTURE_STATUS_NONE;
  uint64_t capture_id = 0;
  if (ph_stream_get_capture_info(handle, &status, &capture_id) != PH_SUCCESS ||
      status == PH_CAPTURE_STATUS_NONE) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_by_capture_id.find(capture_id);
  return it == g_by_capture_id.end() ? nullptr : it->second;
}

std::string poolName(c10::MempoolId_t id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

}  // namespace

bool privatePoolRoutingActive() noexcept {
  return g_routing_count.load(std::memory_order_relaxed) != 0;
}

c10::DataPtr privatePoolAllocate(size_t nbytes, c10::DeviceIndex device,
                                 c10::StreamId stream) {
  std::shared_ptr<PrivatePool> pool = routedPool(device, stream);
  if (!pool) return {};
  const size_t size = (nbytes + 511) / 512 * 512;
  const c10::Device where(c10::DeviceType::PrivateUse1, device);
  PoolBlock* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto it = pool->free_blocks.lower_bound(size);
         it != pool->free_blocks.end() && it->first <= 2 * size; ++it) {
      PoolBlock* candidate = it->second;
      if (candidate->device == device && candidate->stream == stream) {
        pool->free_blocks.erase(it);
        block = candidate;
        block->allocated = true;
        block->requested = nbytes;
        break;
      }
    }
  }
  if (block == nullptr) {
    void* ptr = nullptr;
    const ph_status_t status = ph_malloc(device, size, &ptr);
    TORCH_CHECK_WITH(
        OutOfMemoryError, status != PH_ERROR_OUT_OF_MEMORY,
        c10::get_privateuse1_backend(), ": out of memory allocating ", nbytes,
        " bytes in private pool ", poolName(pool->id), " on ",
        c10::Device(c10::DeviceType::PrivateUse1, device),
        " (a graph capture or use_mem_pool routes this allocation there; "
        "its memory is not shared with the caching allocator, whose cached "
        "memory torch.", c10::get_privateuse1_backend(),
        ".empty_cache() outside the capture gives back): ",
        ph_last_error_message());
    PHANTOM_CHECK(status);
    block = new PoolBlock{ptr, size, nbytes, device, stream, true, false, pool};
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      pool->blocks.insert(block);
      pool->reserved += size;
    }
    account(*block, PrivatePoolChange::kSegmentAllocated);
  }
  account(*block, PrivatePoolChange::kBlockAllocated);
  gpu_trace::memoryAllocated(block->ptr);
  return {block->ptr, block, &deletePoolBlock, where};
}

bool privatePoolRecordStream(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &deletePoolBlock || ptr.get_context() == nullptr) {
    return false;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  static_cast<PoolBlock*>(ptr.get_context())->used_on_other_streams = true;
  return true;
}

c10::MempoolId_t newPrivatePoolId(bool user_created) {
  const c10::CaptureId_t id = g_next_id.fetch_add(1);
  return user_created ? c10::MempoolId_t{id, 0} : c10::MempoolId_t{0, id};
}

void graphPoolBeginCapture(c10::MempoolId_t id, c10::DeviceIndex device,
                           c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<PrivatePool>& pool = g_pools[id];
  if (!pool) {
    pool = std::make_shared<PrivatePool>();
    pool->id = id;
  }
  pool->users += 1;
  if (g_capturing.emplace(std::make_pair(device, stream), pool).second) {
    g_routing_count.fetch_add(1, std::memory_order_relaxed);
  }
}

void graphPoolBindCaptureId(c10::DeviceIndex device, c10::StreamId stream,
                            uint64_t capture_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_capturing.find({device, stream});
  if (it != g_capturing.end()) g_by_capture_id[capture_id] = it->second;
}

void graphPoolEndCapture(c10::DeviceIndex device, c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_capturing.find({device, stream});
  if (it == g_capturing.end()) return;
  for (auto bound = g_by_capture_id.begin(); bound != g_by_capture_id.end();) {
    bound = bound->second == it->second ? g_by_capture_id.erase(bound)
                                        : std::next(bound);
  }
  g_capturing.erase(it);
  g_routing_count.fetch_sub(1, std::memory_order_relaxed);
}

void privatePoolRelease(c10::MempoolId_t id) {
  std::vector<PoolBlock*> freed;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_pools.find(id);
    if (it == g_pools.end()) return;
    PrivatePool& pool = *it->second;
    if (--pool.users > 0) return;
    freed = takeFreeBlocks(pool);
    if (!pool.blocks.empty()) g_released.push_back(it->second);
    g_pools.erase(it);  // live blocks keep the pool object
  }
  for (PoolBlock* block : freed) freeToDriver(block);
}

c10::MempoolId_t memPoolCreate() {
  const c10::MempoolId_t id = newPrivatePoolId(/*user_created=*/true);
  auto pool = std::make_shared<PrivatePool>();
  pool->id = id;
  pool->users = 1;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pools[id] = std::move(pool);
  return id;
}

void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) {
  std::shared_ptr<PrivatePool> pool;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_pools.find(id);
    if (it != g_pools.end()) pool = it->second;
  }
  TORCH_CHECK_VALUE(pool != nullptr, "use_mem_pool: there is no memory pool ",
                    poolName(id),
                    " (its MemPool was deleted, or no pool was made with "
                    "this id); create one with torch.",
                    c10::get_privateuse1_backend(), ".MemPool()");
  t_allocate_to.emplace_back(device, std::move(pool));
  g_routing_count.fetch_add(1, std::memory_order_relaxed);
}

void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) {
  TORCH_CHECK(!t_allocate_to.empty() && t_allocate_to.back().first == device &&
                  t_allocate_to.back().second->id == id,
              "use_mem_pool: ending pool ", poolName(id), " on ",
              c10::Device(c10::DeviceType::PrivateUse1, device),
              ", which is not this thread's innermost use_mem_pool context; "
              "leave the contexts in the order they were entered");
  t_allocate_to.pop_back();
  g_routing_count.fetch_sub(1, std::memory_order_relaxed);
}

int privatePoolUseCount(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_pools.find(id);
  return it == g_pools.end() ? 0 : it->second->users;
}

size_t privatePoolReservedBytes(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_pools.find(id);
  return it == g_pools.end() ? 0 : it->second->reserved;
}

void privatePoolSnapshot(
    std::vector<c10::CachingDeviceAllocator::SegmentInfo>& out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::unordered_set<const PrivatePool*> seen;
  auto add = [&](const PrivatePool& pool) {
    if (!seen.insert(&pool).second) return;
    for (const PoolBlock* block : pool.blocks) {
      c10::CachingDeviceAllocator::SegmentInfo segment;
      segment.device = block->device;
      segment.address = reinterpret_cast<size_t>(block->ptr);
      segment.total_size = block->size;
      segment.stream = reinterpret_cast<void*>(block->stream);
      segment.is_large = block->size > kSmallSize;
      segment.owner_private_pool_id = pool.id;
      c10::CachingDeviceAllocator::BlockInfo info;
      info.size = block->size;
      info.requested_size = block->requested;
      info.allocated = block->allocated;
      info.active = block->allocated;
      if (block->allocated) {
        segment.allocated_size = block->size;
        segment.active_size = block->size;
        segment.requested_size = block->requested;
      }
      segment.blocks.push_back(std::move(info));
      out.push_back(std::move(segment));
    }
  };
  for (const auto& [id, pool] : g_pools) add(*pool);
  for (auto it = g_released.begin(); it != g_released.end();) {
    if (std::shared_ptr<PrivatePool> pool = it->lock()) {
      add(*pool);
      ++it;
    } else {
      it = g_released.erase(it);
    }
  }
}

}  // namespace phantom
