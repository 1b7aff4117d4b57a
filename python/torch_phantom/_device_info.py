"""What a phantom device is: its properties, name and capability, and which
dtypes it supports (re-exported by ``torch.phantom``).

The properties come from the driver (``ph_device_get_properties``). Where
``torch.cuda`` reports a compute capability, phantom reports the HAL ABI
version its driver implements ((1, 2) for ABI 1002): the HAL has no chip
generations, and that version is what decides what the device can do
through phantom. Code that compares capabilities with CUDA's numbers
(``>= (8, 0)`` for bfloat16) should ask :func:`is_bf16_supported`
instead, which answers for the device at hand.
"""

from typing import Tuple, Union

import torch

from . import _C
from ._device_index import device_index as _index  # the one rule for device arguments

_DeviceLike = Union[torch.device, str, int, None]


class _PhantomDeviceProperties:
    """The properties of one phantom device, with the fields device-agnostic
    code reads from ``torch.cuda.get_device_properties``: ``name``,
    ``total_memory`` (bytes), ``multi_processor_count`` (compute units),
    ``major``/``minor`` (the driver's HAL ABI version), ``is_integrated``
    and ``is_multi_gpu_board`` (False: a discrete device of its own), and
    phantom's ``stream_priority_range`` (lowest, highest)."""

    __slots__ = ("name", "total_memory", "multi_processor_count", "major",
                 "minor", "is_integrated", "is_multi_gpu_board",
                 "stream_priority_range")

    def __init__(self, fields: dict):
        self.name: str = fields["name"]
        self.total_memory: int = fields["total_memory"]
        self.multi_processor_count: int = fields["multi_processor_count"]
        self.major: int = fields["major"]
        self.minor: int = fields["minor"]
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.stream_priority_range: Tuple[int, int] = (
            fields["stream_priority_low"], fields["stream_priority_high"])

    def __repr__(self) -> str:
        return (
            f"_PhantomDeviceProperties(name='{self.name}', major={self.major}, "
            f"minor={self.minor}, total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device: _DeviceLike = None) -> _PhantomDeviceProperties:
    """The properties of ``device`` (the current device if None): ``name``,
    ``total_memory``, ``multi_processor_count``, ``major``, ``minor``,
    ``is_integrated``, ``is_multi_gpu_board``."""
    return _PhantomDeviceProperties(_C._device_properties(_index(device)))


def get_device_name(device: _DeviceLike = None) -> str:
    """The name the driver gives ``device`` (the current device if None)."""
    return get_device_properties(device).name


def get_device_capability(device: _DeviceLike = None) -> Tuple[int, int]:
    """``(major, minor)`` of ``device``: the HAL ABI version its driver
    implements (see the top of this module)."""
    properties = get_device_properties(device)
    return properties.major, properties.minor


def can_device_access_peer(device: _DeviceLike, peer_device: _DeviceLike) -> bool:
    """True when tensors can be copied directly between ``device`` and
    ``peer_device``: always, for two different phantom devices (the driver
    copies device to device); False for a device and itself, as CUDA
    answers."""
    index, peer = _index(device), _index(peer_device)
    return index != peer


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: phantom computes bfloat16 with the CPU's kernels, which support
    it natively (``including_emulation`` makes no difference)."""
    del including_emulation
    from .device_module import is_available

    return is_available()


def is_tf32_supported() -> bool:
    """False: phantom computes float32 matrix products in full float32 (the
    CPU's kernels); it has no TF32 mode for
    ``torch.backends.*.matmul.allow_tf32`` to switch on."""
    return False

