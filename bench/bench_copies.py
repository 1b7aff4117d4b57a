"""Host<->device copy bandwidth on phantom, against the CPU's best copy.

Measures, for each size, in one process:

  cpu_copy      torch.Tensor.copy_ between two CPU tensors, with torch's
                default intra-op threads (two on the development VM): the
                yardstick, the fastest copy a CPU user gets from torch
  memcpy        numpy.copyto between two pageable CPU buffers (one
                thread; glibc's memcpy): shown for context
  h2d_pinned    phantom.copy_(pinned, non_blocking=True), then synchronize
  d2h_pinned    pinned.copy_(phantom, non_blocking=True), then synchronize
  h2d_pageable  phantom.copy_(pageable)            (synchronous)
  d2h_pageable  pageable.copy_(phantom)            (synchronous)
  d2d           phantom.copy_(phantom), same device, then synchronize

The fake's copy engine moves a large copy on two threads (docs/pinned-
memory.md, "Copy speed"), so it is judged against a copy that may use two
threads as well: cpu_copy, not the one-thread memcpy. Every case is timed
in interleaved rounds (one sample of each case per round) so that drift
of the machine hits all cases alike; each sample starts after a pause
(perf_harness.SETTLE_S: the other cases' threads, OpenMP's or phantom's
stream worker, have stopped spinning) and copies the buffer `inner` times
back to back, enough to last a few milliseconds. Medians are reported as
GB/s (1e9 bytes/s) and, for the phantom cases, as the time ratio to
cpu_copy (lower is better; 1.0 = as fast as the CPU's copy); a second
table gives the best sample of each case, which other load on the machine
disturbs least. The load average is printed and saved.

Run it with OpenMP's default wait policy (bench_perf.py runs it in a
child process without OMP_WAIT_POLICY): under PASSIVE every CPU copy_
first wakes an OpenMP thread, which is not the CPU at its best.

    python bench/bench_copies.py                     # 1 MiB .. 256 MiB
    python bench/bench_copies.py --sizes 1 16 256 --rounds 9
    python bench/bench_copies.py --out bench/results/copies.json

Run it with the device built in: PYTHONPATH=<build>/python, or installed.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
import torch_phantom  # noqa: F401  (registers the device)

from perf_harness import SETTLE_S

MiB = 1 << 20

CASES = [
    "cpu_copy",
    "memcpy",
    "h2d_pinned",
    "d2h_pinned",
    "h2d_pageable",
    "d2h_pageable",
    "d2d",
]
BASELINE = "cpu_copy"
CONTEXT = "memcpy"  # a one-thread copy, shown beside the yardstick
# The phantom cases the copy target judges; the others are context.
JUDGED = ("h2d_pinned", "d2h_pinned")


def make_buffers(nbytes, device):
    n = nbytes  # uint8 elements
    buffers = {
        "src_np": np.ones(n, dtype=np.uint8),
        "dst_np": np.zeros(n, dtype=np.uint8),
        "src_cpu": torch.ones(n, dtype=torch.uint8),
        "dst_cpu": torch.zeros(n, dtype=torch.uint8),
        "pinned": torch.ones(n, dtype=torch.uint8).pin_memory(),
        "dev": torch.ones(n, dtype=torch.uint8, device=device),
        "dev2": torch.zeros(n, dtype=torch.uint8, device=device),
    }
    assert buffers["pinned"].is_pinned()
    return buffers


def runner(case, b):
    sync = torch.phantom.synchronize
    if case == "memcpy":
        src, dst = b["src_np"], b["dst_np"]
        return lambda k: [np.copyto(dst, src) for _ in range(k)]
    if case == "cpu_copy":
        src, dst = b["src_cpu"], b["dst_cpu"]
        return lambda k: [dst.copy_(src) for _ in range(k)]
    if case == "h2d_pinned":
        src, dst = b["pinned"], b["dev"]

        def run(k):
            for _ in range(k):
                dst.copy_(src, non_blocking=True)
            sync()
        return run
    if case == "d2h_pinned":
        src, dst = b["dev"], b["pinned"]

        def run(k):
            for _ in range(k):
                dst.copy_(src, non_blocking=True)
            sync()
        return run
    if case == "h2d_pageable":
        src, dst = b["src_cpu"], b["dev"]
        return lambda k: [dst.copy_(src) for _ in range(k)]
    if case == "d2h_pageable":
        src, dst = b["dev"], b["dst_cpu"]
        return lambda k: [dst.copy_(src) for _ in range(k)]
    if case == "d2d":
        src, dst = b["dev"], b["dev2"]

        def run(k):
            for _ in range(k):
                dst.copy_(src)
            sync()
        return run
    raise ValueError(case)


def bench_size(nbytes, rounds, min_sample_s, device, cases):
    b = make_buffers(nbytes, device)
    runs = {case: runner(case, b) for case in cases}
    # Warm up (first touch of every page, caches, worker threads) and pick
    # `inner` so that one sample of the baseline lasts >= min_sample_s.
    for run in runs.values():
        run(2)
    torch.phantom.synchronize()
    start = time.perf_counter()
    runs[BASELINE](3)
    per_copy = (time.perf_counter() - start) / 3
    inner = max(1, int(min_sample_s / max(per_copy, 1e-7)))
    samples = {case: [] for case in cases}
    for _ in range(rounds):
        for case in cases:  # interleaved
            torch.phantom.synchronize()
            time.sleep(SETTLE_S)  # the other cases' threads stop spinning
            start = time.perf_counter()
            runs[case](inner)
            samples[case].append((time.perf_counter() - start) / inner)
    del b
    return inner, samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                        help="sizes in MiB (default: powers of two, 1..256)")
    parser.add_argument("--rounds", type=int, default=11,
                        help="interleaved samples per case (default: 11)")
    parser.add_argument("--min-sample-ms", type=float, default=20.0,
                        help="minimum duration of one sample of the baseline")
    parser.add_argument("--device", default="phantom:0")
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    cases = list(args.cases)
    if BASELINE not in cases:
        cases.insert(0, BASELINE)
    device = torch.device(args.device)
    results = []
    header = f"{'size':>8}  " + "  ".join(f"{c:>14}" for c in cases)
    print(f"GB/s, median of {args.rounds} interleaved samples "
          f"(time / {BASELINE}'s time in parentheses: lower is faster)")
    print(header)
    for mib in args.sizes:
        nbytes = mib * MiB
        inner, samples = bench_size(nbytes, args.rounds,
                                    args.min_sample_ms / 1e3, device, cases)
        medians = {c: statistics.median(s) for c, s in samples.items()}
        base = medians[BASELINE]
        row = {"size_mib": mib, "bytes": nbytes, "inner": inner, "cases": {}}
        cells = []
        for c in cases:
            gbps = nbytes / medians[c] / 1e9
            ratio = medians[c] / base
            best = min(samples[c])
            row["cases"][c] = {
                "median_s": medians[c],
                "gb_per_s": gbps,
                # Time over the yardstick's time (lower is faster).
                "time_ratio_to_cpu_copy": ratio,
                # Best sample: least disturbed by other load on the machine.
                "best_gb_per_s": nbytes / best / 1e9,
                "best_time_ratio_to_cpu_copy": best / min(samples[BASELINE]),
                "samples_s": samples[c],
            }
            cells.append(f"{gbps:7.2f}" + ("" if c == BASELINE
                                           else f" ({ratio:.2f})"))
        results.append(row)
        print(f"{mib:>5}MiB  " + "  ".join(f"{c:>14}" for c in cells),
              flush=True)

    print(f"\nGB/s, best of {args.rounds} samples (time ratio of bests)")
    print(header)
    for row in results:
        cells = []
        for c in cases:
            r = row["cases"][c]
            cells.append(f"{r['best_gb_per_s']:7.2f}" + (
                "" if c == BASELINE else f" ({r['best_time_ratio_to_cpu_copy']:.2f})"))
        print(f"{row['size_mib']:>5}MiB  " + "  ".join(f"{c:>14}" for c in cells))
    print(f"load average: {os.getloadavg()}")

    if args.out:
        report = {
            "benchmark": "bench/bench_copies.py",
            "baseline": BASELINE,
            "context": CONTEXT,
            "judged": list(JUDGED),
            "units": "GB/s = 1e9 bytes per second; time ratio = case time / "
                     "cpu_copy time (lower is faster)",
            "rounds": args.rounds,
            "machine": {
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "processor": platform.processor(),
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "numpy": np.__version__,
                "torch_threads": torch.get_num_threads(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            },
            "load_average_at_end": os.getloadavg(),
            "results": results,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
