"""torch.compile on phantom against torch.compile on the CPU, in one process.

Design. As bench/bench_perf.py (whose timing rules and ratio, in
perf_harness.py, this reuses): every case is a set of *arms*, the same
work on different devices or modes; the arms are compiled and warmed up first (compiling is not timed),
then timed in interleaved rounds whose order cycles through every order of
the arms; a sample runs the work `inner` times and, on phantom, ends with
torch.phantom.synchronize(), so queued work is paid for. `inner` is sized
so that one sample of the first CPU arm lasts --min-sample-ms. The ratio
of two arms is the median over blocks of rounds (one round per arm order)
of their times' quotient (perf_harness.balanced_ratio).

Cases and targets (issue 25):

- pointwise: a chain of gelu, mul and add over 10^6 floats, which Inductor
  fuses into one kernel. Arms: compiled phantom, compiled CPU, eager
  phantom, eager CPU. Targets: compiled phantom / compiled CPU <= 1.1, and
  compiled phantom / eager phantom < 1 (compiling pays off).
- training steps of the MLP and the Transformer of examples/train_models.py:
  the model compiled (forward and, through AOTAutograd, backward), the
  optimizer step eager. Arms: compiled phantom, compiled CPU. Target:
  compiled phantom / compiled CPU <= 1.1.
- launch: a graph with one tiny kernel (one element), host side of the
  call only (the sample's closing sync aside): what the wrapper costs per
  call of compiled code, phantom against the CPU, where the CPU runs the
  kernel in the call and phantom queues it.

    python bench/bench_compile.py                      # ~3 min after compiling
    python bench/bench_compile.py --out bench/results/compile.json
    python bench/bench_compile.py --quick              # few rounds, smoke test

Run it under OMP_WAIT_POLICY=PASSIVE on a shared machine (bench/run_perf.sh
explains why); the results JSON records it.
"""

import argparse
import itertools
import json
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import torch_phantom  # noqa: F401  (registers the device)

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))

import perf_harness  # noqa: E402
import train_models  # noqa: E402

PHANTOM = "phantom"
TARGET_VS_CPU = 1.1  # compiled phantom / compiled CPU, at most
TARGET_VS_EAGER = 1.0  # compiled phantom / eager phantom, below


def sync(device):
    if device == PHANTOM:
        torch.phantom.synchronize()


# --- timing -------------------------------------------------------------------


def time_arms(arms, args, inner=None):
    """`arms`: {name: (device, work)} where work() does one unit of work
    (queued, on phantom). Returns ({name: [seconds per call per round]},
    inner)."""
    names = list(arms)

    def sample(name, k):
        device, work = arms[name]
        sync(device)
        time.sleep(perf_harness.SETTLE_S)
        start = time.perf_counter()
        for _ in range(k):
            work()
        sync(device)
        return (time.perf_counter() - start) / k

    for name in names:  # warm up (compiled already)
        sample(name, 2)
    if inner is None:
        sizing = next(n for n in names if arms[n][0] == "cpu")
        inner = 1
        while inner < 1 << 24:
            per_call = sample(sizing, inner)
            if per_call * inner >= args.min_sample_ms / 1e3:
                break
            inner = max(2 * inner, int(1.2 * args.min_sample_ms / 1e3 / max(per_call, 1e-9)))
    orders = list(itertools.permutations(names))
    samples = {name: [] for name in names}
    timed, r = 0.0, 0
    while r < args.reps or (r < args.max_reps and timed < args.case_budget_s) or r % len(orders):
        started = time.perf_counter()
        for name in orders[r % len(orders)]:
            samples[name].append(sample(name, inner))
        timed += time.perf_counter() - started
        r += 1
    return samples, inner


def ratio(samples, numerator, denominator):
    return perf_harness.balanced_ratio(samples[numerator], samples[denominator], len(samples))


def report(results, case, samples, inner, comparisons):
    """Prints and records the arms' medians and the `comparisons`:
    [(numerator arm, denominator arm, comparison, bound)]."""
    row = {"case": case, "inner": inner, "rounds": len(next(iter(samples.values()))),
           "median_s": {name: statistics.median(s) for name, s in samples.items()},
           "samples_s": samples, "ratios": []}
    for name, value in row["median_s"].items():
        print(f"  {case:<22} {name:<18} {perf_harness.fmt_time(value):>10}")
    for numerator, denominator, op, bound in comparisons:
        value = ratio(samples, numerator, denominator)
        met = value <= bound if op == "<=" else value < bound
        row["ratios"].append({"numerator": numerator, "denominator": denominator,
                              "ratio": value, "target": f"{op} {bound}", "met": met})
        print(f"  {case:<22} {numerator} / {denominator}: {value:.3f} "
              f"(target {op} {bound}: {'met' if met else 'NOT met'})", flush=True)
    results.append(row)
    return row


# --- cases --------------------------------------------------------------------


def pointwise_chain(x, w):
    for _ in range(4):
        x = F.gelu(x) * w + 0.5
    return x


def bench_pointwise(args, results):
    print("\n== pointwise chain (4 x gelu, mul, add) over 10^6 floats, time per call")
    n = 10**5 if args.quick else 10**6
    compiled = torch.compile(pointwise_chain)
    arms = {}
    for device in (PHANTOM, "cpu"):
        torch.manual_seed(0)
        x, w = torch.randn(n, device=device), torch.randn(n, device=device)
        arms[f"compiled {device}"] = (device, lambda x=x, w=w: compiled(x, w))
        arms[f"eager {device}"] = (device, lambda x=x, w=w: pointwise_chain(x, w))
    torch.testing.assert_close(compiled(*[t.to(PHANTOM) for t in (x, w)]).cpu(),
                               compiled(x, w))
    samples, inner = time_arms(arms, args)
    report(results, "pointwise", samples, inner, [
        ("compiled phantom", "compiled cpu", "<=", TARGET_VS_CPU),
        ("compiled phantom", "eager phantom", "<", TARGET_VS_EAGER),
        ("eager phantom", "eager cpu", "<=", math.inf),
    ])


def compiled_training_step(name, device):
    spec = train_models.MODELS[name]
    torch.manual_seed(0)
    model = spec.make_model().to(device)
    model.train()
    forward = torch.compile(model)
    optimizer = spec.optimizer(list(model.parameters()))
    batch = spec.make_batches(1, torch.Generator().manual_seed(1))[0]
    inputs = [t.to(device) for t in batch.inputs]
    target = batch.target.to(device)

    def step():
        optimizer.zero_grad()
        spec.loss(forward(*inputs), target).backward()
        optimizer.step()
    return step


def bench_training(args, results):
    print("\n== training steps, model compiled (forward and backward), time per step")
    for name in ("mlp", "transformer"):
        arms = {f"compiled {device}": (device, compiled_training_step(name, device))
                for device in (PHANTOM, "cpu")}
        for _, step in arms.values():  # compile both before timing
            step()
        samples, inner = time_arms(arms, args)
        report(results, name, samples, inner,
               [("compiled phantom", "compiled cpu", "<=", TARGET_VS_CPU)])


def bench_launch(args, results):
    print("\n== launch: one call of a graph with one kernel on 1 element, host side")
    compiled = torch.compile(lambda t: t * 2 + 1)
    arms = {}
    for device in (PHANTOM, "cpu"):
        t = torch.ones(1, device=device)
        compiled(t)
        arms[f"compiled {device}"] = (device, lambda t=t: compiled(t))
    samples, inner = time_arms(arms, args)
    report(results, "launch", samples, inner,
           [("compiled phantom", "compiled cpu", "<=", math.inf)])


RUNNERS = {"pointwise": bench_pointwise, "training": bench_training, "launch": bench_launch}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, smaller sizes")
    parser.add_argument("--only", nargs="+", choices=list(RUNNERS), metavar="NAME")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--max-reps", type=int, default=60)
    parser.add_argument("--case-budget-s", type=float, default=None)
    parser.add_argument("--min-sample-ms", type=float, default=None)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.reps = args.reps or (3 if args.quick else 12)
    args.case_budget_s = args.case_budget_s if args.case_budget_s is not None else (
        0.0 if args.quick else 20.0)
    args.min_sample_ms = args.min_sample_ms or (5.0 if args.quick else 20.0)

    info = perf_harness.machine()
    print(f"{info['cpu_model']}, {info['cpu_count']} cores, torch {info['torch']} "
          f"({info['torch_threads']} threads), phantom {info['phantom_commit'][:12]}, "
          f"load {info['load_average_at_start'][0]:.2f}")
    started = time.perf_counter()
    results = []
    for name in args.only or RUNNERS:
        RUNNERS[name](args, results)
    info["load_average_at_end"] = list(__import__("os").getloadavg())
    info["seconds"] = time.perf_counter() - started
    judged = [r for row in results for r in row["ratios"] if r["target"] != "<= inf"]
    met = sum(r["met"] for r in judged)
    print(f"\ntargets met: {met}/{len(judged)}; took {info['seconds']:.0f} s, "
          f"load at end {info['load_average_at_end'][0]:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "bench/bench_compile.py", "machine": info,
                       "reps": args.reps, "quick": args.quick, "results": results},
                      f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")
    return 0 if met == len(judged) else 1


if __name__ == "__main__":
    sys.exit(main())
