"""What sharing phantom memory between processes costs
(docs/multiprocessing.md, "Memory that can be shared").

Design. The fake driver keeps device memory in private, huge-page memory
and moves an allocation into shared memory (a memfd, which gets 4 KiB pages
where shmem THP is off) the first time it is exported. Three measurements
say what that choice costs and saves:

  gather     EmbeddingBag (sum) over a ROWS x 64 float table, 2,048 bags of
             32 rows, on the CPU, on phantom in private memory, and on
             phantom in shared memory (a second table, exported once). The
             three arms run in interleaved rounds in one process (the order
             rotates every round) and each phantom arm is given as a ratio to
             the CPU, per round, median over rounds. The shared arm is what
             every allocation would cost if all device memory were shared.
  export     The first export of a fresh table (its pages are copied into
             the memfd), in ms and GB/s; and one more send of a tensor
             already shared (the per-send cost: a handle, a counter slot, an
             interprocess event), in us.
  send       A spawned consumer receives N tensors of SIZE bytes over a
             torch.multiprocessing queue and sums each on its device; the
             producer sends either the phantom tensors (by handle) or
             tensor.cpu() (torch's CPU shared memory), and the time from the
             first put to the last answer is divided by N.

    python bench/bench_ipc.py                 # all three, ~1 min
    python bench/bench_ipc.py --only gather --rounds 15
"""

import argparse
import statistics
import time
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
import torch_phantom  # noqa: F401


def sync():
    torch.phantom.synchronize()


def read(path):
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return "?"


def bench_gather(args):
    rows, dim, bags, per_bag = args.rows, 64, 2048, 32
    gen = torch.Generator().manual_seed(0)
    table = torch.rand(rows, dim, generator=gen)
    indices = torch.randint(0, rows, (bags * per_bag,), generator=gen)
    offsets = torch.arange(0, bags * per_bag, per_bag)
    private = table.to("phantom")
    shared = table.to("phantom")
    ForkingPickler.dumps(shared)  # exported: now in shared memory
    arms = {
        "cpu": (table, indices, offsets),
        "private": (private, indices.to("phantom"), offsets.to("phantom")),
        "shared": (shared, indices.to("phantom"), offsets.to("phantom")),
    }
    reference = F.embedding_bag(indices, table, offsets, mode="sum")
    for name in ("private", "shared"):
        got = F.embedding_bag(arms[name][1], arms[name][0], arms[name][2], mode="sum")
        assert torch.allclose(got.cpu(), reference), name

    def sample(name):
        weight, idx, off = arms[name]
        start = time.perf_counter()
        for _ in range(args.inner):
            F.embedding_bag(idx, weight, off, mode="sum")
        if name != "cpu":
            sync()
        return (time.perf_counter() - start) / args.inner

    order = list(arms)
    for name in order:
        sample(name)  # warm up
    times = {name: [] for name in order}
    ratios = {"private": [], "shared": []}
    for round_ in range(args.rounds):
        rotated = order[round_ % 3:] + order[:round_ % 3]
        this = {name: sample(name) for name in rotated}
        for name in order:
            times[name].append(this[name])
        for name in ratios:
            ratios[name].append(this[name] / this["cpu"])
    print(f"gather: EmbeddingBag over {rows:,} x {dim} floats "
          f"({rows * dim * 4 >> 20} MiB), {bags} bags of {per_bag}, "
          f"{args.rounds} rounds of {args.inner}")
    for name in order:
        line = f"  {name:8s} {statistics.median(times[name]) * 1e3:8.2f} ms"
        if name in ratios:
            values = sorted(ratios[name])
            line += (f"   x CPU: median {statistics.median(values):.2f} "
                     f"(range {values[0]:.2f}-{values[-1]:.2f})")
        print(line)
    print(f"  (THP enabled: {read('/sys/kernel/mm/transparent_hugepage/enabled')}; "
          f"shmem: {read('/sys/kernel/mm/transparent_hugepage/shmem_enabled')})")


def bench_export(args):
    sizes = []
    for _ in range(3):
        fresh = torch.rand(args.rows, 64).to("phantom")
        sync()
        start = time.perf_counter()
        ForkingPickler.dumps(fresh)
        sizes.append(time.perf_counter() - start)
        del fresh
        torch.phantom.empty_cache()
    nbytes = args.rows * 64 * 4
    best = min(sizes)
    print(f"export: first export of {nbytes >> 20} MiB: {best * 1e3:.1f} ms "
          f"({nbytes / best / 1e9:.2f} GB/s), best of {len(sizes)}")
    small = torch.ones(1024, device="phantom")
    ForkingPickler.dumps(small)
    start = time.perf_counter()
    repeats = 200
    for _ in range(repeats):
        ForkingPickler.dumps(small)
    per_send = (time.perf_counter() - start) / repeats
    print(f"        one more send of a shared 4 KiB tensor: {per_send * 1e6:.0f} us")


def consumer(inbox, outbox, count):
    for _ in range(count):
        tensor = inbox.get(timeout=120)
        outbox.put(float(tensor.to("phantom").sum().item()))
        del tensor


def bench_send(args):
    ctx = mp.get_context("spawn")
    numel = args.size // 4
    for how in ("handle", "cpu"):
        inbox, outbox = ctx.Queue(), ctx.Queue()
        process = ctx.Process(target=consumer, args=(inbox, outbox, args.count + 1))
        process.start()
        tensors = [torch.full((numel,), float(i), device="phantom")
                   for i in range(args.count + 1)]
        sync()
        first = tensors[0] if how == "handle" else tensors[0].cpu()
        inbox.put(first)  # the consumer's start-up is not timed
        outbox.get(timeout=120)
        start = time.perf_counter()
        for tensor in tensors[1:]:
            inbox.put(tensor if how == "handle" else tensor.cpu())
        for i in range(1, args.count + 1):
            assert outbox.get(timeout=120) == float(i) * numel
        elapsed = (time.perf_counter() - start) / args.count
        process.join(60)
        print(f"send:   {args.count} tensors of {args.size >> 20} MiB by {how:6s}: "
              f"{elapsed * 1e3:.2f} ms each, put to answer")
        torch_phantom.reductions.ipc_collect()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=["gather", "export", "send"])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--inner", type=int, default=5)
    parser.add_argument("--size", type=int, default=16 << 20)
    parser.add_argument("--count", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.only:
        {"gather": bench_gather, "export": bench_export, "send": bench_send}[name](args)


if __name__ == "__main__":
    main()
