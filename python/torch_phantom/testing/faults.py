"""Fault injection: make the device fail on purpose (``torch_phantom.testing.faults``).

Code that runs on accelerators has to survive running out of memory and
device errors, and has to synchronize where it reads results. These knobs
make each of those happen on demand, deterministically, so a test can check
that the code recovers::

    from torch_phantom.testing import faults

    faults.reset()                  # zero the counters, start counting
    train_step()
    n = faults.allocation_count()   # how many allocations one step makes
    for k in range(1, n + 1):
        faults.fail_allocation(k)   # the k-th allocation from now fails
        with pytest.raises(torch.OutOfMemoryError):
            train_step()

- ``fail_allocation(k)``: the k-th request to the device allocator from now
  (1-based; cache hits count, zero-size requests do not) raises
  ``torch.OutOfMemoryError`` saying it was injected. Nothing is allocated.
- ``fail_kernel(k)``: the k-th kernel launched from now fails on the device
  instead of running: ``torch.AcceleratorError`` (a ``RuntimeError``)
  naming the op. A queued kernel's failure is reported, like a real device
  error, by the next sync or the next launch on its stream, once; the
  stream works again afterwards. Host<->device transfers are not kernels;
  a copy on one device (``aten::copy_``) is.
- ``set_latency_us(n)``: every kernel and every host<->device copy first
  waits ``n`` microseconds on its stream, so the host runs ahead and a
  missing synchronization shows up as unfinished or stale data.

The failure knobs are one-shot: after firing they disarm. The same knobs
are read once at start-up from ``PHANTOM_FAULT_ALLOC``,
``PHANTOM_FAULT_KERNEL`` and ``PHANTOM_FAULT_LATENCY_US``; a malformed value
makes ``import torch_phantom`` raise ``ValueError`` naming the variable.
See docs/fault-injection.md.
"""

import contextlib
import operator
from typing import Dict, Iterator, Optional

from .. import _C

__all__ = [
    "fail_allocation",
    "fail_kernel",
    "set_latency_us",
    "latency_us",
    "reset",
    "allocation_count",
    "kernel_count",
    "armed",
    "inject",
]


def _whole(name: str, value, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got a bool ({value!r})")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name}: expected an int, got {type(value).__name__} ({value!r})"
        ) from None
    if number < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {number}")
    return number


def fail_allocation(k: int) -> None:
    """Make the k-th device allocation request from now (k >= 1) raise
    ``torch.OutOfMemoryError``; ``k=0`` disarms the knob."""
    _C._faults_fail_allocation(_whole("fail_allocation", k, 0))


def fail_kernel(k: int) -> None:
    """Make the k-th kernel launched from now (k >= 1) fail with a device
    error naming the op; ``k=0`` disarms the knob."""
    _C._faults_fail_kernel(_whole("fail_kernel", k, 0))


def set_latency_us(microseconds: int) -> None:
    """Add ``microseconds`` of device-side delay to every kernel and every
    host<->device copy (0 turns it off; at most 10 s)."""
    _C._faults_set_latency_us(_whole("set_latency_us", microseconds, 0))


def latency_us() -> int:
    """The latency now in force, in microseconds."""
    return _C._faults_state()["latency_us"]


def reset() -> None:
    """Disarm every knob, set the latency to 0, zero the counters and start
    counting (before the first reset or arming nothing is counted, and the
    hooks cost one atomic load)."""
    _C._faults_reset()


def allocation_count() -> int:
    """Device allocation requests since the last ``reset()``."""
    return _C._faults_state()["allocation_count"]


def kernel_count() -> int:
    """Kernels launched since the last ``reset()``."""
    return _C._faults_state()["kernel_count"]


def armed() -> Dict[str, Optional[int]]:
    """What is still to fire: ``{"allocation": n, "kernel": n}`` with the
    requests left until the knob fires (``None`` once disarmed or fired)."""
    state = _C._faults_state()
    return {
        "allocation": state["allocations_until_fault"] or None,
        "kernel": state["kernels_until_fault"] or None,
    }


@contextlib.contextmanager
def inject(
    allocation: Optional[int] = None,
    kernel: Optional[int] = None,
    latency_us: Optional[int] = None,
) -> Iterator[None]:
    """Arm the given knobs for the ``with`` block; on leaving it, a knob
    that has not fired is disarmed and the previous latency is restored::

        with faults.inject(kernel=3):
            ...
    """
    previous_latency = _C._faults_state()["latency_us"]
    if allocation is not None:
        fail_allocation(allocation)
    if kernel is not None:
        fail_kernel(kernel)
    if latency_us is not None:
        set_latency_us(latency_us)
    try:
        yield
    finally:
        if allocation is not None:
            _C._faults_fail_allocation(0)
        if kernel is not None:
            _C._faults_fail_kernel(0)
        if latency_us is not None:
            _C._faults_set_latency_us(previous_latency)
