// See idle_thread_teams.h.
#include "idle_thread_teams.h"

#include <dlfcn.h>

namespace phantom::fake {
namespace {

using PauseAll = int (*)(int kind);
constexpr int kOmpPauseSoft = 1;  // omp_pause_soft (OpenMP 5.0)

PauseAll FindPause() {
  void* gomp = dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_NOW);
  if (gomp == nullptr) return nullptr;
  return reinterpret_cast<PauseAll>(dlsym(gomp, "omp_pause_resource_all"));
}

}  // namespace

void ReleaseThreadOpenMpTeam() {
  // Looked up until found, not once for the process: the driver may be
  // loaded before the library that brings OpenMP in.
  static thread_local PauseAll pause = nullptr;
  if (pause == nullptr) pause = FindPause();
  if (pause != nullptr) pause(kOmpPauseSoft);
}

}  // namespace phantom::fake
