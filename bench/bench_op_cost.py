"""The CPU time of one small op, phantom beside the CPU, split by thread.

Design. On phantom an op costs CPU time twice: the host thread checks,
allocates and queues it, and the stream's worker (`ph-stream-d0`) runs the
CPU kernel over the kernel view of device memory. When no core is spare
(two DDP ranks on two cores, a loaded machine) that CPU time is step time,
so the figure of merit is the process's CPU time per call, not the wall
time. Each case here runs one op in a loop of --calls calls on tensors of
--numel floats, on the CPU and on phantom in one process, the order
alternating by round, then (phantom) synchronizes, and reads:

  process   the process's CPU time (time.process_time), all threads;
  host      the calling thread's (time.thread_time);
  worker    the streams' workers' (threads named ph-stream-*, read through
            each thread's CPU-time clock, clock_gettime of its tid);

each divided by the calls, in microseconds; the table gives each arm's
median over --rounds rounds and the phantom/CPU ratio of the process time.
`--one-core` pins the process (and so every thread it starts: the worker,
OpenMP's) to CPU 1 before torch is imported, as when two ranks share two
cores; without it the worker has the other core to itself if the machine
is idle. Other processes' load changes both arms alike but not evenly:
the load average is printed with the table.

    python bench/bench_op_cost.py                 # ~20 s
    python bench/bench_op_cost.py --one-core
    python bench/bench_op_cost.py --only add_ zero_ --calls 50000 --rounds 9
"""
import argparse
import json
import os
import statistics
import sys
import time

CASES = ["add_", "zero_", "copy_", "add_out", "relu"]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--one-core", action="store_true",
                        help="pin the process to CPU 1 (os.sched_setaffinity)")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--numel", type=int, default=128)
    parser.add_argument("--only", nargs="+", choices=CASES, default=CASES)
    parser.add_argument("--json", help="also write the medians here")
    return parser.parse_args()


def thread_clock(tid):
    # Linux's CPU-time clock of another thread: MAKE_THREAD_CPUCLOCK(tid,
    # CPUCLOCK_SCHED) = (~tid << 3) | CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED.
    return ((~tid) << 3) | 4 | 2


def worker_tids():
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("ph-stream-"):
                    tids.append(int(tid))
        except OSError:
            pass  # the thread exited
    return tids


def workers_time(tids):
    total = 0.0
    for tid in tids:
        try:
            total += time.clock_gettime(thread_clock(tid))
        except OSError:
            pass
    return total


def make_case(torch, name, device, numel):
    x = torch.rand(numel, device=device)
    y = torch.rand(numel, device=device)
    a = torch.rand(numel, device=device)
    b = torch.rand(numel, device=device)
    c = torch.empty(numel, device=device)
    if name == "add_":
        return lambda: y.add_(1.0)
    if name == "zero_":
        return lambda: y.zero_()
    if name == "copy_":
        return lambda: y.copy_(x)
    if name == "add_out":
        return lambda: torch.add(a, b, out=c)
    if name == "relu":
        return lambda: torch.relu(x)
    raise ValueError(name)


def measure(torch, name, device, args):
    op = make_case(torch, name, device, args.numel)
    sync = torch.phantom.synchronize if device == "phantom" else (lambda: None)
    for _ in range(1000):  # warm-up: admissions, the allocator's cache
        op()
    sync()
    tids = worker_tids() if device == "phantom" else []
    calls = args.calls
    p0, h0, w0 = time.process_time(), time.thread_time(), workers_time(tids)
    for _ in range(calls):
        op()
    sync()
    p1, h1, w1 = time.process_time(), time.thread_time(), workers_time(tids)
    scale = 1e6 / calls
    return {"process": (p1 - p0) * scale, "host": (h1 - h0) * scale,
            "worker": (w1 - w0) * scale}


def main():
    args = parse_args()
    if args.one_core:
        os.sched_setaffinity(0, {1})  # before torch starts any thread
    import torch
    import torch_phantom  # noqa: F401  (autoloaded too)

    torch.phantom.init() if hasattr(torch.phantom, "init") else None
    results = {name: {"cpu": [], "phantom": []} for name in args.only}
    for r in range(args.rounds):
        order = ["cpu", "phantom"] if r % 2 == 0 else ["phantom", "cpu"]
        for name in args.only:
            for device in order:
                results[name][device].append(measure(torch, name, device, args))

    def median(name, device, key):
        return statistics.median(m[key] for m in results[name][device])

    load = os.getloadavg()
    print(f"{args.calls} calls x {args.rounds} rounds on {args.numel} floats, "
          f"{'pinned to CPU 1' if args.one_core else 'free cores'}, "
          f"torch threads {torch.get_num_threads()}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'op':10} {'cpu us':>7} {'phantom':>8} {'host':>6} {'worker':>7} "
          f"{'ratio':>6}   (medians; phantom = process, all threads)")
    summary = {}
    for name in args.only:
        cpu = median(name, "cpu", "process")
        ph = median(name, "phantom", "process")
        host = median(name, "phantom", "host")
        worker = median(name, "phantom", "worker")
        summary[name] = {"cpu": cpu, "phantom": ph, "host": host,
                         "worker": worker, "ratio": ph / cpu}
        print(f"{name:10} {cpu:7.2f} {ph:8.2f} {host:6.2f} {worker:7.2f} "
              f"{ph / cpu:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "loadavg": load,
                       "results": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
