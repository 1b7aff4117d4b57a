"""The memory the race detector tracks (torch_phantom/race_detector.py).

Live storages, keyed by their device address, each with the accesses a
later one might race with (:class:`_Memory`); which bytes of its storage a
tensor spans, and which dense tensors a sparse or wrapper tensor is made
of. And the uses of freed blocks still pending (:class:`_FreedUses`).

Frees are checked at reuse. A block freed on the stream it was allocated
on goes back to that stream's pool and is handed out again to an
allocation there, whole or split, or merged with its neighbours. A use
of it on another stream that was not ordered before the free (and not
declared with ``record_stream``) is harmless as long as whatever touches
those bytes next is ordered after it: CUDA's caching allocator gives the
same guarantee, and FSDP2 relies on it (it frees reduce-scatter outputs
read by the default stream and makes the reduce-scatter stream wait for
the default stream before it allocates again). So the free files such
uses here by the device address range they touched, and each later
access to live memory is checked against the filed uses it overlaps: one
whose stream is not ordered after a filed use (either side writing) is
the race. A filed use is dropped once the host has seen it finish, or
once a write ordered after it covers its bytes (later accesses of those
bytes are then checked against that write, as accesses of live memory).
"""
import bisect
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Set

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ._race_reports import Access


class _Memory:
    """Per storage: the device and stream it was allocated on, and the
    accesses that a later one might race with (at most _KEPT, newest
    last)."""

    __slots__ = ("device", "stream", "stream_name", "accesses", "recorded")

    def __init__(self, device: int, stream: int = 0, stream_name: str = "") -> None:
        self.device = device
        self.stream = stream
        self.stream_name = stream_name
        self.accesses: List[Access] = []
        self.recorded: Set[int] = set()  # streams named by record_stream


# Accesses kept per storage. An access is forgotten once the host has seen
# it finish (nothing launched later can race with it) or a later write on
# an ordered stream covers it; past this many the oldest go, which can only
# hide a race, never invent one.
_KEPT = 64


def _span(tensor: torch.Tensor):
    """The bytes of its storage a tensor's elements lie in: [start, end)."""
    if tensor.is_nested:  # one buffer, components at offsets: all of it
        return 0, tensor.untyped_storage().nbytes()
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    if tensor.numel() == 0:
        return start, start
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(tensor.shape, tensor.stride()))
    return start, start + extent * size


_SPARSE_COMPONENTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}


def _dense_parts(tensor: torch.Tensor):
    """The tensors with device memory that ``tensor`` is made of: itself
    when dense; a sparse tensor's index and value tensors; a wrapper
    subclass's inner tensors (a jagged nested tensor's values and offsets);
    nothing for the fake and functional tensors of torch.compile's tracing,
    which have no memory."""
    if tensor.layout in _SPARSE_COMPONENTS:
        for name in _SPARSE_COMPONENTS[tensor.layout]:
            yield from _dense_parts(getattr(tensor, name)())
        return
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            for name in names:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    yield from _dense_parts(inner)
            return
        # (torch.compile's fake tensors exist only once it is imported; the
        # detector must not import it, nor Dynamo, itself.)
        fake = sys.modules.get("torch._subclasses.fake_tensor")
        if ((fake is not None and isinstance(tensor, fake.FakeTensor))
                or torch._is_functional_tensor(tensor)):
            return
    yield tensor


@dataclass
class _FreedUse:
    """A use of a freed block that was still pending at the free: device
    bytes [start, end) (absolute addresses) touched by ``access``."""

    start: int
    end: int
    access: Access
    block: int  # the freed block's address
    freed_stream_name: str  # the stream whose pool the block went back to


# Filed uses kept per device; past this many the oldest go, which can only
# hide a race, never invent one. Every synchronize that shows the host
# their streams' work finished drops them, so a program reaches this only
# by freeing thousands of blocks in use between two synchronizes.
_FREED_KEPT = 4096


class _FreedUses:
    """Uses of freed blocks still pending, per device, sorted by start
    address (each device's longest span bounds the search for overlaps)."""

    def __init__(self) -> None:
        self.starts: Dict[int, List[int]] = {}
        self.uses: Dict[int, List[_FreedUse]] = {}
        self.longest: Dict[int, int] = {}

    def __bool__(self) -> bool:
        return any(self.uses.values())

    def file(self, device: int, use: _FreedUse) -> None:
        starts = self.starts.setdefault(device, [])
        uses = self.uses.setdefault(device, [])
        at = bisect.bisect_right(starts, use.start)
        starts.insert(at, use.start)
        uses.insert(at, use)
        if self.longest.get(device, 0) < use.end - use.start:
            self.longest[device] = use.end - use.start
        if len(uses) > _FREED_KEPT:
            oldest = min(range(len(uses)), key=lambda i: uses[i].access.seq)
            del starts[oldest], uses[oldest]

    def overlapping(self, device: int, start: int, end: int) -> List[_FreedUse]:
        """The filed uses of ``device`` overlapping bytes [start, end)."""
        starts = self.starts.get(device)
        if not starts:
            return []
        uses = self.uses[device]
        first = bisect.bisect_left(starts, start - self.longest[device] + 1)
        last = bisect.bisect_left(starts, end)
        return [u for u in uses[first:last] if u.end > start]

    def drop(self, device: int, dropped: List[_FreedUse]) -> None:
        if not dropped:
            return
        gone = {id(u) for u in dropped}
        uses = [u for u in self.uses[device] if id(u) not in gone]
        self.uses[device] = uses
        self.starts[device] = [u.start for u in uses]
        if not uses:
            self.longest[device] = 0

    def forget_finished(self, finished: Callable[[Access], bool]) -> None:
        """Drops the uses for which ``finished(access)`` (the host saw them end)."""
        for device, uses in self.uses.items():
            self.drop(device, [u for u in uses if finished(u.access)])
