"""The timing harness of the phantom-against-CPU benchmarks (bench_perf.py,
bench_compile.py, bench_distributed.py): how a case is timed and how its
ratio is formed.

Design. Every benchmark is a set of *cases*; a case is the same piece of
work written twice, once on "phantom" and once on "cpu", with the same
dtype (float32) and the same intra-op thread count (torch.get_num_threads()
is printed and saved). Both versions are warmed up, then timed in
interleaved rounds: each round times phantom then CPU (the order flips
every round, so drift of a shared machine hits both alike). One sample
runs the work `inner` times back to back; a phantom sample ends with
torch.phantom.synchronize(), so queued work is paid for. `inner` is the
number of calls with which one CPU sample, timed the same way, lasted at
least --min-sample-ms (grown until it did). A case gets at least --reps
rounds, and more (up to --max-reps) while it has been timed for less than
--case-budget-s: cheap cases, whose samples spread most, get the most.
Every --remake-every rounds the inputs of every arm are built again, so a
case is timed over several placements of its memory, not one: two CPU
copies of one case differed by up to 16 % in one process, and by at most
8 % when their inputs were re-created every few rounds.
The result of a case is the median per-call time of each device and the
ratio phantom/CPU (lower is better; 1.0 = as fast as the CPU, which runs
the very same kernels without a device in between): rounds come in blocks
of one round per order of the arms, and the ratio is the median over
blocks of the block's phantom time over its CPU time (balanced_ratio). A
block times both within a second or so, so a slow phase of the machine
that spans it cancels in its ratio, and so does the order the arms ran
in; the median of single rounds' ratios and the ratio of the two medians
are saved beside it.

The large ops and the training steps also time a *control*: a second,
independent CPU copy of the case (its own inputs, its own memory) in the
same rounds. Its ratio to the first CPU copy would be 1.00 on a quiet
machine; how far it is from 1.00 is the noise floor of that case in that
run, printed and saved beside the phantom/CPU ratio. It is reported, not
used to correct anything. So is the share of CPU time the hypervisor
stole (/proc/stat) during each case and the whole run: on a virtual
machine, the one cause of slow samples that is outside both devices.
"""

import datetime
import itertools
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
PHANTOM = "phantom"
# The pause before each timed sample: the other arm's threads must have
# stopped spinning. Phantom's worker polls its queue for 1 ms after its last
# task; OpenMP's threads, under its default wait policy, spin at the barrier
# for several ms more (under OMP_WAIT_POLICY=PASSIVE, run_perf.sh's default,
# not at all). No longer than needed: on the virtual machines measured here
# a core left idle for 20 ms runs the next ~10 ms at about half speed (a sum
# of 10^7 floats on the CPU: 0.80 ms per call after a 3 ms pause, 1.53-1.66
# ms after a 20 ms one, 10 calls per sample), which weighed on every sample.
SETTLE_S = 0.003 if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" else 0.02


def sync(device):
    if device == PHANTOM:
        torch.phantom.synchronize()


CONTROL = "cpu (control)"  # a second copy of the CPU case


def time_case(make, args, inner=None, control=False):
    """Times one case on both devices, interleaved.

    `make(device)` builds the inputs and returns a zero-argument callable
    that does one unit of work on `device` (queued, for phantom). With
    `control`, a second, independent CPU copy of the case is timed in the
    same rounds: the CPU against itself, the run's noise floor for this
    case. Returns ({arm: [seconds per call, one per round]}, inner)."""
    arms = [PHANTOM, "cpu"] + ([CONTROL] if control else [])
    device_of = {PHANTOM: PHANTOM, "cpu": "cpu", CONTROL: "cpu"}
    runs = {arm: make(device_of[arm]) for arm in arms}
    min_sample_s = args.min_sample_ms / 1e3

    def remake():
        runs.clear()  # free the old inputs before building the new ones
        runs.update({arm: make(device_of[arm]) for arm in arms})
        # A whole untimed sample of each arm, not one call: building the
        # CPU arms' inputs keeps the Python thread busy for up to a second
        # (a serial torch.rand of 256 MiB), and for the next tens of ms
        # Linux may wake phantom's worker's OpenMP helper on the worker's
        # own core while the other idles (docs/performance.md, "A busy
        # Python thread can leave phantom's OpenMP team on one core"): the
        # first phantom sample after a remake took 1.5x the next ones in
        # the large ops' runs.
        for arm in arms:
            sample(arm, inner)

    def sample(arm, k):
        run = runs[arm]
        sync(device_of[arm])
        # Let the other arm's threads stop spinning (SETTLE_S) so they do
        # not steal a core from this sample.
        time.sleep(SETTLE_S)
        start = time.perf_counter()
        for _ in range(k):
            run()
        sync(device_of[arm])
        return (time.perf_counter() - start) / k

    # Warm-up: first touch of memory, allocator caches, Meta-kernel caches.
    for arm in arms:
        sample(arm, 1)
    if inner is None:
        # Size a sample from the CPU (the same rule for both devices): grow
        # the number of calls until one sample of them, timed exactly as
        # below, lasts min_sample_s. Sizing it from one or five calls right
        # after the pause came out too small when those calls were slow: in
        # three full runs the MLP's and the Transformer's samples had 2-4
        # steps, 5-15 ms instead of 20, so the threads' wake-up after the
        # pause weighed on every sample.
        inner = 1
        while inner < 1 << 24:
            per_call = sample("cpu", inner)
            if per_call * inner >= min_sample_s:
                break
            inner = max(2 * inner, int(1.2 * min_sample_s / max(per_call, 1e-9)))
    # The sizing kept the Python thread busy on the CPU: phantom gets an
    # untimed sample of its own after it, as after a remake (below).
    sample(PHANTOM, inner)
    # Rounds: at least args.reps; more, up to args.max_reps, while the case
    # has been timed for less than args.case_budget_s (building inputs
    # again does not count); always whole blocks (balanced_ratio). Each
    # round runs every arm once, in an order that cycles through all
    # orders, so each arm follows each other arm equally often and drift
    # hits all alike.
    orders = list(itertools.permutations(arms))
    samples = {arm: [] for arm in arms}
    timed = 0.0
    r = 0
    while (r < args.reps or (r < args.max_reps and timed < args.case_budget_s)
           or r % len(orders)):
        if args.remake_every and r and r % args.remake_every == 0:
            remake()
        started = time.perf_counter()
        for arm in orders[r % len(orders)]:
            samples[arm].append(sample(arm, inner))
        timed += time.perf_counter() - started
        r += 1
    runs.clear()
    return samples, inner


def paired_ratio(numerator, denominator):
    """Median over rounds of numerator[i] / denominator[i], the two arms'
    samples of round i."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


def balanced_ratio(numerator, denominator, arms):
    """Median over blocks of rounds of sum(numerator) / sum(denominator)
    within the block; a block is one round in each order of the `arms`
    arms, so each arm ran first as often as second.

    A round's own ratio depends on which arm ran first: in the run of
    commit 9a2333c the rounds' ratios of sum 10^7 alternated 0.59-0.98
    (phantom first) and 1.11-1.68 (CPU first), and their median fell
    wherever the two groups met. Over a block the order cancels out, for
    both arms alike."""
    block = math.factorial(arms)
    pairs = list(zip(numerator, denominator))
    blocks = [pairs[i:i + block] for i in range(0, len(pairs) - block + 1, block)] or [pairs]
    return statistics.median(sum(a for a, _ in b) / sum(c for _, c in b) for b in blocks)


def cpu_ticks():
    """(steal, total) clock ticks of all CPUs so far, from /proc/stat, or
    None where there is none. Steal is time the hypervisor ran something
    else while this virtual machine had work: the samples taken then are
    slow for a reason outside both devices."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    return fields[7], sum(fields[:8])


def steal_fraction(before, after):
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def record(results, bench, name, make, args, size=None, inner=None, extra=None,
           control=False):
    ticks = cpu_ticks()
    samples, inner = time_case(make, args, inner, control)
    steal = steal_fraction(ticks, cpu_ticks())
    p = statistics.median(samples[PHANTOM])
    c = statistics.median(samples["cpu"])
    row = {
        "benchmark": bench,
        "case": name,
        "size": size,
        "phantom_s": p,
        "cpu_s": c,
        "ratio": balanced_ratio(samples[PHANTOM], samples["cpu"], len(samples)),
        "ratio_of_medians": p / c,
        "ratio_per_round": paired_ratio(samples[PHANTOM], samples["cpu"]),
        "inner": inner,
        "rounds": len(samples["cpu"]),
        "steal_fraction": steal,
        "samples_phantom_s": samples[PHANTOM],
        "samples_cpu_s": samples["cpu"],
    }
    if control:
        row["cpu_control_s"] = statistics.median(samples[CONTROL])
        row["control_ratio"] = balanced_ratio(samples[CONTROL], samples["cpu"], len(samples))
        row["samples_cpu_control_s"] = samples[CONTROL]
    if extra:
        row.update(extra)
    results.append(row)
    stolen = f", {steal:.0%} of CPU time stolen" if steal and steal >= 0.01 else ""
    print(f"  {name:<34} {fmt_time(p):>10} {fmt_time(c):>10} {row['ratio']:7.2f}"
          f"  ({row['rounds']} rounds{stolen})", flush=True)
    if control:
        print(f"    noise floor: a second CPU copy of the case / the first: "
              f"{row['control_ratio']:.2f}", flush=True)
    return row


def fmt_time(seconds):
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def header(title, baseline="cpu"):
    print(f"\n== {title}")
    print(f"  {'case':<34} {'phantom':>10} {baseline:>10} {'ratio':>7}")


def machine():
    model = platform.processor()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def git(*cmd):
        try:
            return subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"

    def read(path):
        try:
            return pathlib.Path(path).read_text().strip()
        except OSError:
            return None
    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "phantom_commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_at_start": os.getloadavg(),
        # How an idle vCPU waits: with the guest's haltpoll driver and
        # guest_halt_poll_ns 0 it halts at once, and waking a thread on it
        # takes ~60 us (performance.md, "Measuring on a virtual machine").
        "cpuidle_driver": read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "guest_halt_poll_ns": read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        "env": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS",
                                           "PHANTOM_SYNC_GENERIC", "PHANTOM_ALLOC_CONF",
                                           "THP_MEM_ALLOC_ENABLE")
                if k in os.environ},
    }
