"""Random number generation on phantom devices (``torch.phantom.manual_seed``
and friends). Each device has a default generator; with the same seed a
phantom device draws the same numbers as the CPU (see docs/random.md)."""

from typing import Iterable, List, Union

import torch

from . import _C

_DeviceLike = Union[torch.device, str, int]


def _index(device: _DeviceLike) -> int:
    from .device_module import _get_device_index

    return _get_device_index(device)


def default_generator(device: _DeviceLike = "phantom") -> torch.Generator:
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's default generator (torch.manual_seed calls this)."""
    for index in range(_C._device_count()):
        _C._default_generator(index).manual_seed(int(seed))


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    random_seed = default_generator().seed()
    for index in range(_C._device_count()):
        _C._default_generator(index).manual_seed(random_seed)


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device: _DeviceLike = "phantom") -> torch.Tensor:
    """The generator state of ``device`` as a CPU ByteTensor."""
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "phantom") -> None:
    default_generator(device).set_state(new_state.cpu())


def get_rng_state_all() -> List[torch.Tensor]:
    return [get_rng_state(index) for index in range(_C._device_count())]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
