"""``torch.phantom.memory``: the memory API of phantom devices, spelled and
keyed as ``torch.cuda.memory`` (every name here is also ``torch.phantom.X``).

The caching allocator (``device/runtime/DeviceAllocator.cpp``,
docs/allocator.md) keeps memory it got from the driver and carves tensors
out of it. Its statistics use CUDA's keys (``allocated_bytes.all.current``,
...); ``set_per_process_memory_fraction`` caps what it takes from the
driver; ``caching_allocator_enable(False)`` makes every allocation go
straight to the driver, as CUDA's does; ``caching_allocator_alloc`` hands
bare device pointers to other libraries. Pinned host memory has its own
cache (``host_memory_stats``), and so does the host workspace of the fake
device's kernels (``kernel_host_memory_stats``).
"""

import contextlib as _contextlib
import os as _os
import warnings as _warnings
from collections import OrderedDict as _OrderedDict
from typing import Any, Dict, Iterator, Optional, Tuple, Union

import torch as _torch

from . import _C
from ._device_index import device_index as _index  # the one rule for device arguments
from ._name import BACKEND_NAME
from ._memory_history import (  # noqa: F401  (torch.cuda.memory's private API)
    _attach_out_of_memory_observer,
    _dump_snapshot,
    _record_memory_history,
    _snapshot,
)

__all__ = [
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "caching_allocator_disabled",
    "caching_allocator_enable",
    "get_per_process_memory_fraction",
    "set_per_process_memory_fraction",
    "empty_cache",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats",
    "empty_host_cache",
    "kernel_host_memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_cached",
    "max_memory_cached",
    "memory_snapshot",
    "memory_summary",
    "list_gpu_processes",
    "mem_get_info",
    "get_allocator_backend",
]

_DeviceLike = Union[_torch.device, str, int, None]


def _flatten(nested: Dict[str, Any]) -> "_OrderedDict[str, Any]":
    """{"a": {"b": 1}} as {"a.b": 1}, sorted by key (torch.cuda's layout)."""
    flat: Dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value

    walk("", nested)
    return _OrderedDict(sorted(flat.items()))


# ---------------------------------------------------------------------------
# Statistics of the caching allocator.


def memory_stats_as_nested_dict(device: _DeviceLike = None) -> Dict[str, Any]:
    """The caching allocator's statistics of ``device`` as a nested dict:
    ``{"allocated_bytes": {"all": {"current": ..., "peak": ...,
    "allocated": ..., "freed": ...}, "small_pool": ..., "large_pool": ...},
    ..., "num_ooms": ...}``, as ``torch.cuda.memory_stats_as_nested_dict``."""
    return _C._memory_stats(_index(device))


def memory_stats(device: _DeviceLike = None) -> Dict[str, Any]:
    """The caching allocator's statistics of ``device`` (the current device
    if None), flattened with torch.cuda's keys: ``"<stat>.<pool>.<kind>"``
    for ``allocation``, ``segment``, ``active``, ``inactive_split``,
    ``allocated_bytes``, ``reserved_bytes``, ``active_bytes``,
    ``inactive_split_bytes`` and ``requested_bytes`` (pool ``all``,
    ``small_pool`` or ``large_pool``; kind ``current``, ``peak``,
    ``allocated`` or ``freed``), and the counters ``num_alloc_retries``,
    ``num_ooms``, ``num_sync_all_streams``, ``num_device_alloc``,
    ``num_device_free``, ``oversize_allocations.*``, ``oversize_segments.*``
    and ``max_split_size``."""
    return _flatten(memory_stats_as_nested_dict(device))


def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes of device memory the tensors of ``device`` occupy now (rounded
    up to the allocator's block size)."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """The peak of ``memory_allocated(device)`` since the start or the last
    ``reset_peak_memory_stats``."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: _DeviceLike = None) -> int:
    """Bytes the caching allocator holds on ``device``: in use by tensors
    plus cached for reuse."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: _DeviceLike = None) -> int:
    """The peak of ``memory_reserved(device)`` since the start or the last
    ``reset_peak_memory_stats``."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    """Makes every ``peak`` statistic of ``device`` start again from its
    current value."""
    _C._reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    """Zeroes the ``allocated``/``freed`` totals and the counters
    (``num_ooms``, ...) of ``device``."""
    _C._reset_accumulated_memory_stats(_index(device))


def memory_cached(device: _DeviceLike = None) -> int:
    """Deprecated name of :func:`memory_reserved` (warns, as on CUDA)."""
    _warnings.warn(
        f"`torch.{BACKEND_NAME}.memory_cached` has been renamed to "
        f"`torch.{BACKEND_NAME}.memory_reserved`",
        FutureWarning,
        stacklevel=2,
    )
    return memory_reserved(device)


def max_memory_cached(device: _DeviceLike = None) -> int:
    """Deprecated name of :func:`max_memory_reserved` (warns, as on CUDA)."""
    _warnings.warn(
        f"`torch.{BACKEND_NAME}.max_memory_cached` has been renamed to "
        f"`torch.{BACKEND_NAME}.max_memory_reserved`",
        FutureWarning,
        stacklevel=2,
    )
    return max_memory_reserved(device)


def reset_max_memory_allocated(device: _DeviceLike = None) -> None:
    """Deprecated: calls :func:`reset_peak_memory_stats`, which resets every
    peak statistic, and warns so (as on CUDA)."""
    _warnings.warn(
        f"torch.{BACKEND_NAME}.reset_max_memory_allocated now calls "
        f"torch.{BACKEND_NAME}.reset_peak_memory_stats, which resets /all/ peak "
        "memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: _DeviceLike = None) -> None:
    """Deprecated: calls :func:`reset_peak_memory_stats`, which resets every
    peak statistic, and warns so (as on CUDA)."""
    _warnings.warn(
        f"torch.{BACKEND_NAME}.reset_max_memory_cached now calls "
        f"torch.{BACKEND_NAME}.reset_peak_memory_stats, which resets /all/ peak "
        "memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Gives every cached, unused block of every device back to the driver
    (after waiting for the device's streams), and frees the fake kernels'
    cached host workspace. Tensors in use are untouched."""
    _C._empty_cache()


def mem_get_info(device: _DeviceLike = None) -> Tuple[int, int]:
    """(free, total) bytes of ``device``'s memory, as the driver sees it."""
    return tuple(_C._mem_get_info(_index(device)))


def memory_snapshot(mempool_id=None, include_traces: bool = True) -> list:
    """Every segment the caching allocator holds, on every device, with its
    blocks: the same shape as ``torch.cuda.memory_snapshot()``'s segments
    (``device``, ``address``, ``total_size``, ``allocated_size``,
    ``active_size``, ``requested_size``, ``stream``, ``segment_type``,
    ``blocks`` of ``address``/``size``/``requested_size``/``state``/
    ``frames``; the frames are there while :func:`_record_memory_history`
    records). Memory of private pools (graphs', :class:`MemPool`'s) is in
    segments whose ``segment_pool_id`` is the pool's id; ``mempool_id``
    keeps only that pool's. The history itself is in :func:`_snapshot`."""
    del include_traces  # the segments carry no traces (as on CUDA)
    segments = _C._memory_snapshot()
    if mempool_id is None:
        return segments
    wanted = tuple(mempool_id)
    return [s for s in segments if tuple(s["segment_pool_id"]) == wanted]


def _format_bytes(value: int, reference: int) -> str:
    """``value`` in the unit that suits ``reference`` (B, KiB, MiB, ...),
    right-aligned like torch.cuda.memory_summary's columns."""
    units = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    unit = 0
    while unit + 1 < len(units) and reference >= 768 * 1024:
        value //= 1024
        reference /= 1024
        unit += 1
    return f"{value:6d} {units[unit]}"


def _format_count(value: int, reference: int) -> str:
    units = [" ", "K", "M"]
    unit = 0
    while unit + 1 < len(units) and reference >= 750 * 1000:
        value //= 1000
        reference /= 1000
        unit += 1
    return f"{value:7d} {units[unit]} "


def memory_summary(device: _DeviceLike = None, abbreviated: bool = False) -> str:
    """A table of ``device``'s allocator statistics (current, peak, total
    allocated and freed of each), laid out as ``torch.cuda.memory_summary``:
    handy to print after an out-of-memory error. ``abbreviated`` leaves out
    the per-pool rows."""
    index = _index(device)
    stats = memory_stats(index)
    rule, thin = "=" * 75, "-" * 75
    lines = [
        rule,
        f" {'':16} PyTorch {BACKEND_NAME} memory summary, device ID {index:<14d} ",
        thin,
        f"  {'':6} {BACKEND_NAME} OOMs: {stats['num_ooms']:<12d} | {'':3} "
        f"driver alloc retries: {stats['num_alloc_retries']:<8d}   ",
        rule,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    rows = [
        ("allocated_bytes", "Allocated memory", _format_bytes),
        ("active_bytes", "Active memory", _format_bytes),
        ("requested_bytes", "Requested memory", _format_bytes),
        ("reserved_bytes", "Reserved memory", _format_bytes),
        ("inactive_split_bytes", "Non-releasable memory", _format_bytes),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "Reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    pools = [("all", None)]
    if not abbreviated:
        pools += [("large_pool", "      from large pool"),
                  ("small_pool", "      from small pool")]
    kinds = ("current", "peak", "allocated", "freed")
    for key, title, formatter in rows:
        lines.append(thin)
        reference = [stats[f"{key}.all.{kind}"] for kind in kinds]
        for pool, label in pools:
            cells = [
                formatter(stats[f"{key}.{pool}.{kind}"], ref)
                for kind, ref in zip(kinds, reference)
            ]
            lines.append(f" {label or title:<21} | " + " | ".join(cells) + " ")
    for key, title in (("oversize_allocations", "Oversize allocations"),
                       ("oversize_segments", "Oversize segments")):
        lines.append(thin)
        cells = [_format_count(stats[f"{key}.{kind}"], stats[f"{key}.{kind}"])
                 for kind in kinds]
        lines.append(f" {title:<21} | " + " | ".join(cells) + " ")
    lines.append(rule)
    return "|" + "|\n|".join(lines) + "|\n"


def list_gpu_processes(device: _DeviceLike = None) -> str:
    """Which processes use ``device`` and how much of its memory, as
    ``torch.cuda.list_gpu_processes`` prints it. The HAL has no query for
    other processes; a fake device belongs to the process that started
    its driver, so the answer is this process and the device memory in use
    (``device_memory_used``)."""
    index = _index(device)
    used_mib = _C._device_memory_used(index) / (1024 * 1024)
    return (
        f"{BACKEND_NAME}:{index}\n"
        f"process {_os.getpid():>10d} uses {used_mib:>12.3f} MB {BACKEND_NAME} memory"
    )


def get_allocator_backend() -> str:
    """The allocator in use: ``"native"``, phantom's caching allocator (the
    name torch.cuda gives its own; phantom has no other backend)."""
    return "native"


# ---------------------------------------------------------------------------
# Controlling the caching allocator.


def set_per_process_memory_fraction(fraction: float, device: _DeviceLike = None) -> None:
    """Caps what this process's caching allocator may take from ``device``
    at ``fraction`` (0 to 1) of its capacity, as on CUDA. An allocation that
    would pass the cap first makes the allocator give its cached memory
    back, then raises ``torch.OutOfMemoryError`` naming the fraction.
    Memory is taken in segments (2 MiB and up), so a cap below one segment
    refuses even a small tensor."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(
            f"Invalid type for fraction argument, must be `float`, got "
            f"{type(fraction).__name__}"
        )
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(float(fraction), _index(device))


def get_per_process_memory_fraction(device: _DeviceLike = None) -> float:
    """The fraction of ``device``'s capacity this process may use (1.0 unless
    set with :func:`set_per_process_memory_fraction`)."""
    return _C._get_memory_fraction(_index(device))


def caching_allocator_enable(value: bool = True) -> None:
    """Turns the caching allocator on (the default) or off for the process.
    Off, each new allocation comes straight from the driver and goes back
    to it when freed (after the device's streams are waited for), as
    CUDA's uncached allocations do: slower, but a use after free then hits
    memory the driver has taken back. Such allocations are not in
    ``memory_stats`` (as on CUDA); they count towards the per-process
    fraction. Memory cached before stays cached until ``empty_cache()``."""
    _C._caching_allocator_enable(bool(value))


@_contextlib.contextmanager
def caching_allocator_disabled() -> Iterator[None]:
    """``with caching_allocator_disabled():`` runs the block with the caching
    allocator off (see :func:`caching_allocator_enable`) and restores the
    previous setting, also when the block raises."""
    previous = _C._caching_allocator_is_enabled()
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(previous)


def caching_allocator_alloc(size: int, device: _DeviceLike = None, stream=None) -> int:
    """Allocates ``size`` bytes of ``device``'s memory (the current device if
    None) from the caching allocator, for work on ``stream`` (a phantom
    stream, or a driver stream handle as an int; the device's current
    stream if None), and returns its address. For other libraries that
    work on phantom memory; give it back with
    :func:`caching_allocator_delete`. ``size == 0`` gives 0."""
    index = _index(device)
    if stream is None:
        from .streams import current_stream

        stream = current_stream(index)
    if isinstance(stream, _torch.Stream):
        from .streams import _check_stream

        _check_stream(stream)
        if stream.device_index != index:
            raise ValueError(
                f"the stream is on {BACKEND_NAME}:{stream.device_index}, not on "
                f"{BACKEND_NAME}:{index}; pass a stream of the device"
            )
        stream_id = stream.stream_id
    elif isinstance(stream, int) and not isinstance(stream, bool):
        stream_id, _ = _C._stream_from_handle(stream, index)
    else:
        raise TypeError(
            f"Invalid type for stream argument, must be `torch.{BACKEND_NAME}.Stream` "
            "or `int` representing a driver stream handle (ph_stream_t), got "
            f"{type(stream).__name__}"
        )
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    return _C._caching_allocator_raw_alloc(size, index, stream_id)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Gives back memory from :func:`caching_allocator_alloc` (its device and
    stream are remembered). Raises for an address it did not hand out."""
    _C._caching_allocator_raw_delete(int(mem_ptr))


# ---------------------------------------------------------------------------
# Pinned host memory, and the fake kernels' host workspace.


def host_memory_stats_as_nested_dict() -> Dict[str, Any]:
    """Statistics of the pinned host memory cache as a nested dict, as
    ``torch.cuda.host_memory_stats_as_nested_dict``."""
    return _C._host_memory_stats()


def host_memory_stats() -> Dict[str, Any]:
    """Statistics of the pinned host memory cache, flattened like
    ``torch.cuda.host_memory_stats()`` (``allocated_bytes.current``, ...)."""
    return _flatten(host_memory_stats_as_nested_dict())


def empty_host_cache() -> None:
    """Returns cached pinned host memory that no copy still uses."""
    _C._host_empty_cache()


def reset_peak_host_memory_stats() -> None:
    """Makes every ``peak`` statistic of the pinned host memory cache start
    again from its current value."""
    _C._reset_peak_host_memory_stats()


def reset_accumulated_host_memory_stats() -> None:
    """Zeroes the ``allocated``/``freed`` totals and the counters of the
    pinned host memory cache."""
    _C._reset_accumulated_host_memory_stats()


def kernel_host_memory_stats() -> Dict[str, int]:
    """The host memory the fake device's CPU kernels keep for reuse: their
    large outputs and scratch buffers (128 KiB and up) come from a cache, as
    a kernel's workspace comes from an accelerator's caching allocator.
    ``cached_bytes``/``cached_blocks``: free, kept for the next call (at most
    512 MiB; ``empty_cache()`` frees them); ``live_bytes``/``live_blocks``: in
    use; ``reused``/``fresh``: allocations served from the cache or new;
    ``lent``: allocations served from the memory of a device output the host
    had allocated for the result (a scratch buffer of that size may take it
    first, and hand it on when freed); ``in_place``: results a kernel
    computed straight into their device output, so no copy followed."""
    return dict(_C._kernel_host_memory_stats())
