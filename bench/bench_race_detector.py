"""What the stream race detector costs on phantom, against the same work
with it off and on the CPU, in one process, reported as ratios
(docs/race-detector.md, "Cost", has the measurements).

Design. Two workloads, each run `inner` times per sample, each phantom
sample ending with torch.phantom.synchronize():
- chain: the small-op chain (200 elementwise ops on 1,000 floats, as
  bench/bench_graphs.py and bench/bench_profiler.py), where the
  detector's per-op cost (a Python call, a stack capture, the clock
  updates) is all there is;
- mlp step: one training step of a two-layer MLP (batch 32, 64 -> 256 ->
  10, cross entropy, SGD): forward, backward on autograd's device thread,
  optimizer step.
Three arms per workload: cpu; phantom with the detector off; phantom with
it on (torch.phantom.race_detector.enable(), error mode). The detector is
switched on and off around each of its samples. Activating PyTorch's GPU
trace hooks is for the whole process, so after the first enable() the
"off" arm still pays a Python call per allocation, free and synchronize;
"phantom, before any enable" times the off arm once before that, as a
program that never enables the detector runs. Arms are timed in
interleaved rounds with a rotating order; each ratio is the median over
rounds of the two arms' quotient. No assertion is made.

A third workload measures the guard on non_blocking copies into pinned
memory (docs/race-detector.md, "Host accesses to a non_blocking copy's
destination"): 20 copies of 16 KiB (four pages) from the device into one pinned
tensor, each followed by a stream synchronize and a read of the
destination, with the detector off, on without the guard
(race_detector._GUARD_COPIES = False) and on with it; the guard's cost is
the quotient of the last two (two mprotect calls and the bookkeeping per
copy).

    python bench/bench_race_detector.py            # ~1-2 min
    python bench/bench_race_detector.py --quick    # a few rounds, smoke test
"""
import argparse
import statistics
import time

import torch

import torch_phantom  # noqa: F401
import torch.phantom.race_detector as race_detector


def chain(x):
    for i in range(100):
        x = x + 0.001 * i
        x = x * 0.999
    return x


def mlp_step(model, optimizer, data, target):
    loss = torch.nn.functional.cross_entropy(model(data), target)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def workloads(device):
    torch.manual_seed(0)
    x = torch.randn(1000).to(device)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 64).to(device)
    target = torch.randint(0, 10, (32,)).to(device)
    return {
        "chain": lambda: chain(x),
        "mlp step": lambda: mlp_step(model, optimizer, data, target),
    }


def copies(source, destination):
    stream = torch.phantom.current_stream()
    for _ in range(20):
        destination.copy_(source, non_blocking=True)
        stream.synchronize()
        destination[0].item()


def timed(work, on_phantom, inner, detector, guard=True):
    if detector:
        race_detector._GUARD_COPIES = guard
        race_detector.enable()
    try:
        start = time.perf_counter()
        for _ in range(inner):
            work()
        if on_phantom:
            torch.phantom.synchronize()
        return time.perf_counter() - start
    finally:
        if detector:
            race_detector.disable()
            race_detector._GUARD_COPIES = True


def compare(times, a, b):
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def interleaved(arms, rounds, inner):
    for run in arms.values():  # warm up
        run(1)
    names = list(arms)
    times = {arm: [] for arm in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for arm in order:
            times[arm].append(arms[arm](inner))
    return times


def bench_copies(rounds, inner):
    source = torch.randn(1 << 12, device="phantom")  # 16 KiB: four pages
    destination = torch.empty(1 << 12, pin_memory=True)
    work = lambda: copies(source, destination)  # noqa: E731
    arms = {
        "phantom": lambda n: timed(work, True, n, False),
        "detector, no guard": lambda n: timed(work, True, n, True, guard=False),
        "detector + guard": lambda n: timed(work, True, n, True),
    }
    times = interleaved(arms, rounds, inner)
    name = "20 non_blocking D2H copies"
    for arm in arms:
        print(f"{name}, {arm}: {1e3 * statistics.median(times[arm]) / inner:.2f} ms")
    print(f"{name}: detector + guard / detector, no guard: "
          f"{compare(times, 'detector + guard', 'detector, no guard'):.2f}x")
    print(f"{name}: detector + guard / phantom: "
          f"{compare(times, 'detector + guard', 'phantom'):.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, inner = (3, 3) if args.quick else (10, 10)
    torch.set_num_threads(1)
    cpu, phantom = workloads("cpu"), workloads("phantom")
    for name in cpu:
        arms = {
            "cpu": lambda n: timed(cpu[name], False, n, False),
            "phantom": lambda n: timed(phantom[name], True, n, False),
            "phantom + detector": lambda n: timed(phantom[name], True, n, True),
        }
        if not race_detector._trace_on:  # before the trace hooks are active
            arms["phantom"](1)
            before = statistics.median(arms["phantom"](inner) for _ in range(rounds))
            print(f"{name}, phantom before any enable: {1e3 * before / inner:.2f} ms")
        times = interleaved(arms, rounds, inner)

        def ratio(a, b):
            return compare(times, a, b)

        for arm in arms:
            print(f"{name}, {arm}: {1e3 * statistics.median(times[arm]) / inner:.2f} ms")
        print(f"{name}: phantom / cpu: {ratio('phantom', 'cpu'):.2f}x")
        print(f"{name}: phantom + detector / phantom: "
              f"{ratio('phantom + detector', 'phantom'):.2f}x")
        print(f"{name}: phantom + detector / cpu: "
              f"{ratio('phantom + detector', 'cpu'):.2f}x")
    bench_copies(rounds, inner)


if __name__ == "__main__":
    main()
