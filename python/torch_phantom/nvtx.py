"""``torch.phantom.nvtx``: named ranges and marks on the host timeline,
spelled as ``torch.cuda.nvtx`` spells NVIDIA's (so code that annotates its
phases for a profiler runs unchanged on phantom).

``range_push``/``range_pop`` keep a stack of nested ranges per thread;
``range_start``/``range_end`` name ranges that may end on another thread;
``mark`` is an instant. Each call records what happened and when
(``time.perf_counter_ns``) and hands it to the listeners registered with
``_add_listener``: this is where a profiler with a device timeline
subscribes. Without a listener the ranges cost a list operation each.
"""

import contextlib as _contextlib
import itertools as _itertools
import threading as _threading
import time as _time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Tuple

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
_open_ranges: Dict[int, str] = {}  # range_start id -> message
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


def _stack() -> List[Tuple[str, int]]:
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
    stack.append((_text(msg), _time.perf_counter_ns()))
    depth = len(stack) - 1
    _emit("push", msg, depth)
    return depth


def range_pop() -> int:
    """Closes this thread's innermost open range; returns the zero-based
    depth of the range it closed, or -1 if none was open (as NVTX does)."""
    stack = _stack()
    if not stack:
        return -1
    message, _ = stack.pop()
    depth = len(stack)
    _emit("pop", message, depth)
    return depth


def range_start(msg: str) -> int:
    """Opens a range named ``msg`` that any thread may close with
    :func:`range_end`; returns its id."""
    ident = next(_next_id)
    with _open_lock:
        _open_ranges[ident] = _text(msg)
    _emit("start", msg, ident)
    return ident


def range_end(range_id: int) -> None:
    """Closes the range :func:`range_start` opened with ``range_id``. An id
    that is not open raises ValueError."""
    with _open_lock:
        message = _open_ranges.pop(range_id, None)
    if message is None:
        raise ValueError(
            f"range_end({range_id!r}): no range with this id is open; pass the "
            "id range_start returned, once"
        )
    _emit("end", message, range_id)


def mark(msg: str) -> None:
    """Records an instant named ``msg``."""
    _emit("mark", _text(msg), -1)


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
