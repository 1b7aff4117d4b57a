"""Memory statistics of phantom devices, with the keys ``torch.cuda``
reports (``allocated_bytes.all.current``, ...)."""

from collections import OrderedDict
from typing import Any, Dict, Tuple, Union

import torch

from . import _C

_DeviceLike = Union[torch.device, str, int, None]


def _index(device: _DeviceLike) -> int:
    from .device_module import _get_device_index, _lazy_init

    _lazy_init()
    return _get_device_index(device)


def memory_stats(device: _DeviceLike = None) -> Dict[str, Any]:
    stats = _C._memory_stats(_index(device))
    return OrderedDict(sorted(stats.items()))


def memory_allocated(device: _DeviceLike = None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: _DeviceLike = None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C._reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    _C._reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    _C._empty_cache()


def mem_get_info(device: _DeviceLike = None) -> Tuple[int, int]:
    """(free, total) bytes of device memory."""
    return tuple(_C._mem_get_info(_index(device)))


def memory_snapshot() -> list:
    """Every segment the caching allocator holds, on every device, with its
    blocks: the same shape as ``torch.cuda.memory_snapshot()``'s segments
    (``device``, ``address``, ``total_size``, ``allocated_size``,
    ``active_size``, ``requested_size``, ``stream``, ``segment_type``,
    ``blocks`` of ``address``/``size``/``requested_size``/``state``)."""
    return _C._memory_snapshot()


def host_memory_stats() -> Dict[str, Any]:
    """Statistics of the pinned host memory cache, flattened like
    ``torch.cuda.host_memory_stats()`` (``allocated_bytes.current``, ...)."""
    flat: Dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value

    walk("", _C._host_memory_stats())
    return OrderedDict(sorted(flat.items()))


def empty_host_cache() -> None:
    """Returns cached pinned host memory that no copy still uses."""
    _C._host_empty_cache()


def reset_peak_host_memory_stats() -> None:
    _C._reset_peak_host_memory_stats()


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
