"""Pinned host memory and non_blocking copies.

Pinned memory comes from the caching host allocator (PyTorch's
CachingHostAllocatorImpl over ph_host_malloc). What is checked here is what
a user relies on:

- ``pin_memory()``, ``is_pinned()``, ``pin_memory=True`` factories and
  ``DataLoader(pin_memory=True)`` give pinned CPU tensors;
- a ``non_blocking=True`` copy from or into pinned memory returns while the
  transfer is still queued, and is right after a synchronize;
- the pinned block of such a copy is not handed out again before the
  transfer is done, even if the tensor is freed at once;
- copies that involve pageable memory stay synchronous.

To prove that a copy was queued rather than done, the stream is first held
busy (``hold``), so that work queued behind it cannot have run yet.
"""

import os
import textwrap
import threading

import pytest
import torch
import torch_phantom

from conftest import DEVICE_COUNT, run_python

MiB = 1 << 20
N = 2 * MiB  # float32 elements: 8 MiB tensors


def _hold_with_copies(stream, ms):
    # Same-device copies of a large tensor are queued and take a while.
    with stream:
        device = torch.device("phantom", stream.device_index)
        src = torch.ones(16 * MiB, device=device)  # 64 MiB
        dst = torch.empty_like(src)
        for _ in range(max(4, int(ms // 25))):
            dst.copy_(src)


def hold(stream=None, ms=400.0):
    """Queues work that keeps ``stream`` (default: the current stream)
    busy for a while, and returns at once."""
    if stream is None:
        stream = torch.phantom.current_stream()
    sleep = getattr(torch_phantom._C, "_sleep_on_stream", None)
    if sleep is not None:
        sleep(stream.device_index, stream.stream_id, ms)
    else:
        _hold_with_copies(stream, ms)
    assert not stream.query(), "the stream should be busy"


def values(n=N, start=0.0):
    return torch.arange(start, start + n, dtype=torch.float32)


# --------------------------------------------------------------------------
# Allocation


def test_pin_memory_and_is_pinned():
    cpu = values(1000)
    assert not cpu.is_pinned()
    pinned = cpu.pin_memory()
    assert pinned.is_pinned()
    assert pinned.device.type == "cpu"
    assert pinned.data_ptr() != cpu.data_ptr()
    assert torch.equal(pinned, cpu)
    # Pinning a pinned tensor is a no-op, as on CUDA.
    assert pinned.pin_memory().data_ptr() == pinned.data_ptr()


def test_pinned_factories_and_views():
    for t in (
        torch.empty(10, pin_memory=True),
        torch.zeros(3, 4, pin_memory=True),
        torch.empty_strided((4, 4), (1, 4), pin_memory=True),
    ):
        assert t.is_pinned()
    base = torch.zeros(8, 8, pin_memory=True)
    assert base[2:, 3].is_pinned()
    assert base.t().is_pinned()


def test_empty_tensor_pins():
    t = torch.empty(0).pin_memory()
    assert t.numel() == 0
    assert t.device.type == "cpu"


def test_freed_block_is_cached_and_reused():
    a = torch.empty(3 * MiB + 5, dtype=torch.uint8, pin_memory=True)
    ptr = a.data_ptr()
    del a
    # Same size and a smaller size in the same power-of-two bucket.
    b = torch.empty(3 * MiB + 5, dtype=torch.uint8, pin_memory=True)
    assert b.data_ptr() == ptr
    del b
    c = torch.empty(3 * MiB + 100, dtype=torch.uint8, pin_memory=True)
    assert c.data_ptr() == ptr
    assert c.is_pinned()


def test_empty_host_cache():
    a = torch.full((MiB,), 3.0, pin_memory=True)
    del a
    torch.accelerator.empty_host_cache()
    b = torch.full((MiB,), 4.0, pin_memory=True)
    assert b.is_pinned()
    assert torch.equal(b, torch.full((MiB,), 4.0))


def test_dataloader_pin_memory():
    data = torch.utils.data.TensorDataset(values(64).reshape(16, 4),
                                          torch.arange(16))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    seen = []
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        seen.append(x.to("phantom", non_blocking=True))
    torch.phantom.synchronize()
    assert torch.equal(torch.cat([s.cpu() for s in seen]),
                       values(64).reshape(16, 4))


def test_dataloader_pin_memory_with_workers():
    data = torch.utils.data.TensorDataset(values(64).reshape(16, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True,
                                         num_workers=2)
    out = []
    for (x,) in loader:
        assert x.is_pinned()
        out.append(x.to("phantom", non_blocking=True))
    torch.phantom.synchronize()
    assert torch.equal(torch.cat([o.cpu() for o in out]),
                       values(64).reshape(16, 4))


# --------------------------------------------------------------------------
# non_blocking copies are asynchronous


def test_non_blocking_host_to_device_returns_before_the_copy():
    src = values().pin_memory()
    dst = torch.zeros(N, device="phantom")
    hold()
    dst.copy_(src, non_blocking=True)
    assert not torch.phantom.current_stream().query()
    torch.phantom.synchronize()
    assert torch.equal(dst.cpu(), values())


def test_non_blocking_to_returns_before_the_copy():
    src = values().pin_memory()
    hold()
    dst = src.to("phantom", non_blocking=True)
    assert not torch.phantom.current_stream().query()
    torch.phantom.synchronize()
    assert torch.equal(dst.cpu(), values())


def test_non_blocking_device_to_host_returns_before_the_copy():
    src = values().to("phantom")
    dst = torch.zeros(N).pin_memory()
    hold()
    dst.copy_(src, non_blocking=True)
    assert not torch.phantom.current_stream().query()
    # The host must not look yet: the bytes have not arrived.
    torch.phantom.synchronize()
    assert torch.equal(dst, values())


def test_non_blocking_cpu_into_pinned_returns_before_the_copy():
    src = values().to("phantom")
    hold()
    dst = src.to("cpu", non_blocking=True)
    # As on CUDA, .to("cpu", non_blocking=True) lands in pinned memory.
    assert dst.is_pinned()
    assert not torch.phantom.current_stream().query()
    torch.phantom.synchronize()
    assert torch.equal(dst, values())


def test_non_blocking_with_conversion_stays_asynchronous():
    src = values().pin_memory()
    hold()
    half = src.to("phantom", dtype=torch.float16, non_blocking=True)
    assert not torch.phantom.current_stream().query()
    back = torch.empty(N, dtype=torch.float64).pin_memory()
    back.copy_(half, non_blocking=True)
    assert not torch.phantom.current_stream().query()
    torch.phantom.synchronize()
    assert torch.equal(half.cpu(), values().half())
    assert torch.equal(back, values().half().double())


def test_non_blocking_strided_copies_are_right():
    src = values(64 * 64).reshape(64, 64).pin_memory()
    hold()
    dev = src.t().to("phantom", non_blocking=True)
    out = torch.empty(64, 64).pin_memory().t()  # non-contiguous pinned
    out.copy_(dev, non_blocking=True)
    torch.phantom.synchronize()
    assert torch.equal(dev.cpu(), src.t())
    assert torch.equal(out, src.t())


def test_blocking_copy_from_pinned_is_complete_on_return():
    src = values().pin_memory()
    dst = torch.zeros(N, device="phantom")
    hold()
    dst.copy_(src)  # blocking: the host may overwrite the source at once
    src.zero_()
    assert torch.equal(dst.cpu(), values())


def test_blocking_copy_into_pinned_is_complete_on_return():
    src = values().to("phantom")
    dst = torch.zeros(N).pin_memory()
    hold()
    dst.copy_(src)
    assert torch.equal(dst, values())


# --------------------------------------------------------------------------
# Pageable memory stays synchronous


@pytest.mark.parametrize("non_blocking", [False, True])
def test_pageable_host_to_device_is_synchronous(non_blocking):
    src = values()
    dst = torch.zeros(N, device="phantom")
    hold()
    dst.copy_(src, non_blocking=non_blocking)
    # The source has been read: overwriting it does not change the copy.
    src.fill_(-1.0)
    torch.phantom.synchronize()
    assert torch.equal(dst.cpu(), values())


@pytest.mark.parametrize("non_blocking", [False, True])
def test_pageable_device_to_host_is_synchronous(non_blocking):
    src = values().to("phantom")
    dst = torch.zeros(N)
    hold()
    dst.copy_(src, non_blocking=non_blocking)
    assert torch.equal(dst, values())  # no synchronize needed


# --------------------------------------------------------------------------
# Freed pinned blocks are not reused while a copy still uses them


def test_freed_source_of_non_blocking_copy_is_not_reused():
    src = values().pin_memory()
    old_ptr = src.data_ptr()
    dst = torch.zeros(N, device="phantom")
    hold()
    dst.copy_(src, non_blocking=True)
    del src  # the transfer has not read it yet
    other = torch.full((N,), -7.0).pin_memory()  # same size, other values
    assert other.data_ptr() != old_ptr
    assert not torch.phantom.current_stream().query(), "test lost its race"
    torch.phantom.synchronize()
    assert torch.equal(dst.cpu(), values())
    assert torch.equal(other, torch.full((N,), -7.0))


def test_freed_destination_of_non_blocking_copy_is_not_reused():
    src = values().to("phantom")
    dst = torch.zeros(N).pin_memory()
    old_ptr = dst.data_ptr()
    hold()
    dst.copy_(src, non_blocking=True)
    del dst  # the transfer has not written it yet
    other = torch.full((N,), -7.0).pin_memory()
    assert other.data_ptr() != old_ptr
    assert not torch.phantom.current_stream().query(), "test lost its race"
    torch.phantom.synchronize()
    # The late transfer wrote into the old block, never into `other`.
    assert torch.equal(other, torch.full((N,), -7.0))


def test_block_is_reused_once_its_copy_is_done():
    src = values().pin_memory()
    old_ptr = src.data_ptr()
    dst = torch.zeros(N, device="phantom")
    hold()
    dst.copy_(src, non_blocking=True)
    del src
    torch.phantom.synchronize()
    again = torch.empty(N).pin_memory()
    assert again.data_ptr() == old_ptr


def test_freed_staging_buffer_of_converting_copy_is_not_reused():
    src = values().pin_memory()
    hold()
    dev = src.to("phantom", dtype=torch.float64, non_blocking=True)
    del src
    # Both the source and the pinned staging buffer are in flight; fill
    # every block of these sizes that the cache could hand out.
    others = [torch.full((N,), -1.0, dtype=dt).pin_memory()
              for dt in (torch.float32, torch.float64)]
    torch.phantom.synchronize()
    assert torch.equal(dev.cpu(), values().double())
    assert torch.equal(others[1], torch.full((N,), -1.0, dtype=torch.float64))


def test_empty_host_cache_keeps_blocks_in_flight():
    # In a child process: freeing the block under the transfer would fault.
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch, torch_phantom
        from test_pinned import hold, values, N
        src = values().pin_memory()
        dst = torch.zeros(N, device="phantom")
        hold()
        dst.copy_(src, non_blocking=True)
        del src
        torch.accelerator.empty_host_cache()  # must not free the pending block
        assert not torch.phantom.current_stream().query(), "lost its race"
        torch.phantom.synchronize()
        assert torch.equal(dst.cpu(), values())
        print("ok")
    """)
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_side_stream_copy_records_its_own_stream():
    side = torch.Stream(device="phantom")
    src = values().pin_memory()
    dst = torch.zeros(N, device="phantom")
    torch.phantom.synchronize()  # the zero fill ran on the default stream
    hold(side)
    with side:
        dst.copy_(src, non_blocking=True)
    del src
    # Only the side stream is busy: the block waits for it, not for the
    # (idle) current stream.
    assert torch.phantom.current_stream().query()
    other = torch.full((N,), -7.0).pin_memory()
    assert not side.query(), "test lost its race"
    side.synchronize()
    assert torch.equal(dst.cpu(), values())
    assert torch.equal(other, torch.full((N,), -7.0))


@pytest.mark.skipif(DEVICE_COUNT < 2, reason="needs two phantom devices")
def test_non_blocking_copy_to_second_device():
    src = values().pin_memory()
    stream1 = torch.phantom.current_stream(1)
    hold(stream1)
    dst = src.to("phantom:1", non_blocking=True)
    del src
    other = torch.full((N,), -7.0).pin_memory()
    assert not stream1.query(), "test lost its race"
    torch.phantom.synchronize(1)
    assert torch.equal(dst.cpu(), values())
    assert torch.equal(other, torch.full((N,), -7.0))


def test_many_threads_pin_copy_and_free():
    errors = []

    def work(seed):
        try:
            stream = torch.Stream(device="phantom")
            with stream:
                for i in range(20):
                    n = 1000 + 4099 * ((seed + i) % 7)
                    host = torch.full((n,), float(seed * 100 + i)).pin_memory()
                    dev = host.to("phantom", non_blocking=True)
                    del host
                    back = torch.empty(n).pin_memory()
                    back.copy_(dev, non_blocking=True)
                    stream.synchronize()
                    if not torch.equal(back, torch.full((n,), float(seed * 100 + i))):
                        errors.append((seed, i))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
