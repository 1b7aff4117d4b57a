"""The device-generic part of ``torch.cuda``'s API, on ``torch.phantom``.

Device-agnostic code calls ``getattr(torch, device_type).X`` for device
information, memory control and the allocator's statistics. Each test
checks one such call against what the device really does: the properties
against the driver's accounting, the memory fraction against real
allocations, the raw allocator against the statistics.
"""

import gc
import warnings

import pytest
import torch

from conftest import DRIVER_LIBRARY, run_python

MiB = 1 << 20

# What the repository's drivers call their devices.
DEVICE_NAMES = {"libphantom_fake.so": "Phantom fake accelerator",
                "libphantom_remote.so": "Phantom remote accelerator"}


def settle():
    gc.collect()
    for index in range(torch.phantom.device_count()):
        torch.phantom.synchronize(index)
    torch.phantom.empty_cache()


# ---------------------------------------------------------------------------
# Device information.


def test_device_properties_describe_the_device(two_devices):
    for index in range(torch.phantom.device_count()):
        props = torch.phantom.get_device_properties(index)
        assert props.name == torch.phantom.get_device_name(index)
        if DRIVER_LIBRARY in DEVICE_NAMES:
            assert props.name == DEVICE_NAMES[DRIVER_LIBRARY]
        # The capacity the driver allocates from (conftest: 1 GiB).
        assert props.total_memory == torch.phantom.mem_get_info(index)[1] == 1 << 30
        assert props.multi_processor_count >= 1
        assert props.is_integrated is False and props.is_multi_gpu_board is False
        assert props.stream_priority_range == torch.phantom.Stream.priority_range()
        assert f"total_memory={props.total_memory // MiB}MB" in repr(props)
    # Spellings of the device, and the current one by default.
    with torch.phantom.device(1):
        assert torch.phantom.get_device_properties().total_memory == 1 << 30
    assert torch.phantom.get_device_name("phantom:1") == torch.phantom.get_device_name(1)


def test_capability_is_the_drivers_hal_abi_version():
    props = torch.phantom.get_device_properties()
    assert torch.phantom.get_device_capability() == (props.major, props.minor)
    # ph_abi_version() of the driver in use (hal.h), read through a
    # subprocess with ctypes so the test does not restate the runtime's
    # arithmetic.
    code = (
        "import ctypes, torch_phantom\n"
        "lib = ctypes.CDLL(torch_phantom._C._hal_info()['driver_library'])\n"
        "print(lib.ph_abi_version())\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    version = int(done.stdout.strip())
    assert (props.major, props.minor) == (version // 1000, version % 1000)


def test_bad_device_index_is_a_clear_error():
    count = torch.phantom.device_count()
    with pytest.raises(RuntimeError, match=f"phantom device index {count}|device index {count}"):
        torch.phantom.get_device_properties(count)
    with pytest.raises(ValueError, match="expected a phantom device, got 'cpu'"):
        torch.phantom.get_device_name("cpu")


def test_accelerator_capability_lists_the_dtypes_phantom_holds_and_converts():
    """torch.accelerator.get_device_capability asks the device guard. A dtype
    is listed exactly when a phantom tensor of it can be made and converted
    to and from float32, which on phantom means: not quantized, and
    convertible by the CPU's kernels."""
    supported = torch.accelerator.get_device_capability("phantom:0")["supported_dtypes"]
    candidates = {value for value in vars(torch).values() if isinstance(value, torch.dtype)}
    for dtype in candidates:
        try:
            torch.zeros(2).to(dtype).to(torch.float32)  # the CPU converts it
            cpu_converts = True
        except (RuntimeError, NotImplementedError):
            cpu_converts = False
        assert (dtype in supported) == cpu_converts, dtype
        if dtype in supported:
            host = torch.arange(3, dtype=torch.float32).to(dtype)
            back = host.to("phantom").to(torch.float32).cpu()
            assert torch.equal(back, host.to(torch.float32)), dtype
    for quantized in (torch.qint8, torch.quint8, torch.qint32):
        assert quantized not in supported
        with pytest.raises(NotImplementedError, match="Quantized"):
            torch.empty(2, dtype=quantized, device="phantom")


def test_bf16_is_supported_and_tf32_is_not():
    assert torch.phantom.is_bf16_supported() is True
    assert torch.phantom.is_bf16_supported(including_emulation=False) is True
    x = torch.randn(4, 4, dtype=torch.bfloat16)
    assert torch.equal((x.to("phantom") @ x.to("phantom")).cpu(), x @ x)
    assert torch.phantom.is_tf32_supported() is False


def test_peer_access_between_two_devices(two_devices):
    assert torch.phantom.can_device_access_peer(0, 1) is True
    assert torch.phantom.can_device_access_peer("phantom:1", 0) is True
    assert torch.phantom.can_device_access_peer(0, 0) is False  # as CUDA answers
    x = torch.arange(4.0, device="phantom:0")
    assert torch.equal(x.to("phantom:1").cpu(), torch.arange(4.0))


def test_init_and_the_exception_names():
    torch.phantom.init()
    assert torch.phantom.is_initialized()
    assert torch.phantom.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.phantom.AcceleratorError is torch.AcceleratorError


def test_init_raises_the_drivers_reason_when_there_is_no_device():
    done = run_python(
        "import torch, torch_phantom\n"
        "try:\n"
        "    torch.phantom.init()\n"
        "except RuntimeError as e:\n"
        "    print('raised:', e)\n",
        extra_env={"PHANTOM_DEVICE_COUNT": "0"},
    )
    assert "raised: no phantom device is available" in done.stdout, done.stderr
    # The reason comes from the driver, not from one driver's setting.
    assert "the driver (libphantom" in done.stdout and "reports 0 devices" in done.stdout
    assert "PHANTOM_DEVICE_COUNT" not in done.stdout


# ---------------------------------------------------------------------------
# torch.phantom.memory


def test_memory_submodule_is_reachable_by_every_spelling():
    import torch.phantom.memory as by_import
    from torch.phantom.memory import memory_allocated
    from torch.phantom.streams import Stream

    assert torch.phantom.memory is by_import
    assert memory_allocated is torch.phantom.memory_allocated
    assert Stream is torch.phantom.Stream
    for name in torch.phantom.memory.__all__:
        assert getattr(torch.phantom, name) is getattr(torch.phantom.memory, name), name
    for module in ("streams", "random", "nvtx"):
        assert getattr(torch.phantom, module).__name__ == f"torch_phantom.{module}"


def test_nested_stats_are_the_flat_stats_unflattened():
    x = torch.empty(MiB, dtype=torch.uint8, device="phantom")
    nested = torch.phantom.memory_stats_as_nested_dict()
    flat = torch.phantom.memory_stats()
    assert nested["allocated_bytes"]["all"]["current"] == flat["allocated_bytes.all.current"] >= MiB
    assert nested["oversize_segments"]["peak"] == flat["oversize_segments.peak"]
    assert nested["num_ooms"] == flat["num_ooms"]
    leaves = []

    def walk(prefix, value):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            leaves.append(prefix)

    walk("", nested)
    assert sorted(leaves) == list(flat)
    del x


def test_host_memory_stats_nested_and_reset_accumulated():
    pinned = torch.empty(MiB, dtype=torch.uint8, pin_memory=True)
    nested = torch.phantom.host_memory_stats_as_nested_dict()
    flat = torch.phantom.host_memory_stats()
    assert nested["allocations"]["current"] == flat["allocations.current"] >= 1
    assert flat["allocations.allocated"] >= 1
    torch.phantom.reset_accumulated_host_memory_stats()
    after = torch.phantom.host_memory_stats()
    assert after["allocations.allocated"] == 0 and after["allocations.freed"] == 0
    assert after["allocations.current"] == flat["allocations.current"]
    del pinned


def test_memory_summary_shows_the_allocators_numbers():
    settle()
    # Earlier tests in the process may keep small tensors alive (a module
    # global, a compiled graph's constant): count from what is live now.
    before = torch.phantom.memory_allocated()
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="phantom")
    assert torch.phantom.memory_allocated() == before + 3 * MiB
    summary = torch.phantom.memory_summary()
    lines = summary.splitlines()
    assert "PyTorch phantom memory summary, device ID 0" in lines[1]
    assert all(len(line) == len(lines[0]) for line in lines)
    allocated = next(line for line in lines if line.startswith("| Allocated memory"))
    current = allocated.split("|")[2].strip()
    assert current == f"{(before + 3 * MiB) // 1024} KiB"
    assert "from small pool" in summary
    assert "from small pool" not in torch.phantom.memory_summary(abbreviated=True)
    assert "device ID 1" in torch.phantom.memory_summary(1)
    del x


@pytest.mark.parametrize("name, modern", [
    ("memory_cached", "memory_reserved"),
    ("max_memory_cached", "max_memory_reserved"),
])
def test_deprecated_names_warn_and_answer_like_the_new_ones(name, modern):
    x = torch.empty(MiB, dtype=torch.uint8, device="phantom")
    with pytest.warns(FutureWarning, match=f"`torch.phantom.{name}` has been renamed"):
        value = getattr(torch.phantom, name)()
    assert value == getattr(torch.phantom, modern)()
    del x


@pytest.mark.parametrize("name", ["reset_max_memory_allocated", "reset_max_memory_cached"])
def test_deprecated_resets_warn_and_reset_every_peak(name):
    settle()
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="phantom")
    del x
    settle()
    assert torch.phantom.max_memory_allocated() >= 8 * MiB
    with pytest.warns(FutureWarning, match="resets /all/ peak memory stats"):
        getattr(torch.phantom, name)()
    assert torch.phantom.max_memory_allocated() == torch.phantom.memory_allocated()
    assert torch.phantom.max_memory_reserved() == torch.phantom.memory_reserved()


def test_allocator_backend_is_the_native_caching_allocator():
    assert torch.phantom.get_allocator_backend() == "native"


def test_list_gpu_processes_names_this_process():
    import os

    x = torch.empty(4 * MiB, dtype=torch.uint8, device="phantom")
    listing = torch.phantom.list_gpu_processes().splitlines()
    assert listing[0] == "phantom:0"
    pid, used = listing[1].split()[1], float(listing[1].split()[3])
    assert int(pid) == os.getpid()
    assert used == pytest.approx(torch.phantom.device_memory_used() / MiB, abs=0.001)
    del x


# ---------------------------------------------------------------------------
# The per-process memory fraction


def test_memory_fraction_is_enforced_with_a_clear_error():
    settle()
    assert torch.phantom.get_per_process_memory_fraction() == 1.0
    try:
        torch.phantom.set_per_process_memory_fraction(0.25)
        assert torch.phantom.get_per_process_memory_fraction() == 0.25
        ok = torch.empty(128 * MiB, dtype=torch.uint8, device="phantom")
        # 256 MiB of the 1 GiB device are allowed: 128 + 160 MiB is too much,
        # although the driver has room for it.
        assert torch.phantom.mem_get_info()[0] > 512 * MiB
        with pytest.raises(torch.OutOfMemoryError,
                           match=r"per-process memory fraction 0\.25 .*256\.00 MiB"
                                 r".*set_per_process_memory_fraction"):
            torch.empty(160 * MiB, dtype=torch.uint8, device="phantom")
        # The process goes on: what fits still fits, and other devices are
        # not limited.
        small = torch.ones(64 * MiB, dtype=torch.uint8, device="phantom")
        assert small.sum().item() == 64 * MiB
        if torch.phantom.device_count() > 1:
            assert torch.phantom.get_per_process_memory_fraction(1) == 1.0
            big = torch.empty(512 * MiB, dtype=torch.uint8, device="phantom:1")
            del big
        del ok, small
    finally:
        torch.phantom.set_per_process_memory_fraction(1.0)
    settle()
    big = torch.empty(512 * MiB, dtype=torch.uint8, device="phantom")
    del big


def test_memory_fraction_gives_the_cache_back_before_refusing():
    settle()
    cached = torch.empty(150 * MiB, dtype=torch.uint8, device="phantom")
    del cached  # freed, but kept reserved by the cache
    assert torch.phantom.memory_reserved() >= 150 * MiB
    try:
        torch.phantom.set_per_process_memory_fraction(0.25)
        # Too big for the cached block: a new segment, which fits the
        # 256 MiB only once the cached 150 MiB went back to the driver.
        x = torch.empty(200 * MiB, dtype=torch.uint8, device="phantom")
        assert torch.phantom.memory_reserved() <= 256 * MiB
        del x
    finally:
        torch.phantom.set_per_process_memory_fraction(1.0)


def test_memory_fraction_rejects_bad_values():
    with pytest.raises(TypeError, match="must be `float`"):
        torch.phantom.set_per_process_memory_fraction("0.5")
    with pytest.raises(ValueError, match=r"Invalid fraction value: 1\.5\. Allowed range: 0~1"):
        torch.phantom.set_per_process_memory_fraction(1.5)
    with pytest.raises(ValueError, match="Invalid fraction value: -0.1"):
        torch.phantom.set_per_process_memory_fraction(-0.1)
    assert torch.phantom.get_per_process_memory_fraction() == 1.0


# ---------------------------------------------------------------------------
# The raw allocator and turning the cache off


def test_caching_allocator_alloc_and_delete():
    settle()
    base = torch.phantom.memory_allocated()
    ptr = torch.phantom.caching_allocator_alloc(3 * MiB)
    assert ptr != 0
    assert torch.phantom.memory_allocated() == base + 3 * MiB
    # Another library may copy into it: the pointer is device memory.
    view = torch.phantom.memory_snapshot()
    assert any(b["address"] == ptr and b["state"] == "active_allocated"
               for s in view for b in s["blocks"])
    torch.phantom.caching_allocator_delete(ptr)
    assert torch.phantom.memory_allocated() == base
    with pytest.raises(RuntimeError, match="was not allocated by caching_allocator_alloc"):
        torch.phantom.caching_allocator_delete(ptr)
    assert torch.phantom.caching_allocator_alloc(0) == 0


def test_caching_allocator_alloc_on_a_stream_and_device(two_devices):
    side = torch.phantom.Stream(1)
    ptr = torch.phantom.caching_allocator_alloc(MiB, device=1, stream=side)
    (segment,) = [s for s in torch.phantom.memory_snapshot()
                  if any(b["address"] == ptr for b in s["blocks"])]
    assert segment["device"] == 1
    assert segment["stream"] == side.stream_id
    torch.phantom.caching_allocator_delete(ptr)
    # A driver handle names the stream too.
    ptr = torch.phantom.caching_allocator_alloc(MiB, 1, side.native_handle)
    torch.phantom.caching_allocator_delete(ptr)
    with pytest.raises(ValueError, match="the stream is on phantom:1, not on phantom:0"):
        torch.phantom.caching_allocator_alloc(MiB, device=0, stream=side)
    with pytest.raises(TypeError, match="Invalid type for stream argument"):
        torch.phantom.caching_allocator_alloc(MiB, stream="default")


def test_with_the_cache_off_memory_goes_straight_back_to_the_driver():
    settle()
    free_before = torch.phantom.mem_get_info()[0]
    allocated_before = torch.phantom.memory_allocated()
    reserved_before = torch.phantom.memory_reserved()
    with torch.phantom.caching_allocator_disabled():
        x = torch.arange(MiB, dtype=torch.float32, device="phantom")
        # Not in the cache's statistics (as on CUDA), but taken from the
        # driver.
        assert torch.phantom.memory_allocated() == allocated_before
        assert torch.phantom.mem_get_info()[0] <= free_before - 4 * MiB
        assert x.sum().item() == sum(range(MiB))
        del x
        # Freed: straight back to the driver, nothing cached.
        assert torch.phantom.mem_get_info()[0] == free_before
        assert torch.phantom.memory_reserved() == reserved_before
    y = torch.empty(MiB, device="phantom")
    assert torch.phantom.memory_allocated() == allocated_before + 4 * MiB
    del y


def test_the_cache_off_still_respects_the_memory_fraction():
    settle()
    try:
        torch.phantom.set_per_process_memory_fraction(0.125)
        torch.phantom.caching_allocator_enable(False)
        with pytest.raises(torch.OutOfMemoryError, match="fraction 0.125"):
            torch.empty(200 * MiB, dtype=torch.uint8, device="phantom")
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="phantom")
        del x
    finally:
        torch.phantom.caching_allocator_enable(True)
        torch.phantom.set_per_process_memory_fraction(1.0)


def test_disabled_context_restores_the_setting_when_the_block_raises():
    with pytest.raises(KeyError):
        with torch.phantom.caching_allocator_disabled():
            raise KeyError("boom")
    settle()
    x = torch.empty(MiB, device="phantom")
    assert torch.phantom.memory_allocated() >= 4 * MiB  # cached again
    del x
