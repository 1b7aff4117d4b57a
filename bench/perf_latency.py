"""The performance suite's latency benchmarks: what a user feels before any
throughput benchmark does (bench/bench_perf.py runs them as `waits` and
`first_op`).

Design. Both reuse a standalone script's cases, so the suite and the
script measure the same thing:

  waits     bench_waits.py's cases in the suite's process, timed by
            perf_harness like every other case: the item loop, a gradcheck
            of a small LSTM and an LBFGS step (benchmark "waits", judged
            <= 2 on a quiet machine), the add chain of 2,000 dependent
            `y = y + 1.0` ("add_chain", judged <= 1.2), then the three wait
            cases again with one busy process running ("waits_loaded",
            judged <= 3; the add chain under load is context). The busy
            process is `python -c "while True: pass"`, unpinned, started
            two seconds before the first loaded case and killed after the
            last; each loaded row records the load average it ran at.
  first_op  bench_first_op.py's cases, each a short program run in fresh
            processes on the CPU and on phantom alternately; a row's
            judged figure is phantom's extra milliseconds over the CPU's
            (`extra_ms`, judged <= 50), its ratio is context.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import bench_first_op
import bench_waits
from perf_harness import header, record

WAIT_CASES = ("item", "gradcheck", "lbfgs")


def bench_waits_(args, results):
    header("waits: work whose result the host needs at once (time per unit)")
    for case in bench_waits.CASES:
        name, make = bench_waits.MAKERS[case]
        record(results, "add_chain" if case == "add_chain" else "waits", name, make, args)
    load = bench_waits.start_load(1)
    try:
        time.sleep(2)  # let the load average see it
        header("waits with one busy process running (python -c 'while True: pass')")
        for case in bench_waits.CASES:
            name, make = bench_waits.MAKERS[case]
            extra = {"load_average": os.getloadavg()[0], "busy_processes": 1}
            if case not in WAIT_CASES:
                extra["context"] = True  # the issue judges the chain on a quiet machine
            record(results, "waits_loaded", f"{name}, +1 busy process", make, args,
                   extra=extra)
    finally:
        bench_waits.stop_load(load)


def bench_first_op_(args, results):
    rounds = 1 if args.quick else 3
    print(f"\n== first operation of a fresh process ({rounds} rounds of child "
          f"processes per device and case)")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "first_op.json")
        subprocess.run([sys.executable, bench_first_op.__file__, "--rounds", str(rounds),
                        "--out", out], check=True)
        with open(out) as f:
            cases = json.load(f)
    for name, case in cases.items():
        results.append({
            "benchmark": "first_op", "case": name, "size": None,
            "cpu_ms": case["cpu_ms"], "phantom_ms": case["phantom_ms"],
            "extra_ms": case["extra_ms"], "ratio": case["phantom_ms"] / case["cpu_ms"],
            "phantom_imports": case["phantom_imports"], "cpu_imports": case["cpu_imports"],
            "phantom_only_packages": case["phantom_only_packages"],
            "imported_before": case["imported_before"], "child_rounds": rounds,
        })
    extras = [r["extra_ms"] for r in results if r["benchmark"] == "first_op"]
    if extras:
        print(f"  phantom's extra ms per case: median {statistics.median(extras):.1f}, "
              f"largest {max(extras):.1f}")
