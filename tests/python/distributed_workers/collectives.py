"""Every collective on phantom tensors against Gloo on the same CPU tensors.

The group is "cpu:gloo,phantom:pccl": each check runs the collective once
on CPU tensors (Gloo, the reference) and once on copies of them on this
rank's phantom device (pccl), and requires the same bits. Inputs are small
integers (as floats for the float dtypes), so a reduction's result does
not depend on the order in which ranks' values are added, and chunked
(pipelined) all-reduces are compared exactly too.
"""

import datetime
import functools

from common import RANK, WORLD, Checks, assert_equal, device, dist, raises, torch

from torch_phantom.testing import faults

FULL = __import__("os").environ.get("DISTRIBUTED_FULL") == "1"

dist.init_process_group(
    "cpu:gloo,phantom:pccl", timeout=datetime.timedelta(seconds=60)
)
DEV = device()
checks = Checks()

REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]


def supported(dtype, op):
    """What Gloo reduces (and so pccl): checked against Gloo itself below."""
    if dtype in FLOATS:
        return op in ("sum", "avg", "product", "min", "max")
    if dtype in INTEGERS:
        return op != "avg"
    return False


def values(n, dtype, seed, low=-3, high=4, rank=RANK):
    """Rank `rank`'s input: small integers, the same on every run."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype in (torch.uint8, torch.bool):
        low = 0
    if dtype == torch.bool:
        high = 2
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def both(cpu_tensor):
    return cpu_tensor, cpu_tensor.to(DEV)


# --- all_reduce: every dtype x op -----------------------------------------


def check_all_reduce(dtype, op, n):
    low, high = (1, 3) if op == "product" else (-3, 4)
    cpu, ph = both(values(n, dtype, seed=n, low=low, high=high))
    dist.all_reduce(cpu, op=REDUCE_OPS[op])
    dist.all_reduce(ph, op=REDUCE_OPS[op])
    assert_equal(ph, cpu, f"all_reduce {dtype} {op}")


for dtype in FLOATS + INTEGERS + [torch.int16, torch.float8_e4m3fn]:
    for op in REDUCE_OPS:
        name = f"{str(dtype)[6:]}-{op}"
        if supported(dtype, op):
            checks.run(f"all_reduce[{name}]", functools.partial(check_all_reduce, dtype, op, 13))
        else:
            checks.run(
                f"all_reduce_refused[{name}]",
                lambda d=dtype, o=op: raises(
                    lambda: dist.all_reduce(torch.ones(4, device=DEV).to(d), op=REDUCE_OPS[o]),
                    "cannot reduce",
                ),
            )


def check_complex():
    # torch.distributed views a complex tensor as real pairs for sum.
    cpu, ph = both(torch.complex(values(9, torch.float32, 3), values(9, torch.float32, 4)))
    dist.all_reduce(cpu)
    dist.all_reduce(ph)
    assert_equal(ph, cpu, "complex all_reduce")


checks.run("all_reduce[complex64-sum]", check_complex)


def check_float_sum_in_gloos_order(dtype, op):
    # Values whose sum depends on the order of the additions: a small job
    # (at most 8 KiB, reduced by each rank from the gathered copies) must
    # still give Gloo's bits, so at world 3 a float sum or product stages
    # (Gloo adds in its ring's order) while at world 2 it is small.
    from torch_phantom import _c10d

    g = torch.Generator().manual_seed(99 + RANK)
    cpu = torch.randn(256, generator=g).mul(10.0 ** torch.randint(-4, 5, (256,), generator=g))
    cpu = cpu.to(dtype)
    ph = cpu.to(DEV)
    dist.all_reduce(cpu, op=REDUCE_OPS[op])
    torch.phantom.synchronize(DEV)
    before = _c10d._data_path_counts()
    dist.all_reduce(ph, op=REDUCE_OPS[op])
    torch.phantom.synchronize(DEV)
    small = _c10d._data_path_counts()["small"] - before["small"]
    assert_equal(ph, cpu, f"{dtype} {op} of mixed magnitudes")
    assert small == (1 if WORLD == 2 else 0), f"small jobs: {small}"


for dtype, op in [(torch.float32, "sum"), (torch.bfloat16, "avg"), (torch.float64, "product")]:
    checks.run(f"all_reduce[order-{str(dtype)[6:]}-{op}]",
               functools.partial(check_float_sum_in_gloos_order, dtype, op))
checks.run("all_reduce[empty]", lambda: check_all_reduce(torch.float32, "sum", 0))
# 12 MB: the chunked, pipelined path; an odd count so the last chunk is short.
checks.run("all_reduce[chunked-sum]", lambda: check_all_reduce(torch.float32, "sum", 3_000_001))
checks.run("all_reduce[chunked-avg-bf16]", lambda: check_all_reduce(torch.bfloat16, "avg", 5_000_003))
checks.run("all_reduce[chunked-max-int64]", lambda: check_all_reduce(torch.int64, "max", 700_001))
if FULL:
    checks.run("all_reduce[64MiB]", lambda: check_all_reduce(torch.float32, "sum", 16 << 20))


# --- broadcast, reduce ----------------------------------------------------


def check_broadcast(root, n, dtype=torch.float32):
    cpu, ph = both(values(n, dtype, seed=7))
    dist.broadcast(ph, src=root)
    if dtype == torch.int16:  # Gloo does not broadcast int16; pccl moves bytes
        cpu = values(n, dtype, seed=7, rank=root)
    else:
        dist.broadcast(cpu, src=root)
    assert_equal(ph, cpu, f"broadcast from {root}")


for root in range(WORLD):
    checks.run(f"broadcast[root{root}]", functools.partial(check_broadcast, root, 17))
checks.run("broadcast[chunked-int16]", lambda: check_broadcast(WORLD - 1, 3_000_001, torch.int16))


def check_reduce(root, op):
    cpu, ph = both(values(11, torch.float32, seed=8))
    before = ph.cpu()
    dist.reduce(cpu, dst=root, op=REDUCE_OPS[op])
    dist.reduce(ph, dst=root, op=REDUCE_OPS[op])
    # The root gets the result; the others keep their input (NCCL's rule).
    assert_equal(ph, cpu if RANK == root else before, f"reduce to {root}")


checks.run("reduce[sum]", lambda: check_reduce(WORLD - 1, "sum"))
checks.run("reduce[max]", lambda: check_reduce(0, "max"))


# --- all_gather, reduce_scatter --------------------------------------------


def check_all_gather(adjacent):
    cpu, ph = both(values(6, torch.int64, seed=9))
    cpu_out = [torch.empty(6, dtype=torch.int64) for _ in range(WORLD)]
    if adjacent:
        ph_out = list(torch.empty(WORLD * 6, dtype=torch.int64, device=DEV).chunk(WORLD))
    else:  # separate buffers: staged through a flat device buffer
        ph_out = [torch.empty(6, dtype=torch.int64, device=DEV) for _ in range(WORLD)]
    dist.all_gather(cpu_out, cpu)
    dist.all_gather(ph_out, ph)
    for p in range(WORLD):
        assert_equal(ph_out[p], cpu_out[p], f"all_gather block {p}")


checks.run("all_gather[separate]", lambda: check_all_gather(False))
checks.run("all_gather[adjacent]", lambda: check_all_gather(True))


def check_all_gather_into_tensor():
    cpu, ph = both(values(5, torch.float16, seed=10))
    cpu_out = torch.empty(5 * WORLD, dtype=torch.float16)
    ph_out = torch.empty(5 * WORLD, dtype=torch.float16, device=DEV)
    dist.all_gather_into_tensor(cpu_out, cpu)
    dist.all_gather_into_tensor(ph_out, ph)
    assert_equal(ph_out, cpu_out, "all_gather_into_tensor")


checks.run("all_gather_into_tensor", check_all_gather_into_tensor)


def check_reduce_scatter(op):
    cpu_in = [values(4, torch.float32, seed=20 + p) for p in range(WORLD)]
    ph_in = [t.to(DEV) for t in cpu_in]
    cpu_out, ph_out = torch.empty(4), torch.empty(4, device=DEV)
    dist.reduce_scatter(cpu_out, cpu_in, op=REDUCE_OPS[op])
    dist.reduce_scatter(ph_out, ph_in, op=REDUCE_OPS[op])
    assert_equal(ph_out, cpu_out, f"reduce_scatter {op}")


checks.run("reduce_scatter[sum]", lambda: check_reduce_scatter("sum"))
checks.run("reduce_scatter[max]", lambda: check_reduce_scatter("max"))


def check_reduce_scatter_tensor(op):
    cpu, ph = both(values(3 * WORLD, torch.float32, seed=30))
    cpu_out, ph_out = torch.empty(3), torch.empty(3, device=DEV)
    dist.reduce_scatter_tensor(cpu_out, cpu, op=REDUCE_OPS[op])
    dist.reduce_scatter_tensor(ph_out, ph, op=REDUCE_OPS[op])
    assert_equal(ph_out, cpu_out, f"reduce_scatter_tensor {op}")


checks.run("reduce_scatter_tensor[sum]", lambda: check_reduce_scatter_tensor("sum"))
checks.run("reduce_scatter_tensor[avg]", lambda: check_reduce_scatter_tensor("avg"))


# --- all_to_all, gather, scatter -------------------------------------------


def check_all_to_all_single(uneven):
    if uneven:  # rank r sends p + r + 1 rows to rank p
        in_splits = [p + RANK + 1 for p in range(WORLD)]
        out_splits = [RANK + p + 1 for p in range(WORLD)]
    else:
        in_splits = out_splits = None
    rows_in = sum(in_splits) if uneven else 2 * WORLD
    rows_out = sum(out_splits) if uneven else 2 * WORLD
    cpu, ph = both(values(rows_in * 3, torch.int32, seed=40).reshape(rows_in, 3))
    cpu_out = torch.empty(rows_out, 3, dtype=torch.int32)
    ph_out = torch.empty(rows_out, 3, dtype=torch.int32, device=DEV)
    dist.all_to_all_single(cpu_out, cpu, out_splits, in_splits)
    dist.all_to_all_single(ph_out, ph, out_splits, in_splits)
    assert_equal(ph_out, cpu_out, "all_to_all_single")


checks.run("all_to_all_single[equal]", lambda: check_all_to_all_single(False))
checks.run("all_to_all_single[uneven]", lambda: check_all_to_all_single(True))


def check_all_to_all_list():
    # Block sizes differ by destination, which Gloo's own all_to_all
    # refuses: the reference is what each rank sends, computed here.
    ph_in = [values(p + 1, torch.float64, seed=50 + p).to(DEV) for p in range(WORLD)]
    ph_out = [torch.empty(RANK + 1, dtype=torch.float64, device=DEV) for _ in range(WORLD)]
    dist.all_to_all(ph_out, ph_in)
    for p in range(WORLD):
        expected = values(RANK + 1, torch.float64, seed=50 + RANK, rank=p)
        assert_equal(ph_out[p], expected, f"all_to_all from {p}")


checks.run("all_to_all[list]", check_all_to_all_list)


def check_gather(root):
    cpu, ph = both(values(5, torch.float32, seed=60))
    cpu_list = [torch.empty(5) for _ in range(WORLD)] if RANK == root else None
    ph_list = [torch.empty(5, device=DEV) for _ in range(WORLD)] if RANK == root else None
    dist.gather(cpu, cpu_list, dst=root)
    dist.gather(ph, ph_list, dst=root)
    if RANK == root:
        for p in range(WORLD):
            assert_equal(ph_list[p], cpu_list[p], f"gather block {p}")


def check_scatter(root):
    cpu_list = [values(5, torch.float32, seed=70 + p) for p in range(WORLD)] if RANK == root else None
    ph_list = [t.to(DEV) for t in cpu_list] if RANK == root else None
    cpu_out, ph_out = torch.empty(5), torch.empty(5, device=DEV)
    dist.scatter(cpu_out, cpu_list, src=root)
    dist.scatter(ph_out, ph_list, src=root)
    assert_equal(ph_out, cpu_out, "scatter")


checks.run("gather[root0]", lambda: check_gather(0))
checks.run("gather[last]", lambda: check_gather(WORLD - 1))
checks.run("scatter[root0]", lambda: check_scatter(0))
checks.run("scatter[last]", lambda: check_scatter(WORLD - 1))
checks.run("barrier", lambda: dist.barrier())


# --- point to point ---------------------------------------------------------

NEXT, PREV = (RANK + 1) % WORLD, (RANK - 1) % WORLD


def check_send_recv():
    # Even ranks send first, odd ranks receive first: no cycle of waits.
    mine = torch.full((7,), float(RANK), device=DEV)
    got = torch.empty(7, device=DEV)
    if RANK % 2 == 0:
        dist.send(mine, NEXT)
        dist.recv(got, PREV)
    else:
        dist.recv(got, PREV)
        dist.send(mine, NEXT)
    assert_equal(got, torch.full((7,), float(PREV)), "recv")


def check_isend_irecv():
    got = torch.empty(3, dtype=torch.int64, device=DEV)
    works = [dist.irecv(got, PREV)] if RANK % 2 else []
    works.append(dist.isend(torch.full((3,), RANK, device=DEV), NEXT))
    if RANK % 2 == 0:
        works.append(dist.irecv(got, PREV))
    for w in works:
        w.wait()
    assert_equal(got, torch.full((3,), PREV), "irecv")


def check_batch_isend_irecv():
    # Every rank receives first: a deadlock if the ops ran one at a time.
    got_prev = torch.empty(4, device=DEV)
    got_next = torch.empty(4, device=DEV)
    ops = [
        dist.P2POp(dist.irecv, got_prev, PREV),
        dist.P2POp(dist.irecv, got_next, NEXT),
        dist.P2POp(dist.isend, torch.full((4,), float(RANK), device=DEV), NEXT),
        dist.P2POp(dist.isend, torch.full((4,), float(-RANK), device=DEV), PREV),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert_equal(got_prev, torch.full((4,), float(PREV)), "from prev")
    assert_equal(got_next, torch.full((4,), float(-NEXT)), "from next")


checks.run("send_recv", check_send_recv)
checks.run("isend_irecv", check_isend_irecv)
checks.run("batch_isend_irecv", check_batch_isend_irecv)


# --- coalesced forms (FSDP2, DDP) -------------------------------------------


def check_coalesced():
    from torch.distributed.distributed_c10d import _coalescing_manager

    cpu = [values(n, torch.float32, seed=80 + n) for n in (3, 5, 8)]
    ph = [t.to(DEV) for t in cpu]
    for t in cpu:
        dist.all_reduce(t)
    with _coalescing_manager(device=DEV, async_ops=True) as cm:
        for t in ph:
            dist.all_reduce(t)
    cm.wait()
    for a, b in zip(ph, cpu):
        assert_equal(a, b, "coalesced all_reduce")

    ins = [values(n, torch.float32, seed=90 + n) for n in (2, 6)]
    cpu_outs = [torch.empty(WORLD * t.numel()) for t in ins]
    ph_outs = [torch.empty(WORLD * t.numel(), device=DEV) for t in ins]
    for o, i in zip(cpu_outs, ins):
        dist.all_gather_into_tensor(o, i)
    with _coalescing_manager(device=DEV):
        for o, i in zip(ph_outs, ins):
            dist.all_gather_into_tensor(o, i.to(DEV))
    for a, b in zip(ph_outs, cpu_outs):
        assert_equal(a, b, "coalesced all_gather_into_tensor")

    rs_in = [values(WORLD * n, torch.float32, seed=95 + n) for n in (3, 4)]
    cpu_rs = [torch.empty(t.numel() // WORLD) for t in rs_in]
    ph_rs = [torch.empty(t.numel() // WORLD, device=DEV) for t in rs_in]
    for o, i in zip(cpu_rs, rs_in):
        dist.reduce_scatter_tensor(o, i)
    with _coalescing_manager(device=DEV):
        for o, i in zip(ph_rs, rs_in):
            dist.reduce_scatter_tensor(o, i.to(DEV))
    for a, b in zip(ph_rs, cpu_rs):
        assert_equal(a, b, "coalesced reduce_scatter_tensor")


checks.run("coalesced", check_coalesced)


# --- Work, futures, streams -------------------------------------------------

TOTAL = float(sum(range(1, WORLD + 1)))


def check_async_work():
    t = torch.full((6,), float(RANK + 1), device=DEV)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True
    assert_equal(t, torch.full((6,), TOTAL), "async all_reduce")
    torch.phantom.synchronize()
    assert work.is_completed() and work.is_success(), "completed after synchronize"
    assert_equal(work.result()[0], t.cpu(), "result()")


def check_future():
    t = torch.full((6,), float(RANK + 1), device=DEV)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    assert_equal(fut.wait()[0], torch.full((6,), TOTAL), "future value")
    assert_equal(doubled, torch.full((6,), 2 * TOTAL), "future.then")


def check_wait_timeout_blocks_the_host():
    t = torch.full((6,), float(RANK + 1), device=DEV)
    faults.set_latency_us(300_000)
    try:
        t.mul_(1)  # a slow kernel ahead of the collective
    finally:
        faults.set_latency_us(0)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait(timeout=datetime.timedelta(seconds=30)) is True
    assert work.is_completed(), "wait(timeout) returned before the collective ended"
    assert_equal(t, torch.full((6,), TOTAL), "after wait(timeout)")


def check_wait_timeout_expires():
    # 1 s of queued work ahead: a 50 ms wait gives up, naming the
    # collective; the collective itself still completes.
    t = torch.full((6,), float(RANK + 1), device=DEV)
    faults.set_latency_us(1_000_000)
    try:
        t.mul_(1)
    finally:
        faults.set_latency_us(0)
    work = dist.all_reduce(t, async_op=True)
    raises(lambda: work.wait(timeout=datetime.timedelta(milliseconds=50)),
           "did not finish within 50 ms")
    work.wait()
    assert_equal(t, torch.full((6,), TOTAL), "after the expired wait")


def check_wait_does_not_block_the_host():
    # 1 s of queued work ahead: wait() returns long before the collective,
    # and the caller's stream (not the host) waits for it.
    t = torch.ones(6, device=DEV)
    faults.set_latency_us(1_000_000)
    try:
        t.mul_(RANK + 1)
    finally:
        faults.set_latency_us(0)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    pending = not work.is_completed()
    doubled = t * 2  # queued on the current stream, after the collective
    assert pending, "wait() blocked the host until the collective ended"
    assert_equal(doubled, torch.full((6,), 2 * TOTAL), "stream-ordered use")


def check_ordered_after_queued_work():
    # The add is still queued (300 ms of latency) when all_reduce is called:
    # the collective must start after it, on every rank.
    t = torch.zeros(5, device=DEV)
    faults.set_latency_us(300_000)
    try:
        t.add_(RANK + 1)
    finally:
        faults.set_latency_us(0)
    dist.all_reduce(t)
    assert_equal(t, torch.full((5,), TOTAL), "all_reduce after a queued add")


def check_on_a_side_stream():
    s = torch.phantom.Stream()
    t = torch.full((4,), float(RANK + 1), device=DEV)
    s.wait_stream(torch.phantom.current_stream())  # t's fill, as on CUDA
    with torch.phantom.stream(s):
        dist.all_reduce(t)
        out = t + 0
    s.synchronize()
    assert_equal(out, torch.full((4,), TOTAL), "on a side stream")


def check_list_forms_after_queued_work():
    # The list forms stage their inputs through a flat device buffer: that
    # copy too must wait for the work queued on the caller's stream.
    def slowly(fill):
        faults.set_latency_us(200_000)
        try:
            return fill()
        finally:
            faults.set_latency_us(0)

    ins = [torch.zeros(4, device=DEV) for _ in range(WORLD)]
    for p, t in enumerate(ins):
        slowly(lambda t=t, p=p: t.add_(10 * p + RANK))
    out = torch.empty(4, device=DEV)
    dist.reduce_scatter(out, ins)
    expected = float(sum(10 * RANK + r for r in range(WORLD)))
    assert_equal(out, torch.full((4,), expected), "reduce_scatter of late inputs")

    ins = [torch.zeros(2, device=DEV) for _ in range(WORLD)]
    for p, t in enumerate(ins):
        slowly(lambda t=t, p=p: t.add_(100 * RANK + p))
    outs = [torch.empty(2, device=DEV) for _ in range(WORLD)]
    dist.all_to_all(outs, ins)
    for p in range(WORLD):
        assert_equal(outs[p], torch.full((2,), float(100 * p + RANK)), f"all_to_all from {p}")

    mine = torch.zeros(3, device=DEV)
    slowly(lambda: mine.add_(RANK + 1))
    gathered = [torch.empty(3, device=DEV) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(mine, gathered, dst=0)
    if RANK == 0:
        for p in range(WORLD):
            assert_equal(gathered[p], torch.full((3,), float(p + 1)), f"gather block {p}")


def check_staging_memory_is_bounded():
    # Collectives queued far ahead of the communicator share one pinned
    # staging block at a time: the host's pinned memory does not grow with
    # the queue.
    t = torch.ones(1 << 18, device=DEV)  # 1 MiB
    dist.all_reduce(t)
    torch.phantom.synchronize()
    before = torch.phantom.host_memory_stats()["num_host_alloc"]
    faults.set_latency_us(200_000)
    try:
        t.mul_(1)  # hold the collectives back until all are queued
    finally:
        faults.set_latency_us(0)
    works = [dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True) for _ in range(16)]
    for w in works:
        w.wait()
    torch.phantom.synchronize()
    grew = torch.phantom.host_memory_stats()["num_host_alloc"] - before
    assert grew <= 1, f"16 queued collectives took {grew} new pinned blocks"
    assert_equal(t, torch.full((1 << 18,), float(WORLD)), "after the queued all_reduces")


checks.run("async_work", check_async_work)
checks.run("future", check_future)
checks.run("wait_timeout_blocks_the_host", check_wait_timeout_blocks_the_host)
checks.run("wait_timeout_expires", check_wait_timeout_expires)
checks.run("wait_does_not_block_the_host", check_wait_does_not_block_the_host)
checks.run("ordered_after_queued_work", check_ordered_after_queued_work)
checks.run("side_stream", check_on_a_side_stream)
checks.run("list_forms_after_queued_work", check_list_forms_after_queued_work)
checks.run("staging_memory_is_bounded", check_staging_memory_is_bounded)


# --- bad arguments: refused at the call, the group goes on ------------------

PHANTOM = torch.device("phantom")


def check_refusals():
    backend = dist.group.WORLD._get_backend(PHANTOM)
    raises(lambda: backend.allreduce([torch.ones(3)]), "pccl moves phantom tensors only")
    raises(lambda: dist.all_reduce(torch.ones(4, 4, device=DEV).t()), "is not contiguous")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16, device=DEV)), "cannot reduce Short")
    raises(
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32, device=DEV), op=dist.ReduceOp.AVG),
        "avg needs a floating-point dtype",
    )
    raises(
        lambda: dist.all_reduce(torch.ones(4, device=DEV), op=dist._make_nccl_premul_sum(2.0)),
        "PREMUL_SUM is not supported",
    )
    raises(lambda: dist.recv(torch.ones(2, device=DEV)), "pass the source rank")
    raises(
        lambda: dist.all_gather([torch.empty(2, device=DEV)] * (WORLD + 1), torch.ones(2, device=DEV)),
        "it needs one per rank",
    )
    raises(
        lambda: dist.all_gather_into_tensor(torch.empty(3, device=DEV), torch.ones(2, device=DEV)),
        "times the",
    )
    raises(
        lambda: dist.reduce_scatter_tensor(torch.empty(3, device=DEV), torch.ones(4, device=DEV)),
        "the input has 4 elements; it needs the output's 3 times the",
    )
    raises(
        lambda: dist.all_gather_into_tensor(torch.empty(2 * WORLD, dtype=torch.float64, device=DEV),
                                            torch.ones(2, device=DEV)),
        "the output is Double but the input is Float",
    )
    # gather's and scatter's lists: the root's holds one tensor per rank, the
    # others give none (called on the backend: torch's wrapper checks the
    # non-roots itself). Every rank is refused, so none waits for another.
    two = torch.ones(2, device=DEV)
    gather = dist.GatherOptions()
    gather.rootRank = 0
    raises(lambda: backend.gather([[two] * (WORLD + 1)] if RANK == 0 else [[two]], [two], gather),
           "the root needs a gather list of one tensor per rank" if RANK == 0
           else "only the root (rank 0) takes a gather list")
    scatter = dist.ScatterOptions()
    scatter.rootRank = 0
    raises(lambda: backend.scatter([two], [[two.double()] * WORLD] if RANK == 0 else [[two]], scatter),
           "a scatter list tensor is Double but the input is Float" if RANK == 0
           else "only the root (rank 0) takes a scatter list")
    # Nothing was issued: the group still works.
    check_all_reduce(torch.float32, "sum", 4)


checks.run("refusals", check_refusals)


# --- ranks that disagree: an error on every rank, no crash -----------------


def mismatch(kind):
    group = dist.new_group(backend="pccl")
    if kind == "size":
        t = torch.ones(1000 if RANK == 0 else 2000, device=DEV)
        call = lambda: dist.all_reduce(t, group=group)  # noqa: E731
    elif kind == "small_and_large":
        # 4 KB travels in the agreement message; 80 KB needs the data backend.
        t = torch.ones(1000 if RANK == 0 else 20000, device=DEV)
        call = lambda: dist.all_reduce(t, group=group)  # noqa: E731
    elif kind == "dtype":
        t = torch.ones(10, device=DEV, dtype=torch.float32 if RANK == 0 else torch.float64)
        call = lambda: dist.all_reduce(t, group=group)  # noqa: E731
    elif kind == "op":
        t = torch.ones(10, device=DEV)
        call = (lambda: dist.broadcast(t, 0, group=group)) if RANK == 0 else (
            lambda: dist.all_reduce(t, group=group))
    elif kind == "splits":
        out_splits = [1] * WORLD
        if RANK == 0:
            out_splits[-1] = 2  # rank 0 expects 2 rows from the last rank, which sends 1
        t = torch.ones(WORLD, device=DEV)
        out = torch.empty(sum(out_splits), device=DEV)
        call = lambda: dist.all_to_all_single(out, t, out_splits, [1] * WORLD, group=group)  # noqa: E731
    message = raises(lambda: (call(), t.cpu()), "disagree")
    # The group is broken now; later calls say why at once.
    raises(lambda: dist.all_reduce(torch.ones(1, device=DEV), group=group), "broken by an earlier failure")
    return message


def check_size_mismatch():
    message = mismatch("size")
    assert "rank 0 called all_reduce of 1000 x Float" in message, message
    assert "rank 1 called all_reduce of 2000 x Float" in message, message


def check_small_and_large_mismatch():
    message = mismatch("small_and_large")
    assert "rank 0 called all_reduce of 1000 x Float" in message, message
    assert f"rank {WORLD - 1} called all_reduce of 20000 x Float" in message, message


def check_dtype_mismatch():
    message = mismatch("dtype")
    assert "rank 1 called all_reduce of 10 x Double" in message, message


def check_op_mismatch():
    message = mismatch("op")
    assert "rank 0 called broadcast of 10 x Float" in message, message


def check_split_mismatch():
    message = mismatch("splits")
    assert f"rank {WORLD - 1} sends 1 elements to rank 0, which expects 2" in message, message


checks.run("mismatch_size", check_size_mismatch)
checks.run("mismatch_small_and_large", check_small_and_large_mismatch)
checks.run("mismatch_dtype", check_dtype_mismatch)
checks.run("mismatch_op", check_op_mismatch)
checks.run("mismatch_splits", check_split_mismatch)


def check_world_still_works():
    check_all_reduce(torch.float32, "sum", 10)
    torch.phantom.synchronize()


checks.run("world_group_unaffected", check_world_still_works)

checks.report(memory_allocated=torch.phantom.memory_allocated(DEV))
dist.destroy_process_group()
