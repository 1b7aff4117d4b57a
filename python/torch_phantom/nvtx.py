"""``torch.phantom.nvtx``: named ranges and marks on the host timeline,
spelled as ``torch.cuda.nvtx`` spells NVIDIA's (so code that annotates its
phases for a profiler runs unchanged on phantom).

``range_push``/``range_pop`` keep a stack of nested ranges per thread;
``range_start``/``range_end`` name ranges that may end on another thread;
``mark`` is an instant. Each call records what happened and when
(``time.perf_counter_ns``) and hands it to the listeners registered with
``_add_listener``. Without a listener the ranges cost a list operation
each.

While a torch profiler records (``torch.profiler.profile``, or the legacy
``torch.autograd.profiler.profile``), each range is also a range of that
profiler, as ``torch.profiler.record_function`` makes one: it appears in
the trace as a ``user_annotation`` named by its message, spanning the ops
queued inside it, and in ``key_averages()``. A ``range_start`` range may
be ended on another thread; a ``mark`` is a range of no length. A range
opened before the profiler started is not in its trace; one still open
when the profiler stops ends when it is popped, as ``record_function``'s do.
"""

import contextlib as _contextlib
import itertools as _itertools
import threading as _threading
import time as _time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch as _torch

__all__ = ["range_push", "range_pop", "range_start", "range_end", "mark", "range"]


class _RangeEvent(NamedTuple):
    """What a listener receives: ``kind`` is ``"push"``, ``"pop"``,
    ``"start"``, ``"end"`` or ``"mark"``; ``message`` the range's or mark's
    text; ``ident`` the depth (push/pop) or range id (start/end), -1 for a
    mark; ``thread`` the calling thread's ident; ``time_ns`` from
    ``time.perf_counter_ns``."""

    kind: str
    message: str
    ident: int
    thread: int
    time_ns: int


_listeners: List[Callable[[_RangeEvent], None]] = []
_local = _threading.local()
# range_start id -> (message, the profiler's range or None)
_open_ranges: Dict[int, Tuple[str, Optional[Any]]] = {}
_open_lock = _threading.Lock()
_next_id = _itertools.count(1)


def _add_listener(listener: Callable[[_RangeEvent], None]) -> Callable[[], None]:
    """Calls ``listener(event)`` for every range and mark from now on (the
    profiler's hook point); returns a function that removes it."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


def _emit(kind: str, message: str, ident: int) -> None:
    if _listeners:
        event = _RangeEvent(kind, message, ident, _threading.get_ident(),
                           _time.perf_counter_ns())
        for listener in list(_listeners):
            listener(event)


def _profiler_range_enter(message: str) -> Optional[Any]:
    """Opens a range of the torch profiler that is recording, if one is
    (the handle record_function keeps), else returns None."""
    if not _torch._C._autograd._profiler_enabled():
        return None
    return _torch.ops.profiler._record_function_enter_new(message, None)


def _profiler_range_exit(handle: Optional[Any]) -> None:
    if handle is not None:
        _torch.ops.profiler._record_function_exit._RecordFunction(handle)


def _stack() -> List[Tuple[str, int, Optional[Any]]]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _text(msg: Any) -> str:
    if not isinstance(msg, str):
        raise TypeError(f"the message must be a str, got {type(msg).__name__}")
    return msg


def range_push(msg: str) -> int:
    """Opens a range named ``msg`` on this thread's stack, nested in the
    open ones; returns its zero-based depth."""
    stack = _stack()
    text = _text(msg)
    stack.append((text, _time.perf_counter_ns(), _profiler_range_enter(text)))
    depth = len(stack) - 1
    _emit("push", msg, depth)
    return depth


def range_pop() -> int:
    """Closes this thread's innermost open range; returns the zero-based
    depth of the range it closed, or -1 if none was open (as NVTX does)."""
    stack = _stack()
    if not stack:
        return -1
    message, _, handle = stack.pop()
    _profiler_range_exit(handle)
    depth = len(stack)
    _emit("pop", message, depth)
    return depth


def range_start(msg: str) -> int:
    """Opens a range named ``msg`` that any thread may close with
    :func:`range_end`; returns its id."""
    ident = next(_next_id)
    text = _text(msg)
    handle = _profiler_range_enter(text)
    with _open_lock:
        _open_ranges[ident] = (text, handle)
    _emit("start", msg, ident)
    return ident


def range_end(range_id: int) -> None:
    """Closes the range :func:`range_start` opened with ``range_id``. An id
    that is not open raises ValueError."""
    with _open_lock:
        opened = _open_ranges.pop(range_id, None)
    if opened is None:
        raise ValueError(
            f"range_end({range_id!r}): no range with this id is open; pass the "
            "id range_start returned, once"
        )
    message, handle = opened
    _profiler_range_exit(handle)
    _emit("end", message, range_id)


def mark(msg: str) -> None:
    """Records an instant named ``msg``."""
    text = _text(msg)
    _profiler_range_exit(_profiler_range_enter(text))
    _emit("mark", text, -1)


@_contextlib.contextmanager
def range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:  # noqa: A001
    """``with range("step {}", i):`` opens a range around the block (the
    message formatted with the extra arguments) and closes it on exit, also
    when the block raises. Usable as a decorator too."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
