"""How every function of the package reads a device argument: one rule,
``torch.cuda``'s.

A device argument is ``None``, an ``int``, a ``str`` or a ``torch.device``:

- ``None``, ``"<name>"`` and ``torch.device("<name>")`` (no index) name the
  current device of the calling thread;
- ``i``, ``"<name>:i"`` and ``torch.device("<name>", i)`` name device ``i``,
  which must exist (an index out of range is the runtime's error, naming
  the valid indices);
- a negative ``int`` is ``torch.cuda``'s "no device": ``set_device(-1)``,
  ``device(-1)`` and ``device_of`` a CPU tensor change nothing (and start
  nothing), and every other function uses the current device, as
  ``torch.cuda.synchronize(-1)`` and ``torch.cuda.Stream(-1)`` do;
- any other type (a ``bool``, a ``float``, a stream) is a ``TypeError``, and
  a string or ``torch.device`` of another device type (``"cpu"``) a
  ``ValueError``, each saying what is accepted.

``<name>`` is the backend's name (``_name.BACKEND_NAME``); the
``privateuseone`` spelling is the same device. ``parse`` applies the rule
without starting the runtime (Dynamo's compile workers use it with their
own notion of the current device); ``device_index`` is what the public
functions call.
"""

from typing import Optional, Union

import torch

from . import _C
from ._name import BACKEND_NAME

DeviceLike = Union[torch.device, str, int, None]

# c10::DeviceIndex is an int8_t: the runtime's range check cannot take more.
_DEVICE_INDEX_LIMIT = 1 << 7


def parse(device: DeviceLike) -> Optional[int]:
    """The index ``device`` names, None for the current device; checks the
    type and the device type, not that the device exists."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(
            f"expected a {BACKEND_NAME} device as an int, str or torch.device, "
            f"got {type(device).__name__}; pass an index, '{BACKEND_NAME}:<index>' "
            f"or None for the current device"
        )
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)  # torch's own error for a malformed string
    if device.type != BACKEND_NAME:
        raise ValueError(
            f"expected a {BACKEND_NAME} device, got '{device}'; pass an index, "
            f"'{BACKEND_NAME}:<index>' or None for the current device"
        )
    return device.index


def device_index(device: DeviceLike, *, negative_selects_nothing: bool = False) -> int:
    """The index of the existing device ``device`` names (see the module's
    rule), starting the runtime lazily. With ``negative_selects_nothing``
    (the setters) a negative int returns -1 and starts nothing."""
    from . import device_module

    index = parse(device)
    if index is not None and index < 0 and negative_selects_nothing:
        return -1
    if index is None or index < 0:
        return device_module.current_device()
    device_module._lazy_init()
    if not -_DEVICE_INDEX_LIMIT <= index < _DEVICE_INDEX_LIMIT:
        count = _C._device_count()
        raise RuntimeError(
            f"{BACKEND_NAME} device index {index} is out of range: valid indices "
            f"are 0..{count - 1}"
        )
    _C._check_device(index)
    return index
