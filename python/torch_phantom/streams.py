"""Streams and events of ``torch.phantom``, spelled as ``torch.cuda`` spells
them (see docs/streams.md).

``Stream`` and ``Event`` are thin subclasses of the generic ``torch.Stream``
and ``torch.Event``: those already reach the phantom runtime through the
device guard (``device/runtime/DeviceGuard.cpp``), so a phantom stream made
here, one returned by ``torch.accelerator.current_stream()`` and one made
with ``torch.Stream("phantom")`` are the same stream and compare equal. What
this module adds is what ``torch.cuda`` users expect: the current phantom
device as the default, the current stream as the default of ``record`` and
``wait``, ``priority``, ``torch.phantom.Event`` from ``record_event``, a
reentrant ``with stream:`` and clear errors for what the device does not do.

The current stream is per thread and per device; a thread that never set
one sees each device's default stream.

A driver stream created outside torch (a library calling the HAL's
``ph_stream_create`` itself) becomes a torch stream with
``ExternalStream(handle)`` or ``get_stream_from_external(handle)``: work
queued on it from torch runs in its order. ``Stream.native_handle`` gives
any phantom stream's driver handle.
"""

import threading
from typing import Any, List, Optional, Tuple

import torch

from . import _C
from . import _device_index as _devices  # the one rule for device arguments
from ._name import BACKEND_NAME

__all__ = [
    "Event",
    "ExternalStream",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "get_stream_from_external",
    "set_stream",
    "stream",
]

_DeviceLike = _devices.DeviceLike
_device_index = _devices.device_index

# The id of each device's default stream: the c10 convention, which the
# runtime follows (device/runtime/phantom/Stream.h).
_DEFAULT_STREAM_ID = 0

# torch.Stream.device_type is the number of c10::DeviceType, and the
# backend is PrivateUse1 (a stable value: it is serialized in checkpoints).
_DEVICE_TYPE = 20


def _device_module():
    # device_module imports this module; import it back lazily.
    from . import device_module

    return device_module


def _check_stream(stream: Any, what: str = "stream") -> torch.Stream:
    if not isinstance(stream, torch.Stream):
        raise TypeError(
            f"expected a {BACKEND_NAME} {what} (torch.{BACKEND_NAME}.Stream or "
            f"torch.Stream), got {type(stream).__name__}"
        )
    if stream.device.type != BACKEND_NAME:
        raise ValueError(
            f"expected a stream of a {BACKEND_NAME} device, got a stream of "
            f"'{stream.device}'"
        )
    return stream


def _wrap(stream: torch.Stream) -> "Stream":
    """``stream`` as a ``torch.phantom.Stream`` (the same stream)."""
    if isinstance(stream, Stream):
        return stream
    _check_stream(stream)
    return Stream(
        stream_id=stream.stream_id,
        device_index=stream.device_index,
        device_type=stream.device_type,
    )


# Set by the race detector while it is on (race_detector.py): called as
# observer(method, handle, query) after a query found a stream's or an
# event's work finished (query=True: the host has now seen it finish; the
# runtime calls it for every query through the device guard, torch.Stream's
# and torch.Event's included), or after a synchronize returned
# (query=False: the trace hooks already told it), so it can release the
# pages it protects and report a host access it caught.
_host_observer = None


def _observed(method: str, handle: int, query: bool) -> None:
    observer = _host_observer
    if observer is not None:
        observer(method, handle, query)


class Stream(torch.Stream):
    r"""A phantom stream: an in-order queue of work on one device, run by its
    own worker thread, asynchronously to the host and to other streams.

    Args:
        device (torch.device, str or int, optional): the phantom device of the
            stream; the current device if None.
        priority (int, optional): 0 (the default) or negative; a negative
            priority takes a stream from the high-priority pool. See
            :meth:`priority_range`.

    As in CUDA, streams come from per-device pools and are never destroyed,
    so creating one is cheap and two ``Stream`` objects may name the same
    stream (they then compare equal). Use it as a context manager to make
    it current (and its device current) for a block.
    """

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:
            # Rebuilding an existing stream (stream_id, device_index,
            # device_type), as torch.cuda.Stream allows.
            if kwargs.get("device_type", _DEVICE_TYPE) != _DEVICE_TYPE:
                raise ValueError(
                    f"expected a {BACKEND_NAME} stream, got device_type="
                    f"{kwargs.get('device_type')}"
                )
            kwargs.setdefault("device_type", _DEVICE_TYPE)
            return super().__new__(cls, **kwargs)
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        index = _device_index(device)
        return super().__new__(
            cls, device=torch.device(BACKEND_NAME, index), priority=int(priority)
        )

    @staticmethod
    def priority_range() -> Tuple[int, int]:
        """(lowest, highest) priority, as ``torch.cuda.Stream`` reports it:
        ``(0, -1)``; a numerically smaller priority is more urgent."""
        return tuple(_C._stream_priority_range())

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.device_index, self.stream_id)

    def query(self) -> bool:
        """True when all work queued on the stream so far has finished.
        Never blocks; raises the stream's error if queued work failed."""
        return super().query()

    def synchronize(self) -> None:
        """Blocks until all work queued on the stream so far has finished;
        raises the stream's error if queued work failed."""
        super().synchronize()
        if _host_observer is not None:
            _observed("sync_stream", self.native_handle, False)

    def wait_event(self, event: torch.Event) -> None:
        """Makes work queued on this stream from now on wait for the point
        ``event`` marked when it was last recorded (before this call).
        Returns at once; an event never recorded imposes no wait."""
        if not isinstance(event, torch.Event):
            raise TypeError(f"expected a torch.Event, got {type(event).__name__}")
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Makes work queued on this stream from now on wait for all work
        queued on ``stream`` so far. Returns at once."""
        self.wait_event(_wrap(stream).record_event())

    def record_event(self, event: Optional[torch.Event] = None) -> torch.Event:
        """Records ``event`` (a new ``torch.phantom.Event`` if None) at the
        current end of this stream's queue and returns it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __enter__(self) -> "Stream":
        context = StreamContext(self)
        context.__enter__()
        _with_stack().append(context)
        return self

    def __exit__(self, *exc: Any) -> bool:
        _with_stack().pop().__exit__(*exc)
        return False

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, torch.Stream):
            return super().__eq__(other)
        return NotImplemented

    def __hash__(self) -> int:
        # torch.Stream's hash, so that equal torch.Streams hash equal.
        return super().__hash__()

    def __repr__(self) -> str:
        return (
            f"<torch.{BACKEND_NAME}.Stream device={self.device} "
            f"stream_id={self.stream_id} priority={self.priority}>"
        )


def _external(stream_ptr: Any, device: _DeviceLike) -> Tuple[int, int]:
    """(stream_id, device_index) of the driver stream ``stream_ptr``."""
    if isinstance(stream_ptr, bool) or not isinstance(stream_ptr, int):
        raise TypeError(
            "expected the driver stream handle (ph_stream_t) as an int, got "
            f"{type(stream_ptr).__name__}"
        )
    _device_module()._lazy_init()
    # None takes the stream's own device (the driver knows it); any other
    # device argument follows the package's rule and must be the stream's.
    index = -1 if device is None else _device_index(device)
    return tuple(_C._stream_from_handle(stream_ptr, index))


class ExternalStream(Stream):
    r"""A phantom stream over a driver stream created outside torch.

    Args:
        stream_ptr (int): the driver's stream handle (``ph_stream_t``) as an
            int, e.g. from a library that called ``ph_stream_create``.
        device (torch.device, str or int, optional): the device the stream
            belongs to; the driver is asked, and a wrong device raises. None
            takes the stream's own device.

    Work torch queues on it runs in the stream's order with the owner's
    work. Torch neither creates nor destroys it: keep it alive while torch
    uses it. An error in its work is reported by every synchronization
    until its owner replaces it (the runtime replaces only its own
    streams). Wrapping a handle of one of torch's own streams gives that
    stream.
    """

    def __new__(cls, stream_ptr: int, device: _DeviceLike = None, **kwargs):
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        stream_id, device_index = _external(stream_ptr, device)
        return super().__new__(
            cls, stream_id=stream_id, device_index=device_index,
            device_type=_DEVICE_TYPE,
        )


def get_stream_from_external(data_ptr: int, device: _DeviceLike = None) -> Stream:
    """A :class:`Stream` over the driver stream ``data_ptr`` created outside
    torch (see :class:`ExternalStream`). The owner keeps it alive while
    torch uses it."""
    stream_id, device_index = _external(data_ptr, device)
    return Stream(stream_id=stream_id, device_index=device_index,
                  device_type=_DEVICE_TYPE)


class Event(torch.Event):
    r"""A phantom event: a marker in a stream's queue, to order streams, wait
    for work from the host, and time work.

    Args:
        enable_timing (bool): lets :meth:`elapsed_time` measure time between
            two records of such events (default: False).
        blocking (bool): accepted for compatibility; :meth:`synchronize`
            always blocks the calling thread (without the GIL) on phantom.
        interprocess (bool): the event can be shared with another process
            (:meth:`ipc_handle`, :meth:`from_ipc_handle`, or by sending it
            through ``torch.multiprocessing``), as ``torch.cuda.Event``'s.
            Such an event does not measure time (``enable_timing`` must be
            False), lives on the current device from its creation, and its
            records are shared: a record in either process is the latest
            record for both (docs/multiprocessing.md).

    The driver event is created on the first record, on the recording
    stream's device; after that only streams of that device may record it,
    while streams of any device may wait on it. Each record starts a new
    generation: a wait or query refers to the latest record at its call.
    """

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False,
        interprocess: bool = False,
    ):
        if interprocess and enable_timing:
            raise ValueError(
                f"an interprocess {BACKEND_NAME} event cannot measure time: "
                "create it with enable_timing=False (torch.cuda.Event "
                "requires the same)"
            )
        event = super().__new__(
            cls, BACKEND_NAME, enable_timing=bool(enable_timing),
            blocking=bool(blocking),
        )
        event._enable_timing = bool(enable_timing)
        # The driver's interprocess event (runtime's IpcEvent), made now on
        # the current device: its handle must exist before any record.
        event._ipc = _C._IpcEvent(_device_index(None)) if interprocess else None
        event._ipc_recorded = False
        return event

    @classmethod
    def from_ipc_handle(cls, device: _DeviceLike, handle: bytes) -> "Event":
        """The event another process shared with :meth:`ipc_handle`, on
        ``device`` (the device it was created on there)."""
        if not isinstance(handle, (bytes, bytearray)):
            raise TypeError(
                f"expected the bytes Event.ipc_handle() returned, got "
                f"{type(handle).__name__}"
            )
        index = _device_index(device)
        event = cls()
        event._ipc = _C._IpcEvent(index, bytes(handle))
        event._ipc_recorded = True  # by the process that shared it
        return event

    @property
    def interprocess(self) -> bool:
        return self._ipc is not None

    @property
    def device(self) -> torch.device:
        if self._ipc is not None:
            return torch.device(BACKEND_NAME, self._ipc.device)
        return torch.Event.device.__get__(self)

    @property
    def enable_timing(self) -> bool:
        return self._enable_timing

    @property
    def is_recorded(self) -> bool:
        if self._ipc is not None:
            return self._ipc_recorded
        # The driver event is created on first record (DeviceGuard.cpp).
        return self.event_id != 0

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        """Records the event at the current end of ``stream``'s queue (the
        current stream if None). The stream must be on the event's device."""
        stream = current_stream() if stream is None else _check_stream(stream)
        if self._ipc is not None:
            self._ipc.record(stream.device_index, stream.stream_id)
            self._ipc_recorded = True
            return
        super().record(stream)

    def wait(self, stream: Optional[torch.Stream] = None) -> None:
        """Makes work queued on ``stream`` (the current stream if None) from
        now on wait for this event's latest record. Returns at once."""
        stream = current_stream() if stream is None else _check_stream(stream)
        if self._ipc is not None:
            self._ipc.wait(stream.device_index, stream.stream_id)
            return
        super().wait(stream)

    def query(self) -> bool:
        """True when the recorded point has been reached, or the event was
        never recorded. Never blocks."""
        if self._ipc is not None:
            return self._ipc.query()
        return super().query()

    def synchronize(self) -> None:
        """Blocks until the recorded point has been reached; raises the error
        of the recording stream's work, if it failed."""
        if self._ipc is not None:
            self._ipc.synchronize()
            return
        super().synchronize()
        if _host_observer is not None:
            _observed("sync_event", self.event_id, False)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event's record to ``end_event``'s record.
        Both must have ``enable_timing=True``, be recorded, and be reached
        (``end_event.synchronize()`` first)."""
        if not isinstance(end_event, torch.Event):
            raise TypeError(
                f"expected end_event to be a torch.Event, got "
                f"{type(end_event).__name__}"
            )
        for name, event in (("this event", self), ("end_event", end_event)):
            if isinstance(event, Event) and event.interprocess:
                raise RuntimeError(
                    f"elapsed_time: {name} is an interprocess event, which "
                    "does not measure time; time work with events created "
                    "with enable_timing=True"
                )
            if isinstance(event, Event) and not event.enable_timing:
                raise RuntimeError(
                    f"elapsed_time: {name} was created without timing; create "
                    f"both events with torch.{BACKEND_NAME}.Event("
                    "enable_timing=True)"
                )
            if event.event_id == 0:
                raise RuntimeError(
                    f"elapsed_time: {name} has not been recorded; call "
                    "record() on both events first"
                )
        if end_event.device != self.device:
            raise RuntimeError(
                f"elapsed_time: the events were recorded on different devices "
                f"({self.device} and {end_event.device}); record both on "
                "streams of the same device"
            )
        for name, event in (("this event", self), ("end_event", end_event)):
            if not event.query():
                raise RuntimeError(
                    f"elapsed_time: {name} has been recorded but its work has "
                    "not completed yet; call synchronize() on it first "
                    "(end_event.synchronize() is enough when both are on one "
                    "stream)"
                )
        if type(end_event) is torch.Event:
            try:
                return super().elapsed_time(end_event)
            except ValueError as error:  # torch.Event's own checks
                raise RuntimeError(f"elapsed_time: {error}") from error
        # torch.Event.elapsed_time refuses an end event whose type is a
        # subclass (it checks the exact type); _C makes the same call.
        return _C._event_elapsed_time(
            self.event_id, end_event.event_id, self.device.index
        )

    def ipc_handle(self) -> bytes:
        """The bytes another process passes to :meth:`from_ipc_handle` to
        use this event (an event created with ``interprocess=True``)."""
        if self._ipc is None:
            raise RuntimeError(
                f"this event cannot be shared with another process: create it "
                f"with torch.{BACKEND_NAME}.Event(interprocess=True)"
            )
        return self._ipc.handle()

    def __repr__(self) -> str:
        state = f"device={self.device}" if self.is_recorded else "unrecorded"
        kind = " interprocess" if self.interprocess else ""
        return (
            f"<torch.{BACKEND_NAME}.Event{kind} {state} "
            f"enable_timing={self.enable_timing}>"
        )


def current_stream(device: _DeviceLike = None) -> Stream:
    """The current stream of ``device`` (the current device if None) for
    this thread: what ``torch.accelerator.current_stream`` returns too."""
    return _wrap(torch.accelerator.current_stream(_device_index(device)))


def default_stream(device: _DeviceLike = None) -> Stream:
    """The default stream of ``device`` (the current device if None)."""
    index = _device_index(device)
    return Stream(
        stream_id=_DEFAULT_STREAM_ID,
        device_index=index,
        device_type=_DEVICE_TYPE,
    )


def set_stream(stream: Optional[torch.Stream]) -> None:
    """Makes ``stream`` the current stream of its device for this thread,
    and its device the current device (as ``torch.cuda.set_stream`` and
    ``torch.accelerator.set_stream`` do). None does nothing."""
    if stream is None:
        return
    _check_stream(stream)
    _device_index(stream.device_index)
    torch.accelerator.set_stream(stream)


class StreamContext:
    r"""Context manager that makes ``stream`` current (and its device the
    current device) and, on exit, restores both the previous current
    stream of that device and the previous current device, also when the
    block raises. ``stream=None`` makes it a no-op. Reentrant: the same
    context may be nested."""

    def __init__(self, stream: Optional[torch.Stream]):
        if stream is not None:
            _check_stream(stream)
        self.stream = stream
        self._saved: List[Tuple[int, torch.Stream]] = []

    def __enter__(self) -> Optional[torch.Stream]:
        if self.stream is None:
            return None
        dm = _device_module()
        previous_device = dm.current_device()
        previous_stream = torch.accelerator.current_stream(
            _device_index(self.stream.device_index)
        )
        torch.accelerator.set_stream(self.stream)  # also sets the device
        self._saved.append((previous_device, previous_stream))
        return self.stream

    def __exit__(self, *exc: Any) -> bool:
        if self.stream is None:
            return False
        previous_device, previous_stream = self._saved.pop()
        torch.accelerator.set_stream(previous_stream)
        _C._set_device(previous_device)
        return False


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    """``with torch.phantom.stream(s):`` runs the block with ``s`` current;
    see ``StreamContext``."""
    return StreamContext(stream)


_local = threading.local()


def _with_stack() -> List[StreamContext]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack
