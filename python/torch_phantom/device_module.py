"""``torch.phantom``: the device module, spelled as ``torch.cuda`` spells it.

Devices and synchronisation live here; streams and events, random number
generation and memory statistics come from ``streams.py``, ``random.py`` and
``memory.py`` and are re-exported.
Initialisation is lazy, as for CUDA: the first use of a device (creating a
tensor on it, or calling most functions here) checks that the driver
started and installs the fork guard, so a forked child that touches the
device gets a clear error instead of a hang on worker threads it does not
have.
"""

import threading
from typing import Any, Optional, Union

import torch

from . import _C
from . import faults  # noqa: F401  (torch.phantom.faults)
from ._name import BACKEND_NAME
from .memory import (  # noqa: F401
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    host_memory_stats,
    empty_host_cache,
    kernel_host_memory_stats,
    reset_peak_host_memory_stats,
    memory_stats,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from .streams import (  # noqa: F401
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)
from .random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

_DeviceLike = Union[torch.device, str, int, None]

_initialized = False
_init_lock = threading.Lock()


def is_available() -> bool:
    """True when the driver started and has at least one device."""
    return _C._device_count() > 0


def device_count() -> int:
    """Number of phantom devices (``PHANTOM_DEVICE_COUNT``, default 2)."""
    return _C._device_count()


def _is_in_bad_fork() -> bool:
    """True in a child process forked after this process had initialised
    phantom (as ``torch.cuda._is_in_bad_fork``); such a child cannot use the
    device."""
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    return _initialized and not _is_in_bad_fork()


def _lazy_init() -> None:
    global _initialized
    if is_initialized():
        return
    with _init_lock:
        if is_initialized():
            return
        if _is_in_bad_fork():
            _C._raise_bad_fork()  # the runtime's message (phantom/Device.h)
        if _C._device_count() == 0:
            reason = _C._driver_error() or "PHANTOM_DEVICE_COUNT is 0"
            raise RuntimeError(f"no phantom device is available: {reason}")
        _C._init_runtime()  # registers the runtime's own fork handler
        _C._register_fork_handler()
        _initialized = True


def _get_device_index(device: _DeviceLike, optional: bool = False) -> int:
    """The index named by ``device``; -1 for None when ``optional``."""
    if device is None:
        if optional:
            return -1
        return current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if not isinstance(device, torch.device):
        raise TypeError(
            f"expected a phantom device as an int, str or torch.device, "
            f"got {type(device).__name__}"
        )
    if device.type != BACKEND_NAME:
        raise ValueError(f"expected a {BACKEND_NAME} device, got '{device}'")
    if device.index is None:
        return -1 if optional else current_device()
    return device.index


def current_device() -> int:
    _lazy_init()
    return _C._get_device()


def set_device(device: _DeviceLike) -> None:
    """Makes ``device`` current for this thread; None or -1 does nothing."""
    index = _get_device_index(device, optional=True)
    if index >= 0:
        _lazy_init()
        _C._set_device(index)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all work queued on every stream of ``device``; raises the
    error of any work that failed."""
    _lazy_init()
    _C._synchronize(_get_device_index(device))


class device:
    """Context manager that makes ``device`` current and restores the
    previous device on exit, also when the block raises."""

    def __init__(self, device: _DeviceLike):
        self.idx = _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._exchange_device(self.idx)
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.idx >= 0:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Like ``device``, for the device of a tensor (no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == BACKEND_NAME else -1)


def get_amp_supported_dtype() -> list:
    return [torch.float16, torch.bfloat16]


def __getattr__(name: str):
    # torch.cuda.default_generators: one default generator per device,
    # built on first use so that importing the module starts no driver.
    if name == "default_generators":
        return tuple(_C._default_generator(i) for i in range(_C._device_count()))
    raise AttributeError(f"module 'torch.{BACKEND_NAME}' has no attribute '{name}'")
