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
"""
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import torch_phantom  # noqa: F401


def chain(x):
    for i in range(100):
        x = x + 0.001 * i
        x = x * 0.999
    return x


def arms():
    cpu_x = torch.randn(1000)
    ph_x = cpu_x.to("phantom")

    def timed(x, on_phantom, inner):
        start = time.perf_counter()
        for _ in range(inner):
            chain(x)
        if on_phantom:
            torch.phantom.synchronize()
        return time.perf_counter() - start

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
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
