"""The caching device allocator, as a user of torch.cuda's allocator relies
on it: caching, the statistics and their keys, empty_cache, stream-ordered
reuse with and without record_stream, out-of-memory recovery, settings, and
the snapshot. Streams are held busy with a private test hook that queues a
sleep on a stream, standing in for a long kernel."""

import pytest
import torch
import torch_phantom

from conftest import run_python

DEVICE = "phantom:0"
FLOAT_BYTES = 4


def hold(stream: torch.Stream, ms: float) -> None:
    """Keeps `stream` busy for `ms` milliseconds from now."""
    torch_phantom._C._sleep_on_stream(stream.device_index, stream.stream_id, ms)


def side_stream() -> torch.Stream:
    return torch.Stream(device=DEVICE)


# 14 MiB: a large-pool request that gets a segment of exactly its size, so
# reuse of a freed block by the same stream is deterministic.
RACE_ELEMENTS = (14 << 20) // FLOAT_BYTES


def test_memory_stats_report_the_keys_cuda_reports():
    torch.empty(10, device=DEVICE)
    stats = torch.phantom.memory_stats(DEVICE)
    for name in ("allocation", "segment", "active", "inactive_split",
                 "allocated_bytes", "reserved_bytes", "active_bytes",
                 "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{field}" in stats
    for name in ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                 "num_device_alloc", "num_device_free", "max_split_size"):
        assert name in stats


def test_freed_memory_stays_reserved_until_empty_cache():
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    base_allocated = torch.phantom.memory_allocated(DEVICE)
    base_reserved = torch.phantom.memory_reserved(DEVICE)
    x = torch.empty(4 << 20, device=DEVICE)  # 16 MiB: a large-pool segment
    assert torch.phantom.memory_allocated(DEVICE) == base_allocated + x.nbytes
    assert torch.phantom.memory_reserved(DEVICE) >= base_reserved + x.nbytes
    free_with_tensor, total = torch.phantom.mem_get_info(DEVICE)
    del x
    assert torch.phantom.memory_allocated(DEVICE) == base_allocated
    assert torch.phantom.memory_reserved(DEVICE) > base_reserved  # cached
    torch.phantom.empty_cache()
    assert torch.phantom.memory_reserved(DEVICE) == base_reserved
    free_after, _ = torch.phantom.mem_get_info(DEVICE)
    assert free_after > free_with_tensor


def test_a_freed_block_is_reused_without_asking_the_driver():
    x = torch.empty(1000, device=DEVICE)
    address = x.data_ptr()
    del x
    driver_allocs = torch.phantom.memory_stats(DEVICE)["num_device_alloc"]
    y = torch.empty(1000, device=DEVICE)
    assert y.data_ptr() == address
    assert torch.phantom.memory_stats(DEVICE)["num_device_alloc"] == driver_allocs


def test_peak_statistics_and_their_reset():
    torch.phantom.reset_peak_memory_stats(DEVICE)
    base = torch.phantom.memory_allocated(DEVICE)
    x = torch.empty(1 << 20, device=DEVICE)
    del x
    assert torch.phantom.max_memory_allocated(DEVICE) >= base + (1 << 20) * FLOAT_BYTES
    torch.phantom.reset_peak_memory_stats(DEVICE)
    assert torch.phantom.max_memory_allocated(DEVICE) == torch.phantom.memory_allocated(DEVICE)


def test_torch_accelerator_memory_functions_go_through_the_allocator():
    base = torch.accelerator.memory_allocated(0)
    x = torch.empty(1 << 18, device=DEVICE)
    assert torch.accelerator.memory_allocated(0) == base + x.nbytes
    assert torch.accelerator.memory_reserved(0) >= torch.accelerator.memory_allocated(0)
    assert torch.accelerator.memory_stats(0)["allocated_bytes.all.current"] == base + x.nbytes
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.accelerator.max_memory_allocated(0) == base + x.nbytes
    del x
    torch.accelerator.empty_cache()


def test_memory_freed_on_a_busy_stream_is_not_given_to_another_stream():
    """Without record_stream: x lives on the default stream, whose queued
    work still reads it when the host frees it. An allocation on another
    stream must not receive that block and overwrite it."""
    default = torch.phantom.current_stream(DEVICE)
    x = torch.full((RACE_ELEMENTS,), 7.0, device=DEVICE)
    result = torch.empty_like(x)
    hold(default, 100)
    result.copy_(x)  # queued on the default stream behind the sleep
    del x
    other = side_stream()
    with torch.phantom.stream(other):
        y = torch.empty(RACE_ELEMENTS, device=DEVICE)
        y.fill_(-1.0)  # runs at once on the other stream
    torch.phantom.synchronize()
    assert torch.equal(result.cpu(), torch.full((RACE_ELEMENTS,), 7.0))


def test_record_stream_keeps_memory_until_the_other_stream_is_done():
    side = side_stream()
    x = torch.full((RACE_ELEMENTS,), 7.0, device=DEVICE)
    result = torch.empty_like(x)
    torch.phantom.synchronize()
    hold(side, 100)
    with torch.phantom.stream(side):
        result.copy_(x)  # side stream reads x later
    x.record_stream(side)
    address = x.data_ptr()
    del x
    y = torch.empty(RACE_ELEMENTS, device=DEVICE)
    y.fill_(-1.0)
    assert y.data_ptr() != address
    torch.phantom.synchronize()
    assert torch.equal(result.cpu(), torch.full((RACE_ELEMENTS,), 7.0))


@pytest.mark.no_race_detector(
    "plants the missing-record_stream race on purpose, which the detector "
    "reports at the reuse (test_race_detector.py)")
def test_without_record_stream_the_race_is_real_as_on_hardware():
    """The same program without record_stream is a user bug; phantom must
    expose it (reuse on the allocating stream) instead of hiding it."""
    side = side_stream()
    x = torch.full((RACE_ELEMENTS,), 7.0, device=DEVICE)
    result = torch.empty_like(x)
    torch.phantom.synchronize()
    hold(side, 100)
    with torch.phantom.stream(side):
        result.copy_(x)
    address = x.data_ptr()
    del x
    y = torch.empty(RACE_ELEMENTS, device=DEVICE)
    y.fill_(-1.0)
    assert y.data_ptr() == address
    torch.phantom.synchronize()
    assert torch.equal(result.cpu(), torch.full((RACE_ELEMENTS,), -1.0))


def test_record_stream_rejects_a_stream_of_another_device():
    x = torch.empty(10, device=DEVICE)
    with pytest.raises(RuntimeError, match="phantom:1"):
        x.record_stream(torch.Stream(device="phantom:1"))


def test_out_of_memory_frees_the_cache_retries_and_then_raises_with_accounting():
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    base = torch.phantom.memory_allocated(DEVICE)
    retries = torch.phantom.memory_stats(DEVICE)["num_alloc_retries"]
    # Cache 600 MiB on the default stream, then ask for 600 MiB on another
    # stream: only freeing the cache makes room (1 GiB device).
    x = torch.empty(150 << 20, device=DEVICE)
    del x
    with torch.phantom.stream(side_stream()):
        y = torch.empty(150 << 20, device=DEVICE)
    assert torch.phantom.memory_stats(DEVICE)["num_alloc_retries"] == retries + 1
    with pytest.raises(torch.OutOfMemoryError) as error:
        torch.empty(150 << 20, device=DEVICE)
    message = str(error.value)
    for part in ("tried to allocate 600.00 MiB", "capacity 1.00 GiB",
                 "allocated by PyTorch", "reserved by PyTorch", "free on the device"):
        assert part in message
    del y
    assert torch.phantom.memory_allocated(DEVICE) == base
    z = torch.ones(150 << 20, device=DEVICE)  # fits again
    assert z[-1].item() == 1.0


def test_snapshot_lists_segments_and_blocks():
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    keep = torch.empty(1000, device=DEVICE)
    snapshot = [s for s in torch.phantom.memory_snapshot() if s["device"] == 0]
    assert sum(s["total_size"] for s in snapshot) == torch.phantom.memory_reserved(DEVICE)
    blocks = [b for s in snapshot for b in s["blocks"]]
    mine = [b for b in blocks if b["address"] == keep.data_ptr()]
    assert len(mine) == 1
    assert mine[0]["state"] == "active_allocated"
    assert mine[0]["requested_size"] == keep.nbytes
    assert any(b["state"] == "inactive" for b in blocks)  # the segment's rest


def test_a_malformed_alloc_conf_is_a_clear_error_at_import():
    result = run_python("import torch_phantom",
                        {"PHANTOM_ALLOC_CONF": "max_split_size_mb:lots",
                         "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode != 0
    assert "PHANTOM_ALLOC_CONF" in result.stderr
    assert "max_split_size_mb" in result.stderr


def test_alloc_conf_settings_take_effect():
    code = (
        "import torch, torch_phantom\n"
        "print(torch.phantom.memory_stats(0)['max_split_size'])\n"
    )
    result = run_python(code, {"PHANTOM_ALLOC_CONF": "max_split_size_mb:64"})
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) == 64 << 20


GC_CODE = """
import torch, torch_phantom
big = (300 << 20) // 4  # 300 MiB of float32, on a 1 GiB device
x = torch.empty(big, device="phantom")
del x                   # cached on the default stream
with torch.phantom.stream(torch.Stream(device="phantom")):
    y = torch.empty(big, device="phantom")  # cannot reuse it: other stream
stats = torch.phantom.memory_stats()
print(stats["reserved_bytes.all.current"] >> 20, stats["num_alloc_retries"])
"""


@pytest.mark.parametrize("conf, reserved_mib", [("", 600), ("garbage_collection_threshold:0.5", 300)])
def test_garbage_collection_threshold_frees_the_cache_before_growing(conf, reserved_mib):
    result = run_python(GC_CODE, {"PHANTOM_ALLOC_CONF": conf, "PHANTOM_DEVICE_MEMORY": "1GiB"})
    assert result.returncode == 0, result.stderr
    reserved, retries = (int(v) for v in result.stdout.split())
    assert reserved == reserved_mib
    assert retries == 0  # collected ahead, not after a failed allocation
