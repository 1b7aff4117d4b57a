"""Which data path each collective takes, and that it leaves the caller's
tensors as NCCL would.

With a kernel view (the fake driver's default) pccl runs a collective
zero-copy: Gloo works on the device memory in place, through the view.
Without one (PHANTOM_FAKE_NO_KERNEL_VIEW=1, the remote driver, a discrete
device) it stages through pinned host memory. A collective moving less than
64 KiB always stages, and so does reduce (Gloo's reduce uses a non-root's
buffer as scratch), and a coalesced group that contains one; except that a
job moving at most 8 KiB whose calls have a local form (all_reduce,
broadcast, reduce, all_gather) is small: its data travels in its agreement
message, and each rank finishes it from the gathered copies. The zero-copy
checks move 1 MiB or more. Each check reports the job counts the collective added
(torch_phantom._c10d._data_path_counts) next to the driver's answer, and
checks the result on every rank.
"""

import datetime

from common import RANK, WORLD, Checks, assert_equal, device, dist, torch

import torch_phantom
from torch_phantom import _c10d

dist.init_process_group("pccl", timeout=datetime.timedelta(seconds=60))
N = 1 << 18  # elements: 1 MiB of float32
DEV = device()
checks = Checks()
paths = {}


def ran(name, fn):
    """Runs fn (collectives on DEV) and records the jobs it added per path."""
    torch.phantom.synchronize(DEV)
    before = _c10d._data_path_counts()
    fn()
    torch.phantom.synchronize(DEV)
    after = _c10d._data_path_counts()
    paths[name] = {k: after[k] - before[k] for k in after}


def all_reduce():
    t = torch.full((3_000_001,), float(RANK + 1), device=DEV)  # 12 MB: once chunked
    ran("all_reduce", lambda: dist.all_reduce(t))
    assert_equal(t, torch.full((3_000_001,), float(WORLD * (WORLD + 1) // 2)), "all_reduce")


def small_all_reduce():
    t = torch.full((1000,), float(RANK + 1), device=DEV)
    ran("small_all_reduce", lambda: dist.all_reduce(t))
    assert_equal(t, torch.full((1000,), float(WORLD * (WORLD + 1) // 2)), "small all_reduce")


def broadcast():
    t = torch.full((N,), float(RANK), device=DEV)
    ran("broadcast", lambda: dist.broadcast(t, src=WORLD - 1))
    assert_equal(t, torch.full((N,), float(WORLD - 1)), "broadcast")


def all_gather_into_tensor():
    mine = torch.full((N,), RANK, dtype=torch.int32, device=DEV)
    out = torch.empty(N * WORLD, dtype=torch.int32, device=DEV)
    ran("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(out, mine))
    assert_equal(out, torch.arange(WORLD, dtype=torch.int32).repeat_interleave(N), "gathered")
    assert_equal(mine, torch.full((N,), RANK, dtype=torch.int32), "all_gather's input")


def reduce_scatter_tensor():
    ins = torch.arange(N * WORLD, dtype=torch.float32, device=DEV) + RANK
    expected_in = ins.cpu()
    out = torch.empty(N, device=DEV)
    ran("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(out, ins))
    rows = torch.arange(N * WORLD, dtype=torch.float32).view(WORLD, N)[RANK]
    assert_equal(out, rows * WORLD + sum(range(WORLD)), "reduce_scatter_tensor")
    assert_equal(ins, expected_in, "reduce_scatter's input")


def all_to_all_single():
    ins = torch.arange(WORLD * N, dtype=torch.float64, device=DEV) + 10 * N * RANK
    out = torch.empty(WORLD * N, dtype=torch.float64, device=DEV)
    ran("all_to_all_single", lambda: dist.all_to_all_single(out, ins))
    expected = torch.cat([torch.arange(RANK * N, RANK * N + N, dtype=torch.float64) + 10 * N * p
                          for p in range(WORLD)])
    assert_equal(out, expected, "all_to_all_single")


def send_recv():
    t = torch.full((N,), float(RANK), device=DEV)
    peer = (RANK + 1) % WORLD
    source = (RANK - 1) % WORLD
    got = torch.empty(N, device=DEV)
    ran("send_recv", lambda: dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, got, source)])[-1].wait())
    assert_equal(got, torch.full((N,), float(source)), "received")


def reduce():
    t = torch.full((N,), float(RANK + 1), device=DEV)
    ran("reduce", lambda: dist.reduce(t, dst=0))
    # The root gets the sum; the others keep their input (NCCL's rule),
    # which Gloo working in place on their buffer would break.
    expected = WORLD * (WORLD + 1) // 2 if RANK == 0 else RANK + 1
    assert_equal(t, torch.full((N,), float(expected)), "reduce")


def coalesced_with_reduce():
    a = torch.ones(N, device=DEV)
    b = torch.full((N,), float(RANK + 1), device=DEV)

    def both():
        with dist._coalescing_manager(device=DEV, async_ops=True) as cm:
            dist.all_reduce(a)
            dist.reduce(b, dst=0, async_op=True)
        cm.wait()
    ran("coalesced_with_reduce", both)
    assert_equal(a, torch.full((N,), float(WORLD)), "coalesced all_reduce")
    expected = WORLD * (WORLD + 1) // 2 if RANK == 0 else RANK + 1
    assert_equal(b, torch.full((N,), float(expected)), "coalesced reduce")


# --- small jobs (at most 8 KiB): the data travels in the agreement message ---


def small_all_reduce_max():
    t = torch.tensor([RANK, -RANK, 7, 1 << 40], dtype=torch.int64, device=DEV)
    ran("small_all_reduce_max", lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX))
    assert_equal(t, torch.tensor([WORLD - 1, 0, 7, 1 << 40]), "small all_reduce max")


def all_reduce_9KiB():
    # Just over the limit: staged.
    t = torch.full((2304,), float(RANK + 1), device=DEV)
    ran("all_reduce_9KiB", lambda: dist.all_reduce(t))
    assert_equal(t, torch.full((2304,), float(WORLD * (WORLD + 1) // 2)), "9 KiB all_reduce")


def small_broadcast():
    t = torch.arange(100, dtype=torch.int16, device=DEV) * (RANK + 1)
    ran("small_broadcast", lambda: dist.broadcast(t, src=WORLD - 1))
    assert_equal(t, torch.arange(100, dtype=torch.int16) * WORLD, "small broadcast")


def small_all_gather():
    mine = torch.full((5,), RANK + 1, dtype=torch.uint8, device=DEV)
    outs = [torch.empty(5, dtype=torch.uint8, device=DEV) for _ in range(WORLD)]
    ran("small_all_gather", lambda: dist.all_gather(outs, mine))
    for r, out in enumerate(outs):
        assert_equal(out, torch.full((5,), r + 1, dtype=torch.uint8), f"gathered from rank {r}")


def small_reduce():
    t = torch.full((10,), float(RANK + 1), dtype=torch.float64, device=DEV)
    ran("small_reduce", lambda: dist.reduce(t, dst=WORLD - 1, op=dist.ReduceOp.PRODUCT))
    expected = float(torch.arange(1, WORLD + 1).prod()) if RANK == WORLD - 1 else RANK + 1
    assert_equal(t, torch.full((10,), expected, dtype=torch.float64), "small reduce")


def small_coalesced():
    a = torch.ones(3, device=DEV)
    b = torch.full((4,), RANK + 1, dtype=torch.int32, device=DEV)

    def both():
        with dist._coalescing_manager(device=DEV, async_ops=True) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        cm.wait()
    ran("small_coalesced", both)
    assert_equal(a, torch.full((3,), float(WORLD)), "coalesced small all_reduce")
    assert_equal(b, torch.full((4,), WORLD * (WORLD + 1) // 2, dtype=torch.int32), "coalesced int32")


def small_reduce_scatter():
    # No local form: staged however small.
    ins = torch.arange(2 * WORLD, dtype=torch.float32, device=DEV) + RANK
    out = torch.empty(2, device=DEV)
    ran("small_reduce_scatter", lambda: dist.reduce_scatter_tensor(out, ins))
    rows = torch.arange(2 * WORLD, dtype=torch.float32).view(WORLD, 2)[RANK]
    assert_equal(out, rows * WORLD + sum(range(WORLD)), "small reduce_scatter")


def small_all_to_all():
    ins = torch.arange(WORLD, dtype=torch.float32, device=DEV) + 10 * RANK
    out = torch.empty(WORLD, device=DEV)
    ran("small_all_to_all", lambda: dist.all_to_all_single(out, ins))
    assert_equal(out, torch.arange(WORLD, dtype=torch.float32) * 10 + RANK, "small all_to_all")


def mixed_sequence():
    # Small jobs between larger ones, all in flight at once: the agreement
    # messages still go out in call order (a larger job's waits for the
    # small one before it), whichever thread sends each.
    a = torch.full((10,), float(RANK + 1), device=DEV)
    big = torch.full((N,), float(RANK + 1), device=DEV)
    r = torch.full((6,), float(RANK + 2), device=DEV)
    b = torch.full((7,), float(RANK), device=DEV)
    big2 = torch.full((N,), float(RANK), device=DEV)

    def issue():
        works = [dist.all_reduce(a, async_op=True), dist.all_reduce(big, async_op=True),
                 dist.reduce(r, dst=0, async_op=True), dist.broadcast(b, src=WORLD - 1, async_op=True),
                 dist.broadcast(big2, src=0, async_op=True)]
        for w in works:
            w.wait()
    ran("mixed_sequence", issue)
    total = float(WORLD * (WORLD + 1) // 2)
    assert_equal(a, torch.full((10,), total), "small all_reduce")
    assert_equal(big, torch.full((N,), total), "large all_reduce")
    expected_r = float(sum(range(2, WORLD + 2))) if RANK == 0 else float(RANK + 2)
    assert_equal(r, torch.full((6,), expected_r), "small reduce")
    assert_equal(b, torch.full((7,), float(WORLD - 1)), "small broadcast")
    assert_equal(big2, torch.zeros(N), "large broadcast")


def dependent_sequence():
    # Each collective reads what the one before it wrote, all in flight at
    # once: a job the communicator's thread runs (reduce) must not read its
    # buffer before a small job run in its stream task has written it.
    t = torch.full((10,), float(RANK + 1), device=DEV)
    big = torch.full((N,), float(RANK + 1), device=DEV)

    def issue():
        works = [dist.all_reduce(t, async_op=True), dist.reduce(t, dst=0, async_op=True),
                 dist.all_reduce(big[:10], async_op=True), dist.reduce(big, dst=0, async_op=True)]
        for w in works:
            w.wait()
    ran("dependent_sequence", issue)
    total = float(WORLD * (WORLD + 1) // 2)
    root = RANK == 0
    assert_equal(t, torch.full((10,), total * WORLD if root else total), "all_reduce, then reduce")
    expected = torch.full((N,), total if root else float(RANK + 1))
    expected[:10] = total * WORLD if root else total
    assert_equal(big, expected, "a slice's all_reduce, then the whole reduced")


def barrier():
    ran("barrier", lambda: dist.barrier())


for check in (all_reduce, small_all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor,
              all_to_all_single, send_recv, reduce, coalesced_with_reduce, small_all_reduce_max,
              all_reduce_9KiB, small_broadcast, small_all_gather, small_reduce, small_coalesced,
              small_reduce_scatter, small_all_to_all, mixed_sequence, dependent_sequence, barrier):
    checks.run(check.__name__, check)

checks.report(paths=paths, kernel_view=torch_phantom._C._has_kernel_view())
dist.destroy_process_group()
