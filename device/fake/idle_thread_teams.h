// Giving back the OpenMP team a worker's host work made, when the worker
// goes idle.
//
// The fake runs host functions (phantom's CPU kernels) on its stream
// workers, and a kernel that splits its work with OpenMP makes the worker
// the master of a team of its own: libgomp keeps a pool of threads per
// master for as long as that master lives. The host thread that ran CPU
// ops has its own. libgomp counts every pooled thread, and once the count
// exceeds the CPUs it may use, every waiting member of every team in the
// process spins only briefly before sleeping on a futex
// (gomp_throttled_spin_count_var), so each parallel region then pays a
// thread wake-up where a spinning team would start it at once. With
// torch's default of one thread per core, the host's team and one
// worker's are over the limit, so an idle device would slow the host's
// own CPU ops (docs/performance.md, "An idle device gives its OpenMP team
// back", has the numbers).
//
// So a worker that has found no work for kTeamReleaseDelay after its idle
// poll (spin_wait.h) releases its team (omp_pause_resource_all: the
// calling thread's pool, nothing else's), and the next parallel kernel it
// runs makes a new one. Releasing and making a team again costs a thread
// joined and a thread created, and the new helper starts wherever the OS
// puts it, not always where the old one had settled. So the team stays
// through the gaps of a busy program, and goes in a pause as long as a
// host phase of its own (an evaluation on the CPU, a data pass). While the
// device is busy nothing changes: its team and the host's may both
// exist, and then they sleep between regions, which also keeps the
// worker's team from spinning on the core the host thread dispatches
// from.
//
// The fake reaches OpenMP only if the process has loaded it (libgomp's
// soname, RTLD_NOLOAD), and does nothing otherwise: the driver does not
// depend on it, and loads nothing.
#ifndef PHANTOM_FAKE_IDLE_THREAD_TEAMS_H_
#define PHANTOM_FAKE_IDLE_THREAD_TEAMS_H_

#include <chrono>

namespace phantom::fake {

// How long a sleeping worker finds no work before it releases its OpenMP
// team (after kIdlePollBudget of polling).
constexpr std::chrono::milliseconds kTeamReleaseDelay{50};

// Releases the calling thread's OpenMP team, if the process has loaded
// libgomp and the thread has one; a no-op inside a parallel region.
void ReleaseThreadOpenMpTeam();

}  // namespace phantom::fake

#endif  // PHANTOM_FAKE_IDLE_THREAD_TEAMS_H_
