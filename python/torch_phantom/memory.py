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
