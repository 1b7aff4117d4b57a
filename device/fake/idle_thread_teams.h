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
// thread wake-up: on a virtual machine whose idle vCPUs halt, ~60 us per
// region, where a spinning team starts the next region in well under one.
// On two cores, torch's default of one thread per core puts the host's
// team and one worker's team over the limit, and a 256x256 CPU linear
// that took 8 us took 78 us in a process whose device had run one.
//
// So a worker that has found no work for kTeamReleaseDelay after its idle
// poll (spin_wait.h) releases its team (omp_pause_resource_all: the
// calling thread's pool, nothing else's), and the next parallel kernel it
// runs makes a new one. Releasing and making a team again costs ~100 us
// (a thread joined, a thread created), and a new helper thread starts
// wherever the OS puts it, which is not always where the old one had
// settled: a program alternating ~10 ms of CPU steps with ~10 ms of
// phantom steps ran some of its phantom steps twice as slowly when the
// team went after 5 ms idle. So the team stays through the gaps of a busy
// program, and goes in a pause of 50 ms, which is what a host phase of
// its own (an evaluation on the CPU, a data pass) takes. While the device is busy
// nothing changes: its team and the host's may both exist, and then they
// sleep between regions, which also keeps the worker's team from spinning
// on the core the host thread dispatches from.
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
