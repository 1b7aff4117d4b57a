"""The race detector's happens-before order (torch_phantom/race_detector.py):
a vector clock per stream (for each other stream, the last op of it this
stream is ordered after), one per recorded event, and one for the host
(what a synchronize, a query answering True or an op that waited for its
stream has shown finished). Streams are named by driver handle and ops by
their position in the order the host launched them (``seq``).
"""
from typing import Dict, Iterable

from ._race_reports import Access


def _merge(into: Dict[int, int], other: Dict[int, int]) -> None:
    for stream, seq in other.items():
        if into.get(stream, 0) < seq:
            into[stream] = seq


class _Order:
    """Happens-before between streams, events and the host (vector clocks)."""

    def __init__(self) -> None:
        self.seq = 0
        self.streams: Dict[int, Dict[int, int]] = {}
        self.events: Dict[int, Dict[int, int]] = {}
        self.host: Dict[int, int] = {}

    def _view(self, stream: int) -> Dict[int, int]:
        view = self.streams.get(stream)
        if view is None:
            view = self.streams[stream] = {}
        _merge(view, self.host)  # what the host saw finish precedes its launches
        return view

    def launch(self, stream: int) -> int:
        self.seq += 1
        self._view(stream)[stream] = self.seq
        return self.seq

    def ordered(self, stream: int, access: Access) -> bool:
        return (self._view(stream).get(access.stream, 0) >= access.seq
                or self.host.get(access.stream, 0) >= access.seq)

    def record(self, event: int, stream: int) -> None:
        self.events[event] = dict(self._view(stream))

    def wait(self, event: int, stream: int) -> None:
        _merge(self._view(stream), self.events.get(event, {}))

    def wait_stream(self, stream: int, other: int) -> None:
        """``stream`` waits for what is queued on ``other`` so far."""
        if stream != other:
            _merge(self._view(stream), self._view(other))

    def sync_stream(self, stream: int) -> None:
        _merge(self.host, self._view(stream))

    def sync_event(self, event: int) -> None:
        _merge(self.host, self.events.get(event, {}))

    def sync_device(self) -> None:
        for view in self.streams.values():
            _merge(self.host, view)

    def sync_streams(self, streams: Iterable[int]) -> None:
        """Every stream in ``streams`` was waited for (a synchronize of
        their device)."""
        for stream in streams:
            _merge(self.host, self._view(stream))

    def finished(self, stream: int, seq: int) -> None:
        """The host has seen op ``seq`` of ``stream`` finish."""
        if self.host.get(stream, 0) < seq:
            self.host[stream] = seq

    def succeed(self, old: int, new: int) -> None:
        """Stream handle ``new`` replaced ``old``: the same stream, so
        everything ordered before old's work is ordered before new's."""
        _merge(self._view(new), self._view(old))
