"""What torch.profiler costs on phantom's small-op chain, against the same
on the CPU, in one process, reported as ratios (docs/profiling.md has the
measurements).

Design. The work is the small-op chain (200 elementwise ops on 1,000
floats, as bench/bench_graphs.py), run `inner` times per sample, each
phantom sample ending with torch.phantom.synchronize(). Four arms:
- cpu: the chain on the CPU, no profiler;
- phantom: the chain on phantom, no profiler (the driver's activity trace
  is off: one relaxed load per piece of work);
- phantom + CPU profiler: inside torch.profiler.profile(activities=[CPU]),
  the host-side cost every backend pays;
- phantom + device timeline: activities=[CPU, PrivateUse1], so phantom's
  activity profiler records every kernel on the driver's workers and
  links it to its op.
Each profiled sample opens its own profile and times the chains run
inside it (until synchronize), not the profile's stop: what a profiled
program is slowed by, not the processing of the trace afterwards (the
stop drains the driver's records and torch turns every event, host or
device, into a Python object). Arms are timed in interleaved rounds with a rotating order; each
ratio is the median over rounds of the two arms' quotient. No assertion
is made: the targets are read off the table.

    python bench/bench_profiler.py            # ~1 min
    python bench/bench_profiler.py --quick    # a few rounds, smoke test

The activity trace's cost when no profile is open (--trace-off-cost).
With tracing off, the fake driver still checks, per piece of work, whether
it is on (one relaxed load). Measuring that needs a second build of the
driver without the check (the CMake option PHANTOM_FAKE_ACTIVITY_TRACE=OFF,
device/fake/activity_trace.h). Build both variants the same way, each in
a build directory of its own, from the repository root:

    for v in ON OFF; do
      cmake -S . -B build/fake-trace-$v -G Ninja -DPHANTOM_BUILD_PYTHON=OFF \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPHANTOM_FAKE_ACTIVITY_TRACE=$v
      cmake --build build/fake-trace-$v --target phantom_fake
    done
    python bench/bench_profiler.py --trace-off-cost \
        --driver-on build/fake-trace-ON/device/fake/libphantom_fake.so \
        --driver-off build/fake-trace-OFF/device/fake/libphantom_fake.so

It runs pairs of child processes, one per driver (PHANTOM_DRIVER names
it), the order alternating from pair to pair. Each child times the chain
on phantom and on the CPU in interleaved rounds and reports the median
of the rounds' phantom/CPU quotients: the CPU arm, in the same process at
the same moment, takes out the machine's load and speed. The off-cost of
a pair is the ON child's ratio over the OFF child's; the script prints
the median over the pairs (--pairs, at least 5) with its range, and the
load average before and after. Run it under `taskset -c 1` on a small
machine: children pinned to one core keep their host thread and worker
together, and their ratios spread far less from process to process.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import torch_phantom  # noqa: F401


def chain(x):
    for i in range(100):
        x = x + 0.001 * i
        x = x * 0.999
    return x


def timed(x, on_phantom, inner):
    """Seconds for `inner` chains on `x`, the queued work included."""
    start = time.perf_counter()
    for _ in range(inner):
        chain(x)
    if on_phantom:
        torch.phantom.synchronize()
    return time.perf_counter() - start


def arms():
    cpu_x = torch.randn(1000)
    ph_x = cpu_x.to("phantom")

    def profiled(activities):
        def run(inner):
            with profile(activities=activities):
                return timed(ph_x, True, inner)
        return run

    def plain(x, on_phantom):
        return lambda inner: timed(x, on_phantom, inner)

    return {
        "cpu": plain(cpu_x, False),
        "phantom": plain(ph_x, True),
        "phantom + CPU profiler": profiled([ProfilerActivity.CPU]),
        "phantom + device timeline": profiled(
            [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]),
    }


def chain_ratio(rounds, inner):
    """The median over interleaved rounds of phantom's time for the chain
    over the CPU's, and each arm's median time per chain (ms)."""
    cpu_x = torch.randn(1000)
    ph_x = cpu_x.to("phantom")
    timed(cpu_x, False, inner), timed(ph_x, True, inner)  # warm up
    cpu, phantom = [], []
    for r in range(rounds):
        if r % 2:
            cpu.append(timed(cpu_x, False, inner))
            phantom.append(timed(ph_x, True, inner))
        else:
            phantom.append(timed(ph_x, True, inner))
            cpu.append(timed(cpu_x, False, inner))
    return {
        "ratio": statistics.median(p / c for p, c in zip(phantom, cpu)),
        "phantom_ms": 1e3 * statistics.median(phantom) / inner,
        "cpu_ms": 1e3 * statistics.median(cpu) / inner,
    }


def trace_off_cost(args):
    drivers = {"on": args.driver_on, "off": args.driver_off}
    for name, path in drivers.items():
        if path is not None and not os.path.isfile(path):
            sys.exit(f"--driver-{name} {path!r} is not a file: build the driver "
                     f"variants as this script's docstring says")
    if args.pairs < 5:
        sys.exit(f"--pairs must be at least 5, got {args.pairs}")
    rounds, inner = (4, 5) if args.quick else (args.rounds, args.inner)

    def child(driver):
        env = dict(os.environ)
        if driver is None:
            env.pop("PHANTOM_DRIVER", None)  # the package's own driver
        else:
            env["PHANTOM_DRIVER"] = os.path.abspath(driver)
        out = subprocess.run(
            [sys.executable, __file__, "--child-ratio", str(rounds), str(inner)],
            capture_output=True, text=True, env=env, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    load_before = os.getloadavg()
    pairs = []
    for i in range(args.pairs):
        order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
        result = {name: child(drivers[name]) for name in order}
        pairs.append(result)
        print(f"pair {i + 1}: phantom/cpu with the trace check {result['on']['ratio']:.3f}"
              f" ({result['on']['phantom_ms']:.2f} / {result['on']['cpu_ms']:.2f} ms),"
              f" without {result['off']['ratio']:.3f}"
              f" ({result['off']['phantom_ms']:.2f} / {result['off']['cpu_ms']:.2f} ms),"
              f" on/off {result['on']['ratio'] / result['off']['ratio']:.4f}", flush=True)
    load_after = os.getloadavg()
    costs = [p["on"]["ratio"] / p["off"]["ratio"] for p in pairs]
    print(f"off-cost of the activity trace (ON ratio / OFF ratio), median of "
          f"{len(costs)} pairs: {statistics.median(costs):.4f}"
          f" (range {min(costs):.4f} - {max(costs):.4f}); {rounds} rounds of "
          f"{inner} chains per child")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}"
          f" (1-minute), {os.cpu_count()} cores")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trace-off-cost", action="store_true",
                        help="measure the activity trace's cost when no profile is open "
                             "(see the docstring for the two driver builds)")
    parser.add_argument("--driver-on", default=None,
                        help="the fake driver built with PHANTOM_FAKE_ACTIVITY_TRACE=ON "
                             "(default: the package's own driver)")
    parser.add_argument("--driver-off", default=None,
                        help="the fake driver built with PHANTOM_FAKE_ACTIVITY_TRACE=OFF")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--child-ratio", nargs=2, type=int, metavar=("ROUNDS", "INNER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_ratio:
        torch.set_num_threads(1)
        print(json.dumps(chain_ratio(*args.child_ratio)))
        return
    if args.trace_off_cost:
        if args.driver_off is None:
            sys.exit("--trace-off-cost needs --driver-off: the fake driver built with "
                     "-DPHANTOM_FAKE_ACTIVITY_TRACE=OFF (see the docstring)")
        trace_off_cost(args)
        return
    rounds, inner = (3, 3) if args.quick else (12, 20)
    torch.set_num_threads(1)
    runs = arms()
    for run in runs.values():  # warm up, and let Kineto initialise
        run(1)
    names = list(runs)
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            times[name].append(runs[name](inner))

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    for name in names:
        print(f"{name}: {1e3 * statistics.median(times[name]) / inner:.2f} ms per chain")
    print(f"phantom / cpu: {ratio('phantom', 'cpu'):.2f}x")
    print(f"phantom + CPU profiler / phantom: "
          f"{ratio('phantom + CPU profiler', 'phantom'):.2f}x")
    print(f"phantom + device timeline / phantom + CPU profiler: "
          f"{ratio('phantom + device timeline', 'phantom + CPU profiler'):.2f}x"
          "  (the device timeline's own cost)")


if __name__ == "__main__":
    main()
