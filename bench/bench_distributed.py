"""pccl against Gloo on CPU tensors: all-reduce bandwidth and DDP training
steps, world 2, in the same processes.

Design. The script starts two ranks of itself on the loopback address (as
torchrun would, with one OpenMP thread per rank) and makes one group,
"cpu:gloo,phantom:pccl": the same call on a CPU tensor goes to Gloo, on a
phantom tensor to pccl (which moves it with Gloo: over the device memory in
place when the driver has a kernel view and the collective moves 64 KiB or
more, else staged through pinned memory). Each case is timed as bench_perf.py times its cases: both arms
warmed up, then interleaved rounds, each round one sample per arm, the
order flipping every round; a sample runs the work `inner` times back to
back (a phantom sample ends with torch.phantom.synchronize(), so queued
work is paid for), `inner` chosen by rank 0 so that one CPU sample lasts at
least --min-sample-ms and broadcast so both ranks run the same calls. Both
ranks meet at a CPU barrier before every sample. Rank 0's times are
reported: the median per call of each arm, and the ratio as the median
over blocks (one round per order) of the block's phantom/CPU time
(perf_harness.balanced_ratio), so a slow phase of the machine cancels out.

  allreduce  one all_reduce (sum) of float32 tensors, 4 KiB to 256 MiB.
             Bus bandwidth = 2 (n-1)/n x bytes / time, as nccl-tests
             reports it; the figure of merit is phantom's bus bandwidth
             over Gloo's (higher is better; target >= 0.8 from 1 MiB up).
  ddp        one training step (zero_grad, forward, backward with DDP's
             bucketed all-reduce, SGD step) of examples/train_models.py's
             MLP, Transformer and DLRM, and of a wider MLP whose gradients
             (12 MB) make the all-reduce matter; ratio = phantom step time
             over CPU step time (lower is better; target <= 1.1).
             Each arm's cost in CPU time is recorded too: the process's
             CPU time per step, by thread (host, autograd's device thread,
             stream workers, Gloo's and pccl's threads; from
             /proc/self/task/*/schedstat) and its context switches per step,
             so a step that is slow because the two ranks' threads share
             two cores shows as such. "dlrm_no_ddp" is the DLRM step
             without DDP, both ranks running it at once: what the two
             ranks cost each other without any collective.

Each rank is bound to cores of its own before it makes the group
(`--bind cores`, the default: torch_phantom.distributed.bind_to_cores, as
docs/distributed.md advises launching ranks, and as torchrun's
--numa-binding=exclusive binds CUDA ranks); both arms run in the bound
processes. `--bind none` leaves the ranks free to run on every core.

    python bench/bench_distributed.py                 # ~3 min
    python bench/bench_distributed.py --quick         # < 1 min, fewer sizes and rounds
    python bench/bench_distributed.py --only ddp --out /tmp/d.json
    python bench/bench_distributed.py --only ddp --models dlrm dlrm_no_ddp
    python bench/bench_distributed.py --only ddp --bind none

Results: a table on stdout and, with --out, a JSON file (the machine as
bench_perf.py records it) that bench/plot_distributed.py turns into
docs/img/distributed_*.png.
"""

import argparse
import datetime
import json
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4 << 10, 1 << 20, 16 << 20]
WORLD = 2
DDP_MODELS = ["mlp", "transformer", "dlrm", "wide_mlp", "dlrm_no_ddp"]


def thread_cpu_ns():
    """{thread name: nanoseconds on a CPU so far} over this process's
    threads (/proc/self/task/*/schedstat; names as `top -H` shows them),
    and the process's context switches so far (getrusage)."""
    times = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended, or no schedstat on this kernel
        times[name] = times.get(name, 0) + ns
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return times, usage.ru_nvcsw + usage.ru_nivcsw


class CpuAccount:
    """Sums, per arm, the CPU time each thread spent inside the timed
    samples (threads that started or ended meanwhile count from or to 0)."""

    def __init__(self):
        self.threads = {}
        self.switches = {}
        self.steps = {}

    def add(self, arm, before, after, steps):
        (t0, c0), (t1, c1) = before, after
        mine = self.threads.setdefault(arm, {})
        for name, ns in t1.items():
            mine[name] = mine.get(name, 0) + ns - t0.get(name, 0)
        self.switches[arm] = self.switches.get(arm, 0) + c1 - c0
        self.steps[arm] = self.steps.get(arm, 0) + steps

    def per_step(self, arm):
        n = max(1, self.steps.get(arm, 0))
        threads = {name: ns / n / 1e9 for name, ns in
                   sorted(self.threads.get(arm, {}).items(), key=lambda kv: -kv[1])
                   if ns / n >= 1e3}  # at least 1 us per step
        return {"cpu_time_s": sum(threads.values()), "threads_s": threads,
                "context_switches": self.switches.get(arm, 0) / n}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="+", choices=["allreduce", "ddp"])
    p.add_argument("--models", nargs="+", choices=DDP_MODELS, default=DDP_MODELS,
                   help="the ddp cases to run (default: all)")
    p.add_argument("--reps", type=int, default=8, help="rounds per case (even)")
    p.add_argument("--min-sample-ms", type=float, default=40.0)
    p.add_argument("--bind", choices=["cores", "none"], default="cores",
                   help="bind each rank to cores of its own (default) or not")
    p.add_argument("--out")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.reps = 4
    return args


# --- launcher ---------------------------------------------------------------


def launch(argv, args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(WORLD), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--rank", str(r)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(WORLD)]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"a rank failed: exit codes {codes}")


# --- ranks ------------------------------------------------------------------


def worker(args):
    import torch
    import torch.distributed as dist

    import torch_phantom  # noqa: F401

    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "examples"))
    from perf_harness import balanced_ratio, cpu_ticks, machine, steal_fraction

    rank = args.rank
    if args.bind == "cores":
        torch_phantom.distributed.bind_to_cores(rank, WORLD)
    device = torch.device("phantom", rank % torch.phantom.device_count())
    torch.phantom.set_device(device)
    dist.init_process_group("cpu:gloo,phantom:pccl", timeout=datetime.timedelta(minutes=10))
    results = []

    def agree(value):
        t = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(t, 0)
        return int(t.item())

    def time_case(arms, min_inner=1, account=None):
        """arms: {"cpu": fn, "phantom": fn}; fn runs the work once.
        account: a CpuAccount the timed rounds' CPU time is added to."""
        def sample(arm, k, count=False):
            dist.barrier(group=cpu_barrier)
            fn = arms[arm]
            before = thread_cpu_ns() if count else None
            started = time.perf_counter()
            for _ in range(k):
                fn()
            if arm == "phantom":
                torch.phantom.synchronize()
            elapsed = time.perf_counter() - started
            if count:
                account.add(arm, before, thread_cpu_ns(), k)
            return elapsed

        for arm in arms:  # warm up: caches, pinned blocks, first-call paths
            sample(arm, 2)
        inner = min_inner
        while True:
            t = sample("cpu", inner)
            # Rank 0 decides for both: ranks that decided apart would call
            # different collectives (one the barrier, the other agree()).
            if agree(t * 1e3 >= args.min_sample_ms or inner >= 4096):
                break
            inner *= 2
        samples = {arm: [] for arm in arms}
        orders = [("cpu", "phantom"), ("phantom", "cpu")]
        for r in range(args.reps):
            for arm in orders[r % 2]:
                samples[arm].append(sample(arm, inner, account is not None) / inner)
        return samples, inner

    cpu_barrier = dist.new_group(backend="gloo")

    if not args.only or "allreduce" in args.only:
        for size in (QUICK_SIZES if args.quick else SIZES):
            n = size // 4
            cpu_t = torch.ones(n)
            ph_t = torch.ones(n, device=device)
            ticks = cpu_ticks()
            samples, inner = time_case({"cpu": lambda: dist.all_reduce(cpu_t),
                                        "phantom": lambda: dist.all_reduce(ph_t)})
            steal = steal_fraction(ticks, cpu_ticks())
            c, p = statistics.median(samples["cpu"]), statistics.median(samples["phantom"])
            factor = 2 * (WORLD - 1) / WORLD * size
            time_ratio = balanced_ratio(samples["phantom"], samples["cpu"], 2)
            results.append({
                "benchmark": "allreduce", "bytes": size, "inner": inner,
                "cpu_s": c, "phantom_s": p,
                "cpu_busbw_gbs": factor / c / 1e9, "phantom_busbw_gbs": factor / p / 1e9,
                "bandwidth_ratio": 1 / time_ratio, "steal": steal,
            })
            del cpu_t, ph_t
            if rank == 0:
                r = results[-1]
                print(f"all_reduce {size / 1024:>9.0f} KiB  gloo/cpu {r['cpu_busbw_gbs']:6.3f} GB/s"
                      f"  pccl/phantom {r['phantom_busbw_gbs']:6.3f} GB/s"
                      f"  ratio {r['bandwidth_ratio']:.2f}  (x{inner})", flush=True)

    if not args.only or "ddp" in args.only:
        import train_models
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        def wide_mlp():
            return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(),
                                 nn.Linear(1024, 10))

        def wide_batches(steps, gen):
            return [train_models.Batch((torch.randn(64, 512, generator=gen),),
                                       torch.randint(0, 10, (64,), generator=gen))
                    for _ in range(steps)]

        specs = {
            "mlp": train_models.MODELS["mlp"],
            "transformer": train_models.MODELS["transformer"],
            "dlrm": train_models.MODELS["dlrm-sgd"],
            "wide_mlp": train_models.Spec(wide_mlp, wide_batches, nn.functional.cross_entropy,
                                          lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
        }
        specs["dlrm_no_ddp"] = specs["dlrm"]
        for name in args.models:
            spec = specs[name]
            arms = {}
            for arm, dev in (("cpu", torch.device("cpu")), ("phantom", device)):
                torch.manual_seed(0)
                model = spec.make_model().to(dev)
                if not name.endswith("_no_ddp"):
                    model = DDP(model)
                opt = spec.optimizer(list(model.parameters()))
                batch = spec.make_batches(1, torch.Generator().manual_seed(rank))[0]
                inputs = [t.to(dev) for t in batch.inputs]
                target = batch.target.to(dev)

                def step(model=model, opt=opt, inputs=inputs, target=target, loss=spec.loss):
                    opt.zero_grad()
                    loss(model(*inputs), target).backward()
                    opt.step()
                arms[arm] = step
            ticks = cpu_ticks()
            account = CpuAccount()
            samples, inner = time_case(arms, account=account)
            steal = steal_fraction(ticks, cpu_ticks())
            c, p = statistics.median(samples["cpu"]), statistics.median(samples["phantom"])
            cost = {arm: account.per_step(arm) for arm in arms}
            results.append({
                "benchmark": "ddp", "model": name, "inner": inner, "cpu_s": c, "phantom_s": p,
                "ratio": balanced_ratio(samples["phantom"], samples["cpu"], 2), "steal": steal,
                "cpu_arm_cost": cost["cpu"], "phantom_arm_cost": cost["phantom"],
                "load_average": os.getloadavg(),
            })
            if rank == 0:
                r = results[-1]
                cc, pc = cost["cpu"], cost["phantom"]
                print(f"ddp step {name:<12} cpu {c * 1e3:8.2f} ms  phantom {p * 1e3:8.2f} ms"
                      f"  ratio {r['ratio']:.2f}  (x{inner})", flush=True)
                print(f"    CPU time per step: cpu {cc['cpu_time_s'] * 1e3:.2f} ms"
                      f" ({cc['context_switches']:.0f} switches)  phantom"
                      f" {pc['cpu_time_s'] * 1e3:.2f} ms ({pc['context_switches']:.0f} switches)"
                      f"  ratio {pc['cpu_time_s'] / max(cc['cpu_time_s'], 1e-12):.2f}", flush=True)
                for arm in arms:
                    print(f"      {arm:8s}" + "  ".join(
                        f"{t} {v * 1e3:.2f}" for t, v in cost[arm]["threads_s"].items()),
                        flush=True)

    if rank == 0 and args.out:
        info = machine()
        info["load_average_at_end"] = os.getloadavg()
        info["world_size"] = WORLD
        report = {
            "benchmark": "bench/bench_distributed.py",
            "units": "seconds per call (median over rounds); allreduce: bandwidth_ratio = "
                     "phantom bus bandwidth / Gloo-on-CPU bus bandwidth (1 / the balanced "
                     "time ratio); ddp: ratio = phantom step time / CPU step time",
            "reps": args.reps, "min_sample_ms": args.min_sample_ms, "quick": args.quick,
            "bind": args.bind,
            "machine": info, "results": results,
        }
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    argv = sys.argv[1:]
    parsed = parse(argv)
    if parsed.rank is None:
        launch(argv, parsed)
    else:
        worker(parsed)
