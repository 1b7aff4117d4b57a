// The graphs' private memory pools; see phantom/Graph.h.
#include <phantom/Exception.h>
#include <phantom/Graph.h>
#include <phantom/Stream.h>

#include <atomic>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace phantom {
namespace {

struct GraphPool;

struct PoolBlock {
  void* ptr = nullptr;
  size_t size = 0;
  std::shared_ptr<GraphPool> pool;
};

struct GraphPool {
  c10::DeviceIndex device = 0;
  int users = 0;          // graphs captured into it, not yet reset
  size_t reserved = 0;    // bytes held from the driver
  std::vector<PoolBlock*> freed;  // dead tensors' memory, kept reserved
};

std::mutex g_mutex;  // guards what follows
std::map<c10::MempoolId_t, std::shared_ptr<GraphPool>> g_pools;
std::map<std::pair<c10::DeviceIndex, c10::StreamId>, std::shared_ptr<GraphPool>>
    g_capturing;
// The same pools by the driver's capture id, for streams that joined a
// capture (fork/join): their allocations belong to the graph too.
std::map<uint64_t, std::shared_ptr<GraphPool>> g_by_capture_id;
std::atomic<int> g_capturing_count{0};
std::atomic<c10::CaptureId_t> g_next_id{1};

void freeToDriver(void* ptr) {
  if (ph_free(ptr) != PH_SUCCESS) {
    std::fprintf(stderr,
                 "phantom: returning graph pool memory %p failed (kept): %s\n",
                 ptr, ph_last_error_message());
  }
}

void deletePoolBlock(void* context) {
  auto* block = static_cast<PoolBlock*>(context);
  std::unique_lock<std::mutex> lock(g_mutex);
  if (block->pool->users > 0) {
    block->pool->freed.push_back(block);  // the graph still uses it
    return;
  }
  block->pool->reserved -= block->size;
  lock.unlock();
  freeToDriver(block->ptr);
  delete block;
}

}  // namespace

bool graphCaptureUnderway() noexcept {
  return g_capturing_count.load(std::memory_order_relaxed) != 0;
}

c10::DataPtr graphPoolAllocate(size_t nbytes, c10::DeviceIndex device,
                               c10::StreamId stream) {
  std::shared_ptr<GraphPool> pool;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_capturing.find({device, stream});
    if (it != g_capturing.end()) pool = it->second;
  }
  if (!pool) {
    // A stream that joined a capture by waiting on one of its events.
    const ph_stream_t handle = PhantomStream(c10::Stream(
        c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
        stream)).handle();
    ph_capture_status_t status = PH_CAPTURE_STATUS_NONE;
    uint64_t capture_id = 0;
    if (ph_stream_get_capture_info(handle, &status, &capture_id) != PH_SUCCESS ||
        status == PH_CAPTURE_STATUS_NONE) {
      return {};
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_by_capture_id.find(capture_id);
    if (it == g_by_capture_id.end()) return {};
    pool = it->second;
  }
  const size_t size = (nbytes + 511) / 512 * 512;
  void* ptr = nullptr;
  PHANTOM_CHECK(ph_malloc(device, size, &ptr));
  auto* block = new PoolBlock{ptr, size, pool};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    pool->reserved += size;
  }
  return {ptr, block, &deletePoolBlock,
          c10::Device(c10::DeviceType::PrivateUse1, device)};
}

c10::MempoolId_t newGraphPoolId(bool user_created) {
  const c10::CaptureId_t id = g_next_id.fetch_add(1);
  // CUDA's convention: {0, n} a graph's own pool, {n, 0} a handle's.
  return user_created ? c10::MempoolId_t{id, 0} : c10::MempoolId_t{0, id};
}

void graphPoolBeginCapture(c10::MempoolId_t id, c10::DeviceIndex device,
                           c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<GraphPool>& pool = g_pools[id];
  if (!pool) {
    pool = std::make_shared<GraphPool>();
    pool->device = device;
  }
  pool->users += 1;
  if (g_capturing.emplace(std::make_pair(device, stream), pool).second) {
    g_capturing_count.fetch_add(1, std::memory_order_relaxed);
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
  if (it != g_capturing.end()) {
    for (auto bound = g_by_capture_id.begin(); bound != g_by_capture_id.end();) {
      bound = bound->second == it->second ? g_by_capture_id.erase(bound)
                                          : std::next(bound);
    }
  }
  if (g_capturing.erase({device, stream}) != 0) {
    g_capturing_count.fetch_sub(1, std::memory_order_relaxed);
  }
}

void graphPoolRelease(c10::MempoolId_t id) {
  std::vector<PoolBlock*> freed;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_pools.find(id);
    if (it == g_pools.end()) return;
    GraphPool& pool = *it->second;
    if (--pool.users > 0) return;
    freed.swap(pool.freed);
    for (PoolBlock* block : freed) pool.reserved -= block->size;
    g_pools.erase(it);  // live blocks keep the pool object
  }
  for (PoolBlock* block : freed) {
    freeToDriver(block->ptr);
    delete block;
  }
}

size_t graphPoolReservedBytes(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_pools.find(id);
  return it == g_pools.end() ? 0 : it->second->reserved;
}

}  // namespace phantom
