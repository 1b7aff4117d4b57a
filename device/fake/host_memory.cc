// Pinned host memory registry; see host_memory.h.
#include "host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "errors.h"

namespace phantom::fake {
namespace {

struct PinnedRegistry {
  std::mutex mutex;                    // guards blocks
  std::map<uintptr_t, size_t> blocks;  // base -> requested size
};

PinnedRegistry& Registry() {
  static PinnedRegistry* registry = new PinnedRegistry;  // leaked at exit
  return *registry;
}

size_t PageRounded(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

}  // namespace

ph_status_t AllocatePinned(size_t size, void** out_ptr) {
  if (size > SIZE_MAX / 2) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_host_malloc: cannot allocate " + std::to_string(size) +
                    " bytes of pinned host memory");
  }
  void* block = mmap(nullptr, PageRounded(size), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (block == MAP_FAILED) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_host_malloc: cannot allocate " + FormatBytes(size) +
                    " of pinned host memory: " + std::strerror(errno));
  }
  PinnedRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.blocks.emplace(reinterpret_cast<uintptr_t>(block), size);
  *out_ptr = block;
  return PH_SUCCESS;
}

ph_status_t FreePinned(void* ptr) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
  size_t size = 0;
  {
    PinnedRegistry& registry = Registry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto it = registry.blocks.find(base);
    if (it == registry.blocks.end()) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "ph_host_free: %p is not the start of a pinned block from "
                    "ph_host_malloc (already freed, or interior pointer?)",
                    ptr);
      return Fail(PH_ERROR_INVALID_HANDLE, text);
    }
    size = it->second;
    registry.blocks.erase(it);
  }
  munmap(ptr, PageRounded(size));
  return PH_SUCCESS;
}

bool LookupPinned(const void* address, uintptr_t* out_base,
                  size_t* out_size) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(address);
  PinnedRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto it = registry.blocks.upper_bound(value);
  if (it == registry.blocks.begin()) return false;
  --it;
  if (value - it->first >= PageRounded(it->second)) return false;
  *out_base = it->first;
  *out_size = it->second;
  return true;
}

}  // namespace phantom::fake
