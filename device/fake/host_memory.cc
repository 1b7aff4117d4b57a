// Pinned host memory registry; see host_memory.h.
#include "host_memory.h"

#include <pthread.h>
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

struct PinnedBlock {
  size_t size;       // requested bytes
  uintptr_t alias;   // the copy engine's address of the block's first byte
};

struct PinnedRegistry {
  std::mutex mutex;                         // guards blocks
  std::map<uintptr_t, PinnedBlock> blocks;  // base -> block
};

size_t PageRounded(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (size + page - 1) / page * page;
}

PinnedRegistry* g_registry = nullptr;

// fork(): a shared mapping would let a child's writes reach the parent's
// pinned memory. The registry is held across the fork, and in the child
// each block mapped from a memfd is replaced, at the same address, by a
// private copy of its contents, so the child sees what a child of a
// process with ordinary page-locked memory sees: a copy. (The copy is made
// at the fork rather than on write.) The child has no alias: it has no
// device.
void LockBeforeFork() { g_registry->mutex.lock(); }
void UnlockInParent() { g_registry->mutex.unlock(); }
void PrivatizeInChild() {
  for (auto& [base, block] : g_registry->blocks) {
    if (block.alias == base) continue;  // already a private mapping
    const size_t bytes = PageRounded(block.size);
    void* user = reinterpret_cast<void*>(base);
    void* copy = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) continue;  // keeps sharing rather than losing data
    // The race detector may have protected pages of the block.
    mprotect(user, bytes, PROT_READ | PROT_WRITE);
    std::memcpy(copy, user, bytes);
    if (mremap(copy, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, user) ==
        MAP_FAILED) {
      munmap(copy, bytes);
      continue;
    }
    block.alias = base;
  }
  g_registry->mutex.unlock();
}

PinnedRegistry& Registry() {
  static PinnedRegistry* registry = [] {
    g_registry = new PinnedRegistry;  // leaked at exit
    pthread_atfork(&LockBeforeFork, &UnlockInParent, &PrivatizeInChild);
    return g_registry;
  }();
  return *registry;
}

// A memfd of `bytes` mapped twice; false (and errno set) on failure.
bool MapTwice(size_t bytes, void** out_user, void** out_alias) {
  const int fd = memfd_create("phantom-pinned", MFD_CLOEXEC);
  if (fd < 0) return false;
  bool mapped = false;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    void* user = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (user != MAP_FAILED) {
      void* alias =
          mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (alias != MAP_FAILED) {
        // Only the copy engine uses the alias, and a forked child has no
        // device: it gets the user's mapping alone.
        madvise(alias, bytes, MADV_DONTFORK);
        *out_user = user;
        *out_alias = alias;
        mapped = true;
      } else {
        const int saved = errno;
        munmap(user, bytes);
        errno = saved;
      }
    }
  }
  const int saved = errno;
  close(fd);  // the mappings keep the memory
  errno = saved;
  return mapped;
}

}  // namespace

bool PinnedAliasesAvailable() {
  static const bool available = [] {
    const int fd = memfd_create("phantom-pinned-probe", MFD_CLOEXEC);
    if (fd < 0) return false;
    close(fd);
    return true;
  }();
  return available;
}

ph_status_t AllocatePinned(size_t size, void** out_ptr) {
  if (size > SIZE_MAX / 2) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_host_malloc: cannot allocate " + std::to_string(size) +
                    " bytes of pinned host memory");
  }
  const size_t bytes = PageRounded(size);
  void* block = nullptr;
  void* alias = nullptr;
  if (PinnedAliasesAvailable()) {
    if (!MapTwice(bytes, &block, &alias)) block = MAP_FAILED;
  } else {
    block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    alias = block;
  }
  if (block == MAP_FAILED) {
    return Fail(PH_ERROR_OUT_OF_MEMORY,
                "ph_host_malloc: cannot allocate " + FormatBytes(size) +
                    " of pinned host memory: " + std::strerror(errno));
  }
  PinnedRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.blocks.emplace(reinterpret_cast<uintptr_t>(block),
                          PinnedBlock{size, reinterpret_cast<uintptr_t>(alias)});
  *out_ptr = block;
  return PH_SUCCESS;
}

ph_status_t FreePinned(void* ptr) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
  PinnedBlock block{};
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
    block = it->second;
    registry.blocks.erase(it);
  }
  munmap(ptr, PageRounded(block.size));
  if (block.alias != base) {
    munmap(reinterpret_cast<void*>(block.alias), PageRounded(block.size));
  }
  return PH_SUCCESS;
}

bool LookupPinnedAlias(const void* address, uintptr_t* out_base,
                       size_t* out_size, void** out_alias) {
  const uintptr_t value = reinterpret_cast<uintptr_t>(address);
  PinnedRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto it = registry.blocks.upper_bound(value);
  if (it == registry.blocks.begin()) return false;
  --it;
  if (value - it->first >= PageRounded(it->second.size)) return false;
  *out_base = it->first;
  *out_size = it->second.size;
  *out_alias = reinterpret_cast<void*>(it->second.alias + (value - it->first));
  return true;
}

bool LookupPinned(const void* address, uintptr_t* out_base,
                  size_t* out_size) {
  void* alias = nullptr;
  return LookupPinnedAlias(address, out_base, out_size, &alias);
}

}  // namespace phantom::fake
