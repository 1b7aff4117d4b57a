"""Random number generation on the backend's devices (``torch.phantom.manual_seed``
and friends; ``torch.<name>`` when the build renames the backend). Each
device has a default generator; with the same seed a device draws the same
numbers as the CPU (see docs/random.md)."""

from typing import Iterable, List

import torch

from . import _C
from ._device_index import DeviceLike as _DeviceLike
from ._device_index import device_index as _index  # the one rule for device arguments

__all__ = [
    "default_generator",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]


def default_generator(device: _DeviceLike = None) -> torch.Generator:
    """The default generator of ``device`` (the current device by default):
    what random ops on it draw from unless given a generator."""
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's default generator (torch.manual_seed calls this)."""
    for index in range(_C._device_count()):
        _C._default_generator(index).manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's default generator with a random number."""
    default_generator().seed()


def seed_all() -> None:
    """Seeds every device's default generator with one random number."""
    random_seed = default_generator().seed()
    for index in range(_C._device_count()):
        _C._default_generator(index).manual_seed(random_seed)


def initial_seed() -> int:
    """The seed the current device's default generator started from."""
    return default_generator().initial_seed()


def get_rng_state(device: _DeviceLike = None) -> torch.Tensor:
    """The generator state of ``device`` (the current device by default) as a
    CPU ByteTensor."""
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = None) -> None:
    """Restores the generator state of ``device`` (the current device by
    default) from ``new_state`` (a
    ByteTensor from :func:`get_rng_state`)."""
    default_generator(device).set_state(new_state.cpu())


def get_rng_state_all() -> List[torch.Tensor]:
    """The generator state of every device, in device order."""
    return [get_rng_state(index) for index in range(_C._device_count())]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restores every device's generator state from ``new_states`` (from
    :func:`get_rng_state_all`)."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
