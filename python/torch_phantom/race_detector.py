"""The stream race detector: work on two streams that touches the same
device memory without an order between them is reported, naming both ops,
both streams and the line of Python that launched each.

Design. While the detector is on, a dispatch mode sees every op on phantom
tensors before it is queued: which storages it reads and which it writes
(from the op's schema: an argument marked as written, and every output),
and the stream it goes to (the current stream of each tensor's device:
a copy between devices reads on one device's stream and writes on the
other's). Sparse tensors count as their index and value tensors, wrapper
subclasses (jagged nested tensors) as their inner tensors; torch.compile's
tracing and work captured into a graph are not checked. An op that waits
for its own work (``item()``, a copy to host memory, one that synchronizes
its stream while it runs) leaves it finished for the host. The runtime's GPU trace
hooks (torch.phantom._gpu_trace) tell it the rest: events recorded and
waited on, stream, event and device synchronizes (a device's with its
index: torch.phantom.synchronize(i), and the caching allocator's wait for
every stream of a device before it returns cached memory to the driver),
and blocks of device memory allocated and freed. An op that queues its
work on another stream than the current one (a pccl collective, on its
communication stream) says so while it runs (work_queued_on): its accesses
are filed on that stream, ordered after the launching one, and the event
the runtime records behind it carries that order to whoever waits for the
collective (Work.wait, c10's Future). From these it keeps a vector clock per stream
(for each other stream, the last op of it this stream is ordered after),
one per recorded event, and one for the host (what a synchronize has shown
finished). An access is ordered after an earlier one when the accessing
stream's clock, or the host's, covers the earlier op. Storages are keyed
by their base address, so views of one storage at different offsets
conflict as they do on a device.

Three kinds of bug are reported:
  - a write not ordered after an earlier read or write of the same memory
    on another stream, or a read not ordered after an earlier write;
  - memory freed while another stream may still use it, and used again
    before that use is ordered before the new one: the block goes back to
    the allocator for reuse on the stream it was allocated on, an op on
    another stream that touched it is not ordered before the free (a
    missing ``record_stream``), and an op that touches any of those bytes
    after the allocator hands them out again is not ordered after it
    (a missing ``wait_stream``); this is reported at that op
    (torch_phantom/_race_memory.py);
  - host code touching the destination of a ``non_blocking`` copy from the
    device into pinned memory before anything showed the host the copy
    finished. The copy's destination pages are protected (no read, no
    write) when it is queued (phantom/HostGuard.h: only whole pages the
    destination owns, and only on a driver whose copies ignore host page
    protection) and released once the host clock covers the copy: an
    event or stream synchronize or a query answering True
    (torch.phantom.Event / Stream), a device synchronize, or an op that
    waited for that stream. An access in between faults; the fault
    handler records it and unprotects the pages so the program goes on,
    and the detector reports it after the op that touched the memory
    returns (an op on any tensor, CPU ones included), or, for an access
    outside any op (numpy, a buffer), at the next op, synchronize or
    query.

Reports are errors (:class:`StreamRaceError`, raised after the op that
found them was queued) or warnings (:class:`StreamRaceWarning`), by
``enable(action=...)`` or the ``PHANTOM_RACE_DETECTOR`` setting.
Streams are tracked by driver handle; a stream the runtime replaced after
a device error (same stream id, new handle) continues its predecessor's
order. Trace callbacks come from any thread: state changes under one
lock, and frees reported inside a locked section wait for its end.
Activating PyTorch's GPU trace hooks is for the whole process: after the
first ``enable()``, each event, synchronize and allocation costs a call
into Python even when the detector is off again.

This module is the dispatch mode, the trace callbacks and the switches;
the reports are in _race_reports.py, the vector clocks in _race_order.py,
and the tracked memory (live storages, uses of freed blocks) in
_race_memory.py.
"""
import contextlib
import threading
import traceback
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _C, _gpu_trace, streams
from . import device_module as _dm  # torch.<name> (circular: used at call time)
from ._name import BACKEND_NAME
from ._race_memory import _KEPT, _FreedUse, _FreedUses, _Memory, _dense_parts, _span
from ._race_order import _Order
from ._race_reports import (FREED, HOST_ACCESS, UNORDERED, Access, Race, StreamRaceError,
                            StreamRaceWarning, _user_stack)

__all__ = ["enable", "disable", "is_enabled", "detecting", "Access", "Race",
           "StreamRaceError", "StreamRaceWarning"]


@dataclass
class _Guard:
    """A non_blocking copy's destination whose pages are protected until the
    host clock covers the copy (``seq`` of ``stream``)."""

    stream: int
    seq: int
    copy: Access


_HOST_VALUES = ("number", "Scalar", "bool", "int", "float", "complex", "SymInt", "SymFloat", "SymBool")


def _waits_for_device(schema, args, kwargs, results, destinations: List) -> bool:
    """True for an op that returns only once its device work is done: one
    that gives the host a value (``item()``, ``equal``), or a copy into
    host memory other than a ``non_blocking`` one into pinned memory
    (``.cpu()``, ``.tolist()``, ``copy_`` into a CPU tensor). The driver
    waits for these without a traced synchronize. For a ``non_blocking``
    copy into pinned memory, appends its host destinations to
    ``destinations``."""
    if any(str(ret.type) in _HOST_VALUES for ret in schema.returns):
        return True
    written = [value for ret, value in zip(schema.returns, results)
               if ret.alias_info is None or ret.alias_info.is_write]
    for i, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            written.append(args[i] if i < len(args) else kwargs.get(argument.name))
    host = [t for t in written if isinstance(t, torch.Tensor) and t.device.type == "cpu"]
    if not host:
        return False
    non_blocking = kwargs.get("non_blocking", False)
    for i, argument in enumerate(schema.arguments):
        if argument.name == "non_blocking" and i < len(args):
            non_blocking = args[i]
    if non_blocking and all(t.is_pinned() for t in host):
        # (an in-place copy's result is its written argument: once each)
        destinations.extend({id(t): t for t in host}.values())
        return False
    return True




def _stream_name(stream: torch.Stream) -> str:
    return _name_of(stream.device_index, stream.stream_id)


def _name_of(device: int, stream_id: int) -> str:
    kind = "the default stream" if stream_id == 0 else f"stream {stream_id}"
    return f"{kind} of {BACKEND_NAME}:{device}"


# In-place view ops that can touch data: growing a tensor moves its old
# bytes into the new storage.
_RESIZES = (torch.ops.aten.resize_, torch.ops.aten.resize_as_)

# Ops of c10d's functional collectives that hand back the tensor they get
# and touch none of its bytes (their schemas do not say the result is the
# argument): the wait for the collective, whose order the runtime traces
# (Work.wait), and the autograd wrapper of its output. Counting them as a
# read and a write on the current stream would race with the collective
# they stand for.
_CARRIERS = ("wait_tensor", "_wrap_tensor_autograd")
# Functional collectives that clone their input on the launching stream
# and run the collective on the clone: their inputs are read there.
_CLONE_INPUT_FIRST = ("all_reduce", "all_reduce_coalesced", "broadcast")


class _Detector(TorchDispatchMode):
    """The dispatch mode, and the state the trace callbacks update.

    Threads: trace callbacks run on whichever thread allocated, freed or
    synchronized (autograd's device threads, the user's threads). Every
    read or update of the state is a section under one reentrant lock. A
    free reported inside a section of the same thread (the garbage
    collector can free a tensor at any allocation in Python) is deferred
    to the end of that section, so a section never sees the state change
    under it."""

    def __init__(self, action: str) -> None:
        super().__init__()
        self.action = action
        self.order = _Order()
        self.memory: Dict[int, _Memory] = {}
        self.freed_uses = _FreedUses()  # uses of freed blocks still pending
        self.pending: List[Race] = []
        self.lock = threading.RLock()
        self.local = threading.local()  # .depth: sections held; .synced: handles
        self.deferred_frees: List[int] = []
        # A stream the runtime replaced after a device error keeps its
        # (device, stream id) and gets a new driver handle: the old
        # handle's ops are ordered before the new one's.
        self.handles: Dict[tuple, int] = {}  # (device, stream id) -> handle
        self.renamed: Dict[int, int] = {}  # replaced handle -> its successor
        # Protected destinations of non_blocking copies (phantom/HostGuard.h),
        # by guard id.
        self.guards: Dict[int, _Guard] = {}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile traces with fake tensors under its own modes: it
        # compiles with this mode on, and its tracing is not the program's.
        return True

    # -- sections ---------------------------------------------------------------

    @contextlib.contextmanager
    def section(self):
        with self.lock:
            depth = getattr(self.local, "depth", 0)
            self.local.depth = depth + 1
            try:
                yield
            finally:
                self.local.depth = depth
                while depth == 0 and self.deferred_frees:
                    address = self.deferred_frees.pop()
                    self.local.depth = 1
                    try:
                        self._free(address)
                    finally:
                        self.local.depth = 0

    def _handle(self, handle: int) -> int:
        while handle in self.renamed:
            handle = self.renamed[handle]
        return handle

    def _stream(self, stream: torch.Stream) -> int:
        """The handle ``stream`` is tracked by (in a section)."""
        return self._track(stream.device_index, stream.stream_id, stream.native_handle)

    def _track(self, device: int, stream_id: int, handle: int) -> int:
        """The handle stream ``stream_id`` of ``device``, whose driver handle
        is now ``handle``, is tracked by (in a section)."""
        key = (device, stream_id)
        old = self.handles.get(key)
        self.renamed.pop(handle, None)  # a destroyed handle the driver gave out again
        if old is not None and old != handle:
            self.renamed[old] = handle
            self.order.succeed(old, handle)
        self.handles[key] = handle
        return handle

    # -- GPU trace callbacks (any thread, GIL held) --------------------------

    def allocated(self, address: int) -> None:
        stream = _dm.current_stream()
        with self.section():
            if _C._is_current_stream_capturing():
                # A graph's memory: its frees return it to the graph's pool.
                self.memory[address] = _Memory(stream.device_index)
            else:
                self.memory[address] = _Memory(stream.device_index, self._stream(stream),
                                               _stream_name(stream))

    def freed(self, address: int) -> None:
        if getattr(self.local, "depth", 0):
            self.deferred_frees.append(address)  # the section's end frees it
            return
        with self.section():
            self._free(address)

    def _free(self, address: int) -> None:
        """Files the uses of the block that another stream may still be
        making: checked when its bytes are used again (_race_memory.py)."""
        memory = self.memory.pop(address, None)
        if memory is None or memory.stream == 0:
            return
        owner = self._handle(memory.stream)
        recorded = {self._handle(h) for h in memory.recorded}
        for access in memory.accesses:
            stream = self._handle(access.stream)
            if (stream != owner and stream not in recorded
                    and not self.order.ordered(owner, access)):
                self.freed_uses.file(memory.device, _FreedUse(
                    address + access.start, address + access.end, access, address,
                    memory.stream_name))

    def _check_reuse(self, device: int, address: int, access: Access) -> List[Race]:
        """Races between ``access`` (of live memory at ``address``) and the
        filed uses of freed blocks it overlaps; drops the filed uses the
        host has seen finish, those a write ordered after them covers, and
        the one reported (in a section)."""
        races: List[Race] = []
        dropped = []
        start, end = address + access.start, address + access.end
        for use in self.freed_uses.overlapping(device, start, end):
            earlier = use.access
            if self.order.host.get(earlier.stream, 0) >= earlier.seq:
                dropped.append(use)
            elif self.order.ordered(access.stream, earlier):
                if access.write and start <= use.start and use.end <= end:
                    dropped.append(use)
            elif (access.write or earlier.write) and not races:
                races.append(Race(FREED, use.block, access, earlier, use.freed_stream_name))
                dropped.append(use)
        self.freed_uses.drop(device, dropped)
        return races

    def _forget_finished_frees(self) -> None:
        """Drops the filed uses of freed blocks the host has seen finish
        (in a section)."""
        if self.freed_uses:
            host = self.order.host
            self.freed_uses.forget_finished(lambda a: host.get(a.stream, 0) >= a.seq)

    def synchronized(self, method: str, *args) -> None:
        """An event, stream or device synchronize: the host has seen it."""
        synced = getattr(self.local, "synced", None)
        if synced is not None and method != "sync_device":
            # Inside an op: it waits for its own work. A device synchronize
            # inside an op is the allocator's (empty_cache, an out-of-memory
            # retry) while the op allocates, before its own work is queued:
            # it covers what came before the op, applied below.
            synced.append(args[0] if method == "sync_stream" else None)
        with self.section():
            if method == "sync_device":
                self.order.sync_streams(self._streams_of(args[0]))
            else:
                getattr(self.order, method)(*args)
            self._release_seen()
            self._forget_finished_frees()

    def _streams_of(self, device: int) -> List[int]:
        """The handles a synchronize of ``device`` waited for (in a
        section): its streams, and the streams whose device is not known
        (one that only waited on an event or was recorded on, launching
        nothing): counting those may hide a race, never invent one."""
        devices = {handle: index for (index, _), handle in self.handles.items()}
        return [handle for handle in self.order.streams
                if devices.get(self._handle(handle), device) == device]

    def observed(self, method: str, handle: int, query: bool) -> None:
        """After torch.phantom's synchronize or a query that answered True
        (streams.py): a query shows the host the work finished, as a
        synchronize does; then host accesses caught so far are reported."""
        if query:
            with self.section():
                getattr(self.order, method)(*((handle,) if method != "sync_device" else ()))
                self._release_seen()
                self._forget_finished_frees()
        self._report_host_accesses(None)

    def work_queued_on(self, after: int, device: int, stream_id: int, handle: int) -> None:
        """The op being dispatched on this thread queues its work on stream
        ``stream_id`` of ``device`` (driver handle ``handle``), ordered after
        what is queued so far on the stream with handle ``after``: pccl's
        collectives run on its communication stream that way. That stream
        is ordered after ``after`` now, and the op is launched on it now
        (before the runtime records the events that stand for the
        collective's end): its accesses are filed there by ``_launched``.
        Outside an op seen by the detector only the order is kept."""
        runs_on = getattr(self.local, "runs_on", None)
        with self.section():
            stream = self._track(device, stream_id, handle)
            self.order.wait_stream(stream, self._handle(after))
            if runs_on is not None and device not in runs_on:
                # (several calls of one op: the first launch, which every
                # event recorded behind any of them covers)
                runs_on[device] = (stream, _name_of(device, stream_id),
                                   self.order.launch(stream))

    def recorded_on(self, address: int, handle: int) -> None:
        """C++ recorded stream ``handle`` on the block at ``address`` through
        the device guard (c10's Future does, for the streams its callbacks
        run on): as ``record_stream``, the block is held back for it."""
        with self.section():
            memory = self.memory.get(address)
            if memory is not None:
                memory.recorded.add(self._handle(handle))

    # -- protected destinations of non_blocking copies ---------------------

    def _guard(self, destinations: List[torch.Tensor], device: int,
               launched: tuple, op: str, stack: traceback.StackSummary) -> None:
        """Protects the destinations of a non_blocking copy just queued (in
        a section)."""
        if not _GUARD_COPIES:
            return
        if not _C._host_guard_available(device):
            _note_unguarded(device)
            return
        stream, name, seq = launched
        for tensor in destinations:
            # (only a destination written by one asynchronous copy: dense,
            # not conjugated or negated; 0 when nothing was protected)
            guard = _C._host_guard_protect(tensor)
            if guard:
                start = tensor.storage_offset() * tensor.element_size()
                access = Access(True, seq, stream, name, op, ["the destination"], stack,
                                start, start + tensor.nbytes)
                self.guards[guard] = _Guard(stream, seq, access)

    def _release_seen(self) -> None:
        """Unprotects the destinations of copies the host has now seen
        finish; an access caught on one becomes a pending report (in a
        section)."""
        if not self.guards:
            return
        for guard, state in list(self.guards.items()):
            if self.order.host.get(state.stream, 0) >= state.seq:
                del self.guards[guard]
                address = _C._host_guard_release(guard)
                if address:
                    self.pending.append(Race(HOST_ACCESS, address, None, state.copy,
                                             noticed_at=_user_stack()))

    def _host_accesses(self, op: Optional[str]) -> List[Race]:
        """Races for the host accesses the fault handler caught since the
        last look; ``op`` is the op that just ran, if any (in a section)."""
        races = []
        for guard, address in _C._host_guard_take_violations():
            state = self.guards.pop(guard, None)
            if state is not None:
                reader = (Access(False, 0, 0, "the host", op, [], _user_stack())
                          if op else None)
                races.append(Race(HOST_ACCESS, address, reader, state.copy,
                                  noticed_at=None if op else _user_stack()))
        return races

    def _report_host_accesses(self, op: Optional[str]) -> None:
        """Reports now the host accesses caught, and the ones found when
        their pages were released."""
        with self.section():
            races = self._host_accesses(op) if self.guards else []
            kept = []
            for race in self.pending:
                (races if race.kind == HOST_ACCESS else kept).append(race)
            self.pending = kept
        if races:
            self._report(races)

    def ordering(self, method: str, *args) -> None:
        with self.section():
            getattr(self.order, method)(*args)

    # -- ops ------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():  # tracing, not running
            return func(*args, **kwargs)
        if func is torch.ops.aten.record_stream.default:
            tensor, stream = args
            # (a stream of another device is the op's to refuse, with its message)
            if tensor.device.type == BACKEND_NAME and stream.device.type == BACKEND_NAME:
                with self.section():
                    handle = self._stream(stream)
                    for part in _dense_parts(tensor):
                        memory = self.memory.get(part.untyped_storage().data_ptr())
                        if memory is not None:
                            memory.recorded.add(handle)
            return func(*args, **kwargs)
        if func.namespace == "_c10d_functional" and func._opname in _CARRIERS:
            return func(*args, **kwargs)
        if torch.Tag.inplace_view in func.tags and func.overloadpacket not in _RESIZES:
            # set_, unsqueeze_, as_strided_, ...: change a tensor's view of
            # its storage (set_ rebinds it), touching none of its bytes.
            return func(*args, **kwargs)
        # (device, address, start, end) -> [written, names]
        touched: Dict[tuple, List] = {}

        def note(value, write: bool, name: str) -> None:
            if isinstance(value, torch.Tensor):
                if value.device.type != BACKEND_NAME:
                    return
                for part in _dense_parts(value):
                    address = part.untyped_storage().data_ptr()
                    start, end = _span(part)
                    if address and end > start:
                        key = (part.device.index, address, start, end)
                        entry = touched.setdefault(key, [False, []])
                        entry[0] = entry[0] or write
                        entry[1].append(name)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    note(item, write, name)

        schema = func._schema
        for i, argument in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            alias = argument.alias_info
            if alias is not None and not alias.is_write:
                continue  # a view: shares memory, touches no data
            note(value, alias is not None and alias.is_write, f"argument '{argument.name}'")
        outer = getattr(self.local, "synced", None)
        outer_runs_on = getattr(self.local, "runs_on", None)
        self.local.synced = synced = []
        self.local.runs_on = runs_on = {}  # device -> (stream, name, seq)
        try:
            outputs = func(*args, **kwargs)
        finally:
            self.local.synced = outer
            self.local.runs_on = outer_runs_on
            if outer is not None:
                outer.extend(synced)
        host_races: List[Race] = []
        if self.guards:  # the op may have touched a protected destination
            with self.section():
                host_races = self._host_accesses(str(func))
        results = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
        for ret, value in zip(schema.returns, results):
            if ret.alias_info is None or ret.alias_info.is_write:
                note(value, True, "the output")
        # Work captured into a graph does not run now (a replay is not seen
        # op by op).
        if touched and not _C._is_current_stream_capturing():
            destinations: List[torch.Tensor] = []
            if _waits_for_device(schema, args, kwargs, results, destinations):
                synced.append(None)
            reads_here = (func.namespace == "_c10d_functional"
                          and func._opname in _CLONE_INPUT_FIRST)
            self._launched(str(func), touched, synced, destinations, host_races, runs_on,
                           reads_here)
        elif host_races:
            self._report(host_races)
        return outputs

    def _launched(self, op: str, touched: Dict[tuple, List], synced: List,
                  destinations: List[torch.Tensor] = (),
                  host_races: List[Race] = (), runs_on: Optional[Dict] = None,
                  reads_here: bool = False) -> None:
        """Records the op's accesses: each on the current stream of the
        tensor's device (a copy between devices reads on one and writes on
        the other), or on the stream the op said it queued its work on
        (``runs_on``, from work_queued_on: a collective's communication
        stream), except, with ``reads_here``, what it only reads. An op
        that synchronized its stream (or the device) while it ran waited
        for its own work: the host has seen it."""
        runs_on = runs_on or {}

        def elsewhere(device: int, write: bool) -> bool:
            return device in runs_on and (write or not reads_here)

        streams = {key[0]: _dm.current_stream(key[0])
                   for key, (write, _) in touched.items() if not elsewhere(key[0], write)}
        stack = _user_stack()
        races: List[Race] = list(host_races)
        with self.section():
            races += self.pending
            self.pending = []
            launched = {}
            for device, stream in streams.items():
                handle = self._stream(stream)
                launched[device] = (handle, _stream_name(stream), self.order.launch(handle))
            reported: Set[int] = set()
            for (device, address, start, end), (write, names) in touched.items():
                stream, name, seq = (runs_on if elsewhere(device, write) else launched)[device]
                memory = self.memory.get(address)
                if memory is None:  # allocated before the detector was on
                    memory = self.memory[address] = _Memory(device)
                access = Access(write, seq, stream, name, op, names, stack, start, end)
                if self.freed_uses and address not in reported:
                    reuse_races = self._check_reuse(device, address, access)
                    if reuse_races:
                        races += reuse_races
                        reported.add(address)
                for previous in memory.accesses:
                    if (address not in reported and self._handle(previous.stream) != stream
                            and (write or previous.write) and previous.overlaps(access)
                            and not self.order.ordered(stream, previous)):
                        races.append(Race(UNORDERED, address, access, previous))
                        reported.add(address)
                kept = [p for p in memory.accesses
                        if not (write and access.covers(p) and self.order.ordered(stream, p))
                        and self.order.host.get(p.stream, 0) < p.seq]
                kept.append(access)
                memory.accesses = kept[-_KEPT:]
            if synced:
                synced_handles = {self._handle(h) for h in synced if h is not None}
                for stream, _, seq in [*launched.values(), *runs_on.values()]:
                    if None in synced or stream in synced_handles:
                        self.order.finished(stream, seq)
                self._release_seen()
                self._forget_finished_frees()
                races += self.pending
                self.pending = []
            if destinations and launched:
                device = next(iter(launched))
                self._guard(destinations, device, launched[device], op, stack)
        if races:
            self._report(races)

    def _report(self, races: List[Race]) -> None:
        if self.action == "warn":
            for race in races:
                warnings.warn(str(race), StreamRaceWarning, stacklevel=4)
        else:
            raise StreamRaceError(races)


_active: Optional[_Detector] = None
_trace_on = False
# Protect non_blocking copies' destinations (bench/bench_race_detector.py
# turns it off to measure what the guard costs).
_GUARD_COPIES = True
_unguarded_noted: Set[int] = set()


def _note_unguarded(device: int) -> None:
    """Once per device: its driver does not declare that copies ignore host
    page protection, so non_blocking copies' destinations go unwatched."""
    if device in _unguarded_noted:
        return
    _unguarded_noted.add(device)
    warnings.warn(
        f"{BACKEND_NAME} race detector: the driver of {BACKEND_NAME}:{device} does not declare "
        f"that its copies ignore host page protection (PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION), "
        f"so host accesses to a non_blocking copy's destination before the copy is seen "
        f"to finish are not watched on it; stream races still are.", UserWarning, stacklevel=2)


def _observe(method: str, handle: int, query: bool) -> None:
    detector = _active
    if detector is not None:
        detector.observed(method, handle, query)


def _work_queued_on(after: int, device: int, stream_id: int, handle: int) -> None:
    detector = _active
    if detector is not None:
        detector.work_queued_on(after, device, stream_id, handle)


def _recorded_on(address: int, handle: int) -> None:
    detector = _active
    if detector is not None:
        detector.recorded_on(address, handle)


def _forward(method: str, *bound):
    def callback(*args):
        detector = _active
        if detector is not None:
            getattr(detector, method)(*bound, *args)
    return callback


def _activate_trace() -> None:
    global _trace_on
    if _trace_on:
        return
    _trace_on = True
    _gpu_trace.register_callback_for_memory_allocation(_forward("allocated"))
    _gpu_trace.register_callback_for_memory_deallocation(_forward("freed"))
    _gpu_trace.register_callback_for_event_record(_forward("ordering", "record"))
    _gpu_trace.register_callback_for_event_wait(_forward("ordering", "wait"))
    _gpu_trace.register_callback_for_stream_synchronization(
        _forward("synchronized", "sync_stream"))
    _gpu_trace.register_callback_for_event_synchronization(
        _forward("synchronized", "sync_event"))
    # The callbacks that name the device: a synchronize of one device (or
    # the allocator's wait for its streams) orders only that device's work.
    _gpu_trace.register_callback_for_device_synchronization_with_index(
        _forward("synchronized", "sync_device"))
    torch._C._activate_gpu_trace()


def _report_pending() -> None:
    """Reports now the host accesses to non_blocking copies' destinations
    caught outside any op since the last op (a test suite calls it at the
    end of each test, so a report names the test that caused it)."""
    detector = _active
    if detector is None:
        return
    with detector.section():
        races = detector._host_accesses(None) if detector.guards else []
        races += detector.pending
        detector.pending = []
    if races:
        detector._report(races)


def enable(action: str = "error") -> None:
    """Turns the detector on for the rest of the process (or until
    :func:`disable`). ``action`` is "error" (raise :class:`StreamRaceError`)
    or "warn" (warn :class:`StreamRaceWarning`). Memory allocated before
    this call is tracked from its first use after it."""
    global _active
    if action not in ("error", "warn"):
        raise ValueError(f"race detector action must be 'error' or 'warn', got {action!r}")
    if _active is not None:
        _active.action = action
        return
    _activate_trace()  # the device is initialised by its first use, not here
    detector = _Detector(action)
    detector.__enter__()
    _active = detector
    streams._host_observer = _observe
    _C._set_query_observer(streams._observed)  # torch.Stream/Event queries too
    _C._set_record_stream_observer(_recorded_on)  # c10's Future records streams
    _C._set_work_stream_observer(_work_queued_on)  # pccl's collectives


def disable() -> None:
    """Turns the detector off; what it tracked is forgotten."""
    global _active
    detector, _active = _active, None
    if detector is not None:
        streams._host_observer = None
        _C._set_query_observer(None)
        _C._set_record_stream_observer(None)
        _C._set_work_stream_observer(None)
        detector.__exit__(None, None, None)
        for guard in list(detector.guards):  # nothing stays protected
            _C._host_guard_release(guard)
        detector.guards.clear()


def is_enabled() -> bool:
    """True while the detector is on."""
    return _active is not None


class detecting:
    """``with torch.phantom.race_detector.detecting():`` — the detector on
    for a block (and off after it, unless it was on before)."""

    def __init__(self, action: str = "error") -> None:
        self.action = action
        self.was_on = False

    def __enter__(self) -> "detecting":
        self.was_on = is_enabled()
        enable(self.action)
        return self

    def __exit__(self, *exc) -> None:
        if not self.was_on:
            disable()


def _enable_from_setting(level: int) -> None:
    if level:
        enable("warn" if level == 1 else "error")
