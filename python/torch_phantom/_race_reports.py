"""What the race detector reports (torch_phantom/race_detector.py): the
accesses it saw (:class:`Access`: which op, reading or writing which
bytes of a storage, on which stream, launched from which line), the races
it found between two of them (:class:`Race`, whose text names both sides
and says how to order them), and the error and warning that carry them.
"""
import os
import sys
import traceback
from dataclasses import dataclass
from typing import List, Optional

import torch

from ._name import BACKEND_NAME

_PACKAGE_DIRS = tuple(os.path.dirname(p) + os.sep for p in (torch.__file__, __file__))


@dataclass
class Access:
    """One op's access to one storage."""

    write: bool
    seq: int  # the op's position in the order the host launched ops
    stream: int  # the driver handle of the stream it went to
    stream_name: str
    op: str
    arguments: List[str]  # the schema's names for the tensor, "the output"
    stack: traceback.StackSummary
    start: int = 0  # the bytes of the storage the tensor spans: [start, end)
    end: int = 0

    def overlaps(self, other: "Access") -> bool:
        return self.start < other.end and other.start < self.end

    def covers(self, other: "Access") -> bool:
        return self.start <= other.start and other.end <= self.end

    def describe(self) -> str:
        verb = "writing" if self.write else "reading"
        what = ", ".join(self.arguments) or "a tensor"
        frames = "".join(self.stack.format()) or "    (no Python frame)\n"
        return (f"{self.op} {verb} {what} on {self.stream_name}, launched at\n"
                f"{frames}")


@dataclass
class Race:
    """Two accesses of the same memory with no order between them. ``kind``
    is "unordered access", "freed while in use" (``previous`` is a use of a
    block freed while it was pending, ``current`` the later use of the same
    memory, handed out again, that is not ordered after it; ``address`` the
    freed block's) or "host access before copy finished" (``previous`` is
    the copy; ``current`` the op during which the host touched its
    destination, None when that was outside any op; ``address`` the host
    address touched)."""

    kind: str
    address: int
    current: Optional[Access]  # None for a host access outside any op
    previous: Access
    freed_stream_name: str = ""
    noticed_at: Optional[traceback.StackSummary] = None  # host access outside an op

    def __str__(self) -> str:
        if self.kind == HOST_ACCESS:
            if self.current is not None:
                frames = "".join(self.current.stack.format()) or "    (no Python frame)\n"
                who = f"by {self.current.op} on the host, launched at\n{frames}"
            else:
                frames = "".join((self.noticed_at or []).format()) or "    (no Python frame)\n"
                who = ("by host code outside any op (numpy, a buffer, a C extension), "
                       f"noticed at\n{frames}")
            return (
                f"{BACKEND_NAME} race detector: pinned host memory {self.address:#x} was read or "
                f"written {who}"
                f"before anything showed the host that the non_blocking copy writing it "
                f"finished:\n  {self.previous.describe()}"
                f"Wait for the copy before touching its destination: synchronize an event "
                f"recorded after it (or see event.query() return True), synchronize its "
                f"stream, or torch.{BACKEND_NAME}.synchronize().")
        if self.kind == FREED:
            return (
                f"{BACKEND_NAME} race detector: device memory {self.address:#x} was freed for "
                f"reuse on {self.freed_stream_name} while another stream may still use "
                f"it:\n  {self.previous.describe()}"
                f"and is used again, not ordered after that use, by\n  "
                f"{self.current.describe()}"
                f"After using a tensor on a stream it was not allocated on, call "
                f"tensor.record_stream(that stream) before the tensor is freed, or make "
                f"the allocating stream wait for that stream (wait_stream) or synchronize "
                f"it before the memory is used again.")
        if self.previous.op.startswith(_COLLECTIVES):
            fix = ("Wait for the collective before its tensors are used on any stream, "
                   "the one that launched it included: work.wait() (async_op=False waits "
                   "too), its Future's wait() or then(), wait_tensor() for a functional "
                   "collective; another stream then waits for the one that waited "
                   "(wait_stream), or synchronize in between.")
        else:
            fix = ("Order them: make the second stream wait for the first "
                   "(second.wait_stream(first), or an Event recorded after the first op "
                   "and waited on before the second), or synchronize in between.")
        return (
            f"{BACKEND_NAME} race detector: possible data race on device memory "
            f"{self.address:#x}:\n  {self.current.describe()}"
            f"is not ordered after\n  {self.previous.describe()}{fix}")


class StreamRaceError(RuntimeError):
    """Raised by the op that found races; ``races`` lists them."""

    def __init__(self, races: List[Race]):
        self.races = races
        super().__init__("\n\n".join(str(r) for r in races))


class StreamRaceWarning(UserWarning):
    """Warned for each race when the detector's action is "warn"."""


# The ops of c10d's collectives (ProcessGroup's and the functional ones):
# they run on the communication stream until something waits for them.
_COLLECTIVES = ("c10d.", "_c10d_functional.")

HOST_ACCESS = "host access before copy finished"
FREED = "freed while in use"
UNORDERED = "unordered access"


def _user_stack() -> traceback.StackSummary:
    """The innermost frames outside torch and torch_phantom (all frames when
    the op was launched from inside them only)."""
    frames = traceback.extract_stack(sys._getframe(2), limit=40)
    user = [f for f in frames if not f.filename.startswith(_PACKAGE_DIRS)]
    return traceback.StackSummary.from_list((user or frames)[-6:])
