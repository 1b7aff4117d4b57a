"""What a phantom device's driver measures about its state, spelled as
``torch.cuda`` spells what NVML reports (re-exported by ``torch.phantom``).

The runtime asks the driver's OPTIONAL telemetry query
(``ph_device_get_telemetry`` in ``device/hal/phantom/hal.h``). The fake
driver measures:

- ``utilization``: the percent of the sample period during which work
  launched on at least one of the device's streams was running (its
  workers' busy time);
- ``memory_usage``: the percent of the sample period during which the
  device's memory was being copied or filled.

The sample period ends at the call and reaches back at least 100 ms (to
the previous query, or further when queries come faster). The fake starts
measuring at the first query of the process, which therefore reports 0
(an empty period): sample once at the start of what you want to measure.
It has no sensors: ``temperature``, ``power_draw`` and ``clock_rate``
raise ``NotImplementedError`` (a ``RuntimeError``), as ``torch.cuda`` raises
when NVML cannot answer; a driver for real hardware reports them.
``device_memory_used`` needs no telemetry: it is the driver's total minus
free memory.
"""

from typing import Union

import torch

from . import _C
from ._name import BACKEND_NAME
from ._device_index import device_index as _index  # the one rule for device arguments

_DeviceLike = Union[torch.device, str, int, None]


def _measure(device: _DeviceLike, field: str, what: str) -> int:
    index = _index(device)
    telemetry = _C._device_telemetry(index)
    value = telemetry[field]
    if value is None:
        if not telemetry["driver_reports"]:
            reason = "its driver has no telemetry (ph_device_get_telemetry)"
        elif field in ("temperature", "power_draw", "clock_rate"):
            reason = "its driver has no such sensor (the fake driver has none)"
        else:
            reason = "its driver does not measure it"
        raise NotImplementedError(f"{BACKEND_NAME}:{index} cannot report its {what}: {reason}")
    return value


def device_memory_used(device: _DeviceLike = None) -> int:
    """Bytes of ``device``'s memory in use, as the driver counts them (what
    ``nvidia-smi`` shows on CUDA): tensors, the caching allocator's cache and
    anything else allocated there."""
    return _C._device_memory_used(_index(device))


def utilization(device: _DeviceLike = None) -> int:
    """Percent of the last sample period during which work ran on at least
    one of ``device``'s streams (see the top of this module; the first call
    in a process returns 0)."""
    return _measure(device, "utilization", "utilization")


def memory_usage(device: _DeviceLike = None) -> int:
    """Percent of the last sample period during which ``device``'s memory
    was being read or written by copies and fills (see the top of this
    module; the first call in a process returns 0)."""
    return _measure(device, "memory_busy", "memory activity")


def temperature(device: _DeviceLike = None) -> int:
    """The device's temperature in degrees Celsius, if its driver has a
    sensor; raises ``NotImplementedError`` on the fake driver."""
    return _measure(device, "temperature", "temperature")


def power_draw(device: _DeviceLike = None) -> int:
    """The device's power draw in milliwatts over the last sample period, if
    its driver measures it; raises ``NotImplementedError`` on the fake."""
    return _measure(device, "power_draw", "power draw")


def clock_rate(device: _DeviceLike = None) -> int:
    """The device's compute clock in MHz, if its driver reports it; raises
    ``NotImplementedError`` on the fake driver."""
    return _measure(device, "clock_rate", "clock rate")
