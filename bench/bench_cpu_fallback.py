"""What the copying CPU fallback costs: ops on a driver without a kernel
view, against the kernel-view path and the CPU.

Cases, each a callable timed in interleaved rounds with the others of its
process (one sample of each per round, so drift hits all alike):

  small   a + b on 1,000 float32 (4 KB): the per-call cost
  4mib    a * b + c on 1 Mi float32 (4 MiB per tensor)
  mlp     one SGD training step of a 3-layer MLP (512 -> 1024 -> 1024 -> 10,
          batch 64; forward, backward, step), ~2.1 M parameters

Modes:

  cpu        the case on CPU tensors
  view       on phantom with the fake's kernel view (the default driver):
             native kernels and the generic path over device memory
  copying    on phantom with PHANTOM_FAKE_NO_KERNEL_VIEW=1: every op through
             the copying CPU fallback (PHANTOM_CPU_FALLBACK=silent)

A driver's kernel view is fixed when the runtime loads it, so `copying`
runs in a child process of this script; that child measures `cpu` again,
and each phantom mode is reported as the ratio to the CPU measured in its
own process (and copying / view). Medians of the rounds, each sample the
case repeated enough to last a few milliseconds, synchronized at its end.

    python bench/bench_cpu_fallback.py
    python bench/bench_cpu_fallback.py --rounds 9 --out bench/results/cpu_fallback.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch_phantom  # noqa: F401  (registers the device)

CASES = ["small", "4mib", "mlp"]


def make_case(name, device):
    torch.manual_seed(0)
    if name == "small":
        a, b = torch.randn(1000, device=device), torch.randn(1000, device=device)
        return lambda: a + b
    if name == "4mib":
        n = 1 << 20
        a, b, c = (torch.randn(n, device=device) for _ in range(3))
        return lambda: a * b + c
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 512, device=device)
    target = torch.randint(0, 10, (64,), device=device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), target).backward()
        opt.step()
    return step


def sync(device):
    if device != "cpu":
        torch.phantom.synchronize()


def measure(modes, rounds):
    """{mode: {case: median seconds per call}} for modes of this process."""
    runs = {}
    for mode, device in modes.items():
        for case in CASES:
            fn = make_case(case, device)
            for _ in range(3):
                fn()  # warm up: first calls, allocator, trial runs
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            once = time.perf_counter() - start
            reps = max(1, int(0.005 / max(once, 1e-7)))
            runs[(mode, case)] = (fn, device, reps, [])
    for _ in range(rounds):
        for (mode, case), (fn, device, reps, samples) in runs.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            sync(device)
            samples.append((time.perf_counter() - start) / reps)
    result = {}
    for (mode, case), (_, _, _, samples) in runs.items():
        result.setdefault(mode, {})[case] = statistics.median(samples)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", help="also write the results as JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        assert not torch_phantom._C._has_kernel_view()
        print(json.dumps(measure({"cpu": "cpu", "copying": "phantom"}, args.rounds)))
        return
    assert torch_phantom._C._has_kernel_view(), "run it without PHANTOM_FAKE_NO_KERNEL_VIEW"
    env = dict(os.environ, PHANTOM_FAKE_NO_KERNEL_VIEW="1", PHANTOM_CPU_FALLBACK="silent")
    child = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds)],
                           env=env, capture_output=True, text=True, check=True)
    copying = json.loads(child.stdout.strip().splitlines()[-1])
    here = measure({"cpu": "cpu", "view": "phantom"}, args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"medians of {args.rounds} rounds")
    print(f"{'case':<8} {'cpu':>10} {'view':>10} {'copying':>10} "
          f"{'view/cpu':>9} {'copy/cpu':>9} {'copy/view':>9}")
    rows = {}
    for case in CASES:
        cpu, view = here["cpu"][case], here["view"][case]
        cpu_child, copy = copying["cpu"][case], copying["copying"][case]
        row = {"cpu_us": cpu * 1e6, "view_us": view * 1e6, "copying_us": copy * 1e6,
               "cpu_in_child_us": cpu_child * 1e6, "view_over_cpu": view / cpu,
               "copying_over_cpu": copy / cpu_child, "copying_over_view":
               (copy / cpu_child) / (view / cpu)}
        rows[case] = row
        print(f"{case:<8} {row['cpu_us']:>8.1f}us {row['view_us']:>8.1f}us "
              f"{row['copying_us']:>8.1f}us {row['view_over_cpu']:>9.2f} "
              f"{row['copying_over_cpu']:>9.2f} {row['copying_over_view']:>9.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rounds": args.rounds, "loadavg": os.getloadavg()[0],
                       "cases": rows}, f, indent=2)


if __name__ == "__main__":
    main()
