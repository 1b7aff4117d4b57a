"""``torch.phantom``: the device module, spelled as ``torch.cuda`` spells it.

Devices, initialisation and synchronisation live here. Streams and events
(``streams.py``), random number generation (``random.py``), memory
(``memory.py``), device properties (``_device_info.py``), the state the
driver measures (``_device_state.py``) and profiler ranges (``nvtx.py``)
come from their modules and are re-exported; ``torch.phantom.memory``,
``.streams``, ``.random`` and ``.nvtx`` are those modules, as in
``torch.cuda``. ``docs/api-coverage.md`` lists every name of
``torch.cuda.__all__`` with phantom's answer.

Initialisation is lazy, as for CUDA: the first use of a device (creating a
tensor on it, or calling most functions here) checks that the driver
started and installs the fork guard, so a forked child that touches the
device gets a clear error instead of a hang on worker threads it does not
have.
"""

import os as _os
import threading as _threading
from typing import Any as _Any
from typing import Union as _Union

import torch as _torch

from . import _C
from . import memory, nvtx, random, streams
from . import _gpu_trace  # torch.phantom._gpu_trace: what c10's GPU trace hooks call
from . import race_detector
from ._name import BACKEND_NAME as _BACKEND_NAME
from ._device_index import device_index as _device_index
from ._device_info import (
    can_device_access_peer,
    get_device_capability,
    get_device_name,
    get_device_properties,
    is_bf16_supported,
    is_tf32_supported,
)
from ._device_state import (
    clock_rate,
    device_memory_used,
    memory_usage,
    power_draw,
    temperature,
    utilization,
)
from .memory import (
    caching_allocator_alloc,
    caching_allocator_delete,
    caching_allocator_disabled,
    caching_allocator_enable,
    empty_cache,
    empty_host_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    kernel_host_memory_stats,
    list_gpu_processes,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .random import (
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
from . import graphs
from .graphs import (
    Graph,
    PhantomGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from .mempool import MemPool, use_mem_pool
from .streams import (
    Event,
    ExternalStream,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    get_stream_from_external,
    set_stream,
    stream,
)

__all__ = [
    # Devices and initialisation
    "is_available", "device_count", "current_device", "set_device", "device",
    "device_of", "init", "is_initialized", "synchronize",
    "get_device_properties", "get_device_name", "get_device_capability",
    "can_device_access_peer", "is_bf16_supported", "is_tf32_supported",
    "get_amp_supported_dtype", "has_half", "OutOfMemoryError", "AcceleratorError",
    "set_sync_debug_mode", "get_sync_debug_mode", "ipc_collect",
    # Streams and events
    "Stream", "ExternalStream", "Event", "StreamContext", "stream",
    "current_stream", "default_stream", "set_stream",
    "get_stream_from_external", "race_detector",
    # Graphs
    "Graph", "PhantomGraph", "graph", "graph_pool_handle",
    "is_current_stream_capturing", "make_graphed_callables",
    "MemPool", "use_mem_pool",
    # Random numbers
    "default_generators", "get_rng_state", "get_rng_state_all",
    "set_rng_state", "set_rng_state_all", "manual_seed", "manual_seed_all",
    "seed", "seed_all", "initial_seed",
    # Memory
    "empty_cache", "memory_stats", "memory_stats_as_nested_dict",
    "memory_summary", "memory_snapshot", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_cached", "max_memory_cached", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_max_memory_cached", "mem_get_info", "list_gpu_processes",
    "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "caching_allocator_alloc", "caching_allocator_delete",
    "caching_allocator_enable", "caching_allocator_disabled",
    "get_allocator_backend", "host_memory_stats",
    "host_memory_stats_as_nested_dict", "reset_peak_host_memory_stats",
    "reset_accumulated_host_memory_stats", "empty_host_cache",
    "kernel_host_memory_stats",
    # Device state
    "device_memory_used", "memory_usage", "utilization", "temperature",
    "power_draw", "clock_rate",
    # Submodules
    "memory", "streams", "random", "nvtx", "graphs",
]

_DeviceLike = _Union[_torch.device, str, int, None]

# The exceptions phantom raises, under torch.cuda's names for them.
OutOfMemoryError = _torch.OutOfMemoryError
AcceleratorError = _torch.AcceleratorError

# torch.cuda's legacy flag: float16 tensors work on the device.
has_half = True

_initialized = False
_init_lock = _threading.Lock()


def is_available() -> bool:
    """True when the driver started and has at least one device."""
    return _C._device_count() > 0


def device_count() -> int:
    """Number of devices the driver has (0 when it did not start)."""
    return _C._device_count()


def _is_in_bad_fork() -> bool:
    """True in a child process forked after this process had initialised
    phantom (as ``torch.cuda._is_in_bad_fork``); such a child cannot use the
    device."""
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    """True once this process has initialised phantom (the first use of a
    device, or :func:`init`), and is not a child forked after that."""
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
            raise RuntimeError(f"no {_BACKEND_NAME} device is available: {_no_device_reason()}")
        _C._init_runtime()  # registers the runtime's own fork handler
        _C._register_fork_handler()
        _initialized = True


def _no_device_reason() -> str:
    """Why the driver offers no device: its start-up error when it failed
    to start, else that the driver it loaded reports none (how many devices
    a driver offers is the driver's setting: the fake's is in
    docs/fake-driver.md)."""
    error = _C._driver_error()
    if error:
        return error
    library = _os.path.basename(_C._hal_info()["driver_library"]) or "driver"
    return f"the driver ({library}) reports 0 devices"


def init() -> None:
    """Initialises phantom now rather than at the first use of a device:
    checks that the driver started (raising its reason if not) and installs
    the fork guard. Does nothing if already initialised."""
    _lazy_init()


def current_device() -> int:
    """The index of this thread's current phantom device (0 until set)."""
    _lazy_init()
    return _C._get_device()


def set_device(device: _DeviceLike) -> None:
    """Makes ``device`` current for this thread; a negative index does
    nothing, and None names the current device (so changes nothing)."""
    index = _device_index(device, negative_selects_nothing=True)
    if index >= 0:
        _C._set_device(index)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all work queued on every stream of ``device``; raises the
    error of any work that failed."""
    _C._synchronize(_device_index(device))
    if streams._host_observer is not None:  # the race detector is on
        streams._observed("sync_device", 0, False)


class device:
    """Context manager that makes ``device`` current and restores the
    previous device on exit, also when the block raises."""

    def __init__(self, device: _DeviceLike):
        self.idx = _device_index(device, negative_selects_nothing=True)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._exchange_device(self.idx)
        return self

    def __exit__(self, *exc: _Any) -> bool:
        if self.idx >= 0:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Like ``device``, for the device of a tensor (no-op for CPU tensors)."""

    def __init__(self, obj: _torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == _BACKEND_NAME else -1)


def get_amp_supported_dtype() -> list:
    """The dtypes ``torch.autocast("phantom", dtype=...)`` accepts (torch's
    autocast asks the device module): float16 and bfloat16."""
    return [_torch.float16, _torch.bfloat16]


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: _Union[int, str]) -> None:
    """With ``"warn"`` (1) every operation that makes the host wait for the
    device warns, naming the operation and why it waits; with ``"error"``
    (2) it raises instead, before waiting; ``"default"`` (0) turns that off.
    The waits: ``.item()`` and other reads of a value, copies to and from
    pageable host memory (``.cpu()``, ``.tolist()``), blocking copies with
    pinned memory, copies between devices, ops whose outputs depend on the
    data (``nonzero``), and the ops phantom computes on the host and waits
    for. Explicit ``synchronize()`` calls are not reported, as on CUDA.
    For the whole process."""
    _lazy_init()
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError(
                "invalid value of debug_mode, expected one of `default`, "
                f"`warn`, `error`, got {debug_mode!r}"
            )
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    if isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
        raise TypeError(
            f"debug_mode must be a str or an int, got {type(debug_mode).__name__}"
        )
    _C._set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    """The sync debug mode in force: 0 (default), 1 (warn) or 2 (error)."""
    _lazy_init()
    return _C._get_sync_debug_mode()


def ipc_collect() -> None:
    """Frees device memory this process sent to other processes that have
    stopped using it (as ``torch.cuda.ipc_collect``; docs/multiprocessing.md).
    The sender keeps a sent block alive until every receiver has released
    it; the caching allocator also collects before it reports out of
    memory."""
    _lazy_init()
    _C._ipc_collect()


def __getattr__(name: str):
    # torch.cuda.default_generators: one default generator per device,
    # built on first use so that importing the module starts no driver.
    if name == "default_generators":
        return tuple(_C._default_generator(i) for i in range(_C._device_count()))
    raise AttributeError(f"module 'torch.{_BACKEND_NAME}' has no attribute '{name}'")
