"""Memory history of phantom devices, spelled as ``torch.cuda.memory``'s:
``_record_memory_history``, ``_snapshot``, ``_dump_snapshot`` and
``_attach_out_of_memory_observer`` (re-exported by ``torch.phantom.memory``).

The caching allocator records (``device/runtime/AllocatorHistory.cpp``);
a snapshot is the dict ``torch.cuda.memory._snapshot()`` returns, so
``torch.cuda._memory_viz`` (``trace_plot``, ``segment_plot``, ``segsum``,
``trace``, ...) and https://pytorch.org/memory_viz read it unchanged.
docs/profiling.md walks through it.
"""

import pickle as _pickle
import sys as _sys
from typing import Any, Callable, Dict, List, Optional

from . import _C
from ._name import BACKEND_NAME

_ENABLED = (None, "state", "all")
_CONTEXT = {None: 0, "state": 1, "alloc": 2, "all": 3}  # c10 RecordContext
_STACKS = ("python", "all")
# c10::CachingDeviceAllocator::TraceEntry::Action, by name.
_ACTIONS = {
    "alloc": 0,
    "free_requested": 1,
    "free_completed": 2,
    "segment_alloc": 3,
    "segment_free": 4,
    "snapshot": 7,
    "oom": 8,
}


def _record_memory_history(
    enabled: Optional[str] = "all",
    context: Optional[str] = "all",
    stacks: str = "all",
    max_entries: int = _sys.maxsize,
    device=None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: Optional[List[str]] = None,
) -> None:
    """Starts (or stops, ``enabled=None``) recording what the caching
    allocator does, on every phantom device, as
    ``torch.cuda.memory._record_memory_history``:

    - ``enabled``: ``"state"`` keeps the stack that allocated each live
      block; ``"all"`` also keeps a history of every alloc / free_requested
      / free_completed / segment_alloc / segment_free / oom (at most
      ``max_entries``, the oldest dropped first); ``None`` stops and drops
      what was recorded.
    - ``context``: which stacks to keep: ``None`` none, ``"state"`` for live
      blocks, ``"alloc"`` also on allocations in the history, ``"all"``
      also on frees.
    - ``stacks``: ``"python"`` (Python and TorchScript frames) or ``"all"``
      (C++ frames too; slower).
    - ``skip_actions``: action names left out of the history.
    - ``clear_history``: drop the history recorded so far.

    ``device`` is accepted for torch.cuda's signature; recording covers
    every device. ``compile_context`` and ``global_record_annotations``
    (torch.compile and record_function annotations in the history) are not
    recorded on phantom; passing True raises."""
    if isinstance(enabled, bool):
        raise TypeError(
            f"enabled={enabled!r}: pass \"all\" (history and state), \"state\" "
            "(live blocks only) or None (stop); the boolean form is CUDA's "
            f"legacy API, which {BACKEND_NAME} does not have"
        )
    if enabled not in _ENABLED:
        raise ValueError(
            f"enabled={enabled!r} is not one of None, \"state\", \"all\""
        )
    if context not in _CONTEXT:
        raise ValueError(
            f"context={context!r} is not one of None, \"state\", \"alloc\", \"all\""
        )
    if stacks not in _STACKS:
        raise ValueError(f"stacks={stacks!r} is not one of \"python\", \"all\"")
    if (isinstance(max_entries, bool) or not isinstance(max_entries, int)
            or max_entries < 1):
        raise ValueError(
            f"max_entries={max_entries!r}: must be a whole number of at least 1 "
            "(the most history entries kept)"
        )
    if device is not None:
        from .memory import _index

        _index(device)  # a clear error for a device that does not exist
    if compile_context or global_record_annotations:
        raise NotImplementedError(
            "compile_context and global_record_annotations are not recorded "
            f"on {BACKEND_NAME}; leave them False"
        )
    skipped = 0
    for action in skip_actions or []:
        if action not in _ACTIONS:
            raise ValueError(
                f"skip_actions: {action!r} is not an action; the actions are "
                + ", ".join(sorted(_ACTIONS))
            )
        skipped |= 1 << _ACTIONS[action]
    if enabled == "state" and context in ("alloc", "all"):
        context = "state"  # no history to put stacks on
    _C._record_memory_history(
        enabled=enabled is not None,
        trace=enabled == "all",
        context=_CONTEXT[context],
        cpp_frames=stacks == "all",
        max_entries=min(max_entries, 2**63 - 1),
        clear=bool(clear_history),
        skip_actions=skipped,
    )


def _snapshot(device=None, augment_with_fx_traces: bool = False) -> Dict[str, Any]:
    """The allocator's state and recorded history, as
    ``torch.cuda.memory._snapshot()``: ``{"segments": [...], "device_traces":
    [[...] per device], "allocator_settings": {...}}``. Each segment has its
    ``blocks`` in address order, tiling it (``state`` ``active_allocated``,
    ``active_pending_free`` or ``inactive``, and the ``frames`` that
    allocated it while recording); each trace entry has ``action``,
    ``addr`` (``device_free`` for ``oom``), ``size``, ``stream``,
    ``time_us`` and ``frames``. Every device is included (``device`` is
    accepted for torch.cuda's signature)."""
    if device is not None:
        from .memory import _index

        _index(device)
    snapshot = _C._memory_snapshot_full()
    if augment_with_fx_traces:
        from torch.cuda.memory import _augment_memory_snapshot_stack_traces

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def _dump_snapshot(filename: str = "dump_snapshot.pickle",
                   augment_with_fx_traces: bool = False) -> None:
    """Pickles :func:`_snapshot` to ``filename``, which
    https://pytorch.org/memory_viz and ``python -m torch.cuda._memory_viz``
    open."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        _pickle.dump(snapshot, f)


def _attach_out_of_memory_observer(
        observer: Callable[[int, int, int, int], None]) -> None:
    """Calls ``observer(device, requested, allowed, device_free)`` each time
    a phantom allocation fails, before ``torch.OutOfMemoryError`` is
    raised: the device index, the bytes asked for, the bytes this process
    may use on the device (its capacity, or less under
    ``set_per_process_memory_fraction``) and the bytes the driver reports
    free. An observer that raises is reported as unraisable; the
    allocation still raises ``OutOfMemoryError``. Observers stay attached
    for the life of the process (as on CUDA). An allocation made by work
    running on a stream (not by the host) calls no Python observer."""
    if not callable(observer):
        raise TypeError(
            f"observer must be callable as observer(device, requested, "
            f"allowed, device_free), got {type(observer).__name__}"
        )
    _C._attach_out_of_memory_observer(observer)
