"""Waits: work whose result the host needs at once, phantom against the CPU.

    python bench/bench_waits.py               # the table, ~1 min
    python bench/bench_waits.py --quick       # a smoke run, ~10 s
    python bench/bench_waits.py --load 2      # with 2 busy processes running

Design. A wait is the host asking for a device result (`.item()`, a
comparison read as a bool, a synchronize): the queued work must reach the
worker, run, and its completion must reach the waiting thread again, two
thread hand-offs that the CPU does not make. These cases are made of
little else:

  item loop       `(z + 1).sum().item()` on 10 elements, per call: the
                  smallest round trip (two queued ops, one blocking copy).
  gradcheck LSTM  torch.autograd.gradcheck of a one-layer LSTM (3 inputs,
                  4 hidden, 3 steps, float64): hundreds of small ops, a
                  comparison read back after each numerical derivative.
  LBFGS step      one torch.optim.LBFGS step (20 iterations at most) of a
                  10x10 linear least-squares problem: a loss read back and
                  a few norms compared on the host per iteration.
  add chain       2,000 dependent `y = y + 1.0` on 1,000 elements, then one
                  synchronize: no wait inside, the cost of a queued small
                  op (docs/op-costs.md, "A queued small op").

Both devices run the same code in one process, timed by perf_harness's
time_case in interleaved rounds (the order of the arms alternates, medians,
the ratio of each block of rounds). `--load N` starts N busy Python
processes (`while True: pass`, not pinned: the scheduler places them) for
the run and stops them at the end; the output says so, with the load
average before and after, because a wait's cost on a loaded machine is
mostly who gets the core. Run with OMP_WAIT_POLICY=PASSIVE, as
bench/run_perf.sh does, so that neither device's OpenMP team spins.
"""

import argparse
import os
import pathlib
import subprocess
import sys
import time

import torch

import torch_phantom  # noqa: F401  (registers the device)

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from perf_harness import PHANTOM, header, record  # noqa: E402

CASES = ["item", "gradcheck", "lbfgs", "add_chain"]


def make_item(device):
    z = torch.rand(10, device=device)

    def run():
        return (z + 1).sum().item()
    return run


def make_gradcheck(device):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 4).double().to(device)
    x = torch.rand(3, 1, 3, dtype=torch.float64, device=device, requires_grad=True)

    def f(inp):
        out, _ = lstm(inp)
        return out

    def run():
        assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-4)
    return run


def make_lbfgs(device):
    torch.manual_seed(0)
    a = torch.rand(10, 10, device=device)
    b = torch.rand(10, 1, device=device)
    w0 = torch.zeros(10, 1, device=device)

    def run():
        w = w0.clone().requires_grad_(True)
        opt = torch.optim.LBFGS([w], max_iter=20)

        def closure():
            opt.zero_grad()
            loss = ((a @ w - b) ** 2).sum()
            loss.backward()
            return loss
        opt.step(closure)
    return run


def make_add_chain(device, ops=2000):
    y0 = torch.rand(1000, device=device)

    def run():
        y = y0
        for _ in range(ops):
            y = y + 1.0
        return y
    return run


MAKERS = {"item": ("item loop, per call", make_item),
          "gradcheck": ("gradcheck LSTM, per check", make_gradcheck),
          "lbfgs": ("LBFGS step, per step", make_lbfgs),
          "add_chain": ("add chain of 2000, per chain", make_add_chain)}


def start_load(n):
    """N busy processes, unpinned; returns them for stop_load."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(n)]


def stop_load(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    parser.add_argument("--only", nargs="+", choices=CASES, metavar="CASE",
                        help=f"run only these cases ({', '.join(CASES)})")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="start N busy processes (while True: pass, not pinned) "
                        "for the run")
    parser.add_argument("--reps", type=int, help="rounds per case, at least "
                        "(default 6, 2 with --quick)")
    args = parser.parse_args()
    # What perf_harness.time_case reads.
    args.reps = args.reps or (2 if args.quick else 6)
    args.max_reps = args.reps if args.quick else 40
    args.case_budget_s = 0 if args.quick else 4
    args.remake_every = 0
    args.min_sample_ms = 5 if args.quick else 20

    procs = start_load(args.load)
    try:
        if procs:
            time.sleep(2)  # let the load average see them
        load_before = os.getloadavg()
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"{os.cpu_count()} cores, OMP_WAIT_POLICY="
              f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
        print(f"load: {args.load} busy processes (python -c 'while True: pass', "
              f"not pinned); load average {load_before[0]:.2f}")
        header("waits: phantom against the CPU in one process (time per unit)")
        results = []
        for case in args.only or CASES:
            name, make = MAKERS[case]
            record(results, "waits", name, make, args)
        print(f"  load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        stop_load(procs)


if __name__ == "__main__":
    main()
