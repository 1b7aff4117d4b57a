"""Private memory pools on phantom: torch.phantom.MemPool and use_mem_pool,
reuse of a pool's memory within a graph capture, and pools in memory_stats
and memory_snapshot (docs/graphs.md, "Memory pools")."""
import gc
import threading

import pytest
import torch

import torch_phantom  # noqa: F401

MiB = 1 << 20


def _pool_segments(pool_id):
    return torch.phantom.memory_snapshot(mempool_id=pool_id)


def test_use_mem_pool_routes_allocations_into_the_pool_and_gives_them_back():
    pool = torch.phantom.MemPool()
    assert pool.use_count() == 1
    with torch.phantom.use_mem_pool(pool):
        a = torch.ones(MiB // 4, device="phantom")  # 1 MiB
    b = torch.ones(MiB // 4, device="phantom")  # outside: the shared cache
    segments = _pool_segments(pool.id)
    addresses = {s["address"] for s in segments}
    assert a.data_ptr() in addresses
    assert b.data_ptr() not in addresses
    assert all(tuple(s["segment_pool_id"]) == pool.id for s in segments)
    assert torch.equal((a + b).cpu(), torch.full((MiB // 4,), 2.0))
    assert pool.snapshot() == segments


def test_a_pool_hands_freed_memory_out_again_on_the_same_stream():
    pool = torch.phantom.MemPool()
    with torch.phantom.use_mem_pool(pool):
        a = torch.empty(MiB, dtype=torch.uint8, device="phantom")
        first = a.data_ptr()
        del a
        b = torch.empty(MiB - 4096, dtype=torch.uint8, device="phantom")
        assert b.data_ptr() == first  # fits, at most twice the request
        c = torch.empty(MiB, dtype=torch.uint8, device="phantom")
        assert c.data_ptr() != first  # b holds it
    reserved = sum(s["total_size"] for s in pool.snapshot())
    assert reserved == 2 * MiB


def test_pool_memory_counts_in_memory_stats_and_goes_back_with_the_pool():
    torch.phantom.synchronize()
    before = torch.phantom.memory_stats()
    pool = torch.phantom.MemPool()
    with torch.phantom.use_mem_pool(pool):
        t = torch.empty(3 * MiB, dtype=torch.uint8, device="phantom")
    during = torch.phantom.memory_stats()
    assert during["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == 3 * MiB
    assert during["reserved_bytes.all.current"] - before["reserved_bytes.all.current"] == 3 * MiB
    del t  # back to the pool: still reserved, no longer allocated
    kept = torch.phantom.memory_stats()
    assert kept["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert kept["reserved_bytes.all.current"] - before["reserved_bytes.all.current"] == 3 * MiB
    del pool
    gc.collect()
    after = torch.phantom.memory_stats()
    assert after["reserved_bytes.all.current"] == before["reserved_bytes.all.current"]


def test_memory_a_tensor_holds_outlives_its_pool():
    pool = torch.phantom.MemPool()
    pool_id = pool.id
    with torch.phantom.use_mem_pool(pool):
        t = torch.full((1024,), 7.0, device="phantom")
    del pool
    gc.collect()
    assert torch.equal(t.cpu(), torch.full((1024,), 7.0))
    assert [s["address"] for s in _pool_segments(pool_id)] == [t.data_ptr()]
    held = torch.phantom.memory_allocated()
    del t
    assert torch.phantom.memory_allocated() == held - 4096
    assert _pool_segments(pool_id) == []


def test_use_mem_pool_is_per_thread():
    pool = torch.phantom.MemPool()
    other = {}

    def allocate():
        other["ptr"] = torch.empty(1024, device="phantom").data_ptr()
        other["t"] = torch.empty(1024, device="phantom")

    with torch.phantom.use_mem_pool(pool):
        mine = torch.empty(1024, device="phantom")
        thread = threading.Thread(target=allocate)
        thread.start()
        thread.join()
    addresses = {s["address"] for s in pool.snapshot()}
    assert mine.data_ptr() in addresses
    assert other["t"].data_ptr() not in addresses


@pytest.mark.requires_kernel_view(
    "graph capture records stream work; the copying CPU fallback's blocking "
    "host copies cannot be captured")
def test_a_graph_captures_into_a_mempool_and_counts_as_its_user():
    pool = torch.phantom.MemPool()
    x = torch.ones(256, device="phantom")
    g = torch.phantom.Graph()
    with torch.phantom.graph(g, pool=pool.id):
        y = x * 3 + 1
    assert pool.use_count() == 2
    assert y.data_ptr() in {s["address"] for s in pool.snapshot()}
    x.fill_(2.0)
    g.replay()
    assert torch.equal(y.cpu(), torch.full((256,), 7.0))
    g.reset()
    assert pool.use_count() == 1


@pytest.mark.requires_kernel_view(
    "graph capture records stream work; the copying CPU fallback's blocking "
    "host copies cannot be captured")
def test_a_capture_reuses_the_memory_of_its_dead_temporaries():
    x = torch.randn(MiB // 4, device="phantom")
    expected = x.cpu()
    for _ in range(8):
        expected = (expected * 1.5).sin()
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        y = x
        for _ in range(8):
            y = (y * 1.5).sin()  # each step's temporaries die
    reserved = torch.phantom.graphs._C._graph_pool_reserved_bytes(*g.pool())
    assert reserved <= 4 * MiB  # not 16 one-MiB allocations
    g.replay()
    torch.testing.assert_close(y.cpu(), expected)


def test_record_stream_memory_is_never_handed_out_again():
    pool = torch.phantom.MemPool()
    side = torch.phantom.Stream()
    with torch.phantom.use_mem_pool(pool):
        a = torch.empty(4096, dtype=torch.uint8, device="phantom")
        first = a.data_ptr()
        a.record_stream(side)
        del a
        b = torch.empty(4096, dtype=torch.uint8, device="phantom")
    assert b.data_ptr() != first


def test_bad_uses_of_pools_raise_clear_errors():
    with pytest.raises(TypeError, match="MemPool"):
        with torch.phantom.use_mem_pool((1, 0)):
            pass
    with pytest.raises(NotImplementedError, match="allocator"):
        torch.phantom.MemPool(allocator=object())
    pool = torch.phantom.MemPool()
    pool_id = pool.id
    del pool
    gc.collect()
    with pytest.raises(ValueError, match="no memory pool"):
        torch_phantom._C._mempool_begin_allocate(0, *pool_id)
    # a failed context leaves allocation as usual
    t = torch.empty(16, device="phantom")
    assert t.data_ptr() not in {s["address"] for s in _pool_segments(pool_id)}
