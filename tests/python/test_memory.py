"""Device memory accounting through ``torch.phantom``'s memory API.

Users size batches and hunt leaks with ``memory_allocated``,
``max_memory_allocated``, ``reset_peak_memory_stats``, ``mem_get_info`` and
``memory_stats``, spelled and keyed as in ``torch.cuda``. The tests check
the numbers move with real allocations, per device.
"""

import gc

import pytest
import torch

from conftest import run_python

MiB = 1 << 20


def settle():
    gc.collect()
    for index in range(torch.phantom.device_count()):
        torch.phantom.synchronize(index)
    torch.phantom.empty_cache()


def test_memory_allocated_tracks_tensor_lifetime():
    settle()
    baseline = torch.phantom.memory_allocated()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="phantom")
    assert torch.phantom.memory_allocated() >= baseline + x.numel() * x.element_size()
    y = torch.empty(3, 5, device="phantom", dtype=torch.float64)
    assert torch.phantom.memory_allocated() >= baseline + 4 * MiB + 15 * 8
    del x, y
    settle()
    assert torch.phantom.memory_allocated() == baseline


def test_intermediates_of_ops_are_freed():
    settle()
    a = torch.randn(256, 256, device="phantom")
    baseline = torch.phantom.memory_allocated()
    for _ in range(3):
        b = (a @ a).relu().sum(0)
        del b
    settle()
    assert torch.phantom.memory_allocated() == baseline


def test_views_do_not_allocate():
    a = torch.randn(1024, 1024, device="phantom")
    settle()
    before = torch.phantom.memory_allocated()
    views = [a.t(), a[::2], a.view(-1), a.narrow(0, 5, 10), a.expand(2, 1024, 1024)]
    assert torch.phantom.memory_allocated() == before
    del views


def test_memory_allocated_is_per_device(two_devices):
    settle()
    before0 = torch.phantom.memory_allocated(0)
    before1 = torch.phantom.memory_allocated("phantom:1")
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="phantom:1")
    assert torch.phantom.memory_allocated(0) == before0
    assert torch.phantom.memory_allocated(1) >= before1 + 2 * MiB
    # With no argument, the current device is meant.
    with torch.phantom.device(1):
        assert torch.phantom.memory_allocated() == torch.phantom.memory_allocated(1)
    del x
    settle()
    assert torch.phantom.memory_allocated(1) == before1


def test_max_memory_allocated_and_reset_peak():
    settle()
    torch.phantom.reset_peak_memory_stats()
    base = torch.phantom.memory_allocated()
    assert torch.phantom.max_memory_allocated() == base
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="phantom")
    del x
    settle()
    peak = torch.phantom.max_memory_allocated()
    assert peak >= base + 8 * MiB
    assert torch.phantom.memory_allocated() == base
    torch.phantom.reset_peak_memory_stats()
    assert torch.phantom.max_memory_allocated() == base
    y = torch.empty(1 * MiB, dtype=torch.uint8, device="phantom")
    assert base + MiB <= torch.phantom.max_memory_allocated() < base + 8 * MiB
    del y


def test_mem_get_info_free_decreases_with_allocation():
    settle()
    free_before, total = torch.phantom.mem_get_info()
    assert total == 1 << 30  # PHANTOM_DEVICE_MEMORY=1GiB from conftest
    assert 0 < free_before <= total
    x = torch.empty(16 * MiB, dtype=torch.uint8, device="phantom")
    free_during, total_during = torch.phantom.mem_get_info()
    assert total_during == total
    assert free_during <= free_before - 16 * MiB
    del x
    settle()
    assert torch.phantom.mem_get_info()[0] == free_before


def test_memory_reserved_at_least_allocated():
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="phantom")
    assert torch.phantom.memory_reserved() >= torch.phantom.memory_allocated() >= 2 * MiB
    assert torch.phantom.max_memory_reserved() >= torch.phantom.memory_reserved()
    del x


def test_memory_stats_keys_and_values():
    settle()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="phantom")
    stats = torch.phantom.memory_stats()
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed",
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "allocation.all.current",
        "segment.all.current",
        "num_ooms",
        "num_alloc_retries",
    ]:
        assert key in stats, key
    assert stats["allocated_bytes.all.current"] == torch.phantom.memory_allocated()
    assert stats["allocated_bytes.all.current"] >= 3 * MiB
    assert stats["allocation.all.current"] >= 1
    allocated_total = stats["allocated_bytes.all.allocated"]
    del x
    settle()
    after = torch.phantom.memory_stats()
    assert after["allocated_bytes.all.freed"] >= stats["allocated_bytes.all.freed"] + 3 * MiB
    assert after["allocated_bytes.all.allocated"] == allocated_total
    # torch.cuda spells the same stats through torch.accelerator too.
    assert torch.accelerator.memory_allocated() == torch.phantom.memory_allocated()


def test_storage_resize_is_accounted():
    settle()
    base = torch.phantom.memory_allocated()
    out = torch.empty(0, device="phantom")
    torch.add(torch.zeros(MiB, device="phantom"), 1, out=out)
    assert out.numel() == MiB
    assert torch.phantom.memory_allocated() >= base + 4 * MiB
    del out
    settle()
    assert torch.phantom.memory_allocated() == base


@pytest.mark.parametrize("device", ["phantom:0", "phantom:1"])
def test_memory_functions_accept_device_spellings(device, two_devices):
    index = torch.device(device).index
    assert torch.phantom.memory_allocated(device) == torch.phantom.memory_allocated(index)
    assert torch.phantom.memory_allocated(torch.device(device)) == torch.phantom.memory_allocated(index)
    assert torch.phantom.mem_get_info(device)[1] == torch.phantom.mem_get_info(index)[1]


@pytest.mark.requires_kernel_view(
    "the host buffers of kernels run over the kernel view")
def test_kernels_reuse_their_large_host_buffers_and_empty_cache_frees_them():
    """A convolution's CPU kernel allocates ~64 MiB of outputs and reordered
    buffers per call. On phantom those come from the kernels' host memory
    cache (docs/allocator.md): after the first call nothing new is asked of
    the OS, the results stay the CPU's, and empty_cache() frees the cache."""
    settle()
    torch.manual_seed(0)
    x, w = torch.rand(8, 32, 40, 40), torch.rand(32, 32, 3, 3)
    xp, wp = x.to("phantom"), w.to("phantom")
    torch.nn.functional.conv2d(xp, wp, padding=1)
    torch.phantom.synchronize()
    first = torch.phantom.kernel_host_memory_stats()
    assert first["fresh"] > 0 and first["cached_bytes"] > 0
    for _ in range(3):
        out = torch.nn.functional.conv2d(xp, wp, padding=1)
    torch.phantom.synchronize()
    again = torch.phantom.kernel_host_memory_stats()
    assert again["fresh"] == first["fresh"], "later calls asked the OS for memory"
    assert again["reused"] > first["reused"]
    assert torch.equal(out.cpu(), torch.nn.functional.conv2d(x, w, padding=1))
    # The host's own CPU tensors do not come from the cache.
    host = torch.empty(8 * MiB, dtype=torch.uint8)
    host.fill_(1)
    assert torch.phantom.kernel_host_memory_stats()["fresh"] == again["fresh"]
    del host, out
    settle()
    stats = torch.phantom.kernel_host_memory_stats()
    assert stats["cached_bytes"] == 0 and stats["cached_blocks"] == 0


_LENDING_CASES = """
import torch, torch_phantom
import torch.nn.functional as F
in_place = lambda: torch.phantom.kernel_host_memory_stats()["in_place"]
gen = torch.Generator().manual_seed(0)
table = torch.rand(20000, 64, generator=gen)
indices = torch.randint(0, 20000, (16384,), generator=gen)
offsets = torch.arange(0, 16384, 32)
x = torch.rand(4, 32, 24, 24, generator=gen, requires_grad=True)
w = torch.rand(32, 32, 3, 3, generator=gen, requires_grad=True)
grad = torch.rand(4, 32, 24, 24, generator=gen)
bag = F.embedding_bag(indices, table, offsets, mode="sum")
y = F.conv2d(x, w, padding=1)
y.backward(grad)
xp = x.detach().to("phantom").requires_grad_()
wp = w.detach().to("phantom").requires_grad_()
counts = []
start = in_place()
bag_p = F.embedding_bag(indices.to("phantom"), table.to("phantom"),
                        offsets.to("phantom"), mode="sum")
torch.phantom.synchronize(); counts.append(in_place() - start)
start = in_place()
y_p = F.conv2d(xp, wp, padding=1)
counts.append(in_place() - start)
start = in_place()
y_p.backward(grad.to("phantom"))
torch.phantom.synchronize(); counts.append(in_place() - start)
assert torch.equal(bag_p.cpu(), bag), "embedding_bag"
assert torch.equal(y_p.cpu(), y), "conv2d"
assert torch.equal(xp.grad.cpu(), x.grad), "conv2d input gradient"
assert torch.equal(wp.grad.cpu(), w.grad), "conv2d weight gradient"
print(counts)
"""


@pytest.mark.parametrize("lending", ["on", "off"])
@pytest.mark.requires_kernel_view(
    "kernels write large results straight into device memory through the kernel view")
def test_large_results_are_computed_in_the_device_output(lending):
    """An EmbeddingBag's 512 KiB-class result and a convolution's output and
    gradients are computed straight into the device tensors the host
    allocated for them (phantom/KernelHostMemory.h, "Lending"): the kernel's
    allocation of that size is served from the output's memory, so no copy
    follows. The results are the CPU's, bit for bit, either way;
    PHANTOM_NO_LENDING=1 turns it off. In a fresh process, so the counts
    are this test's alone."""
    env = {"PHANTOM_NO_LENDING": "1"} if lending == "off" else {}
    done = run_python(_LENDING_CASES, extra_env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    counts = done.stdout.strip().splitlines()[-1]
    # embedding_bag: its output; conv2d: its output; backward: the input
    # gradient (the weight's, 36 KiB, is below the 128 KiB lending floor).
    assert counts == ("[1, 1, 1]" if lending == "on" else "[0, 0, 0]"), counts
