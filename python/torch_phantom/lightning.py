"""PyTorch Lightning on phantom: ``Trainer(accelerator="phantom")``.

Lightning finds an accelerator by name in its ``AcceleratorRegistry``;
``PhantomAccelerator`` is registered there as ``"phantom"``, the way
Lightning documents for accelerators of its own (``register_accelerators``).
The registration happens by itself: when a Lightning namespace's
``accelerators`` module is imported (before or after torch_phantom), a
post-import hook installed by ``torch_phantom`` registers the accelerator in
it (``_import_hooks.py``). So a script, or the Lightning CLI
(``--trainer.accelerator=phantom``), needs nothing but the name::

    trainer = Trainer(accelerator="phantom", devices=1, precision="bf16-mixed")

Lightning ships twice, as ``lightning.pytorch`` and as ``pytorch_lightning``,
with separate class hierarchies; each installed one gets its own
``PhantomAccelerator`` subclass (``accelerator_class``).

Two of Lightning's choices ignore the accelerator, and the accelerator
corrects them in ``setup(trainer)``, the hook Lightning calls before it moves
the model to the device:

- With one device, Lightning builds ``SingleDeviceStrategy(device="cpu")``
  for every accelerator but CUDA, MPS and XLA. The accelerator points that
  strategy at the phantom device chosen with ``devices=`` before anything is
  moved (the strategy keeps its device in ``_root_device``; nothing public
  sets it).
- For ``"16-mixed"`` and ``"bf16-mixed"`` Lightning builds its
  ``MixedPrecision`` plugin with ``device="cuda"``, so autocast would be on
  for CUDA, not phantom. The accelerator gives the strategy a
  ``MixedPrecision`` plugin for ``"phantom"`` instead (and so, for
  ``"16-mixed"``, a ``GradScaler`` on phantom), through the strategy's public
  ``precision_plugin`` setter.

Phantom has no distributed (c10d) backend, so Trainer trains on one phantom
device: ``devices=1`` (or ``"auto"``) is ``phantom:0`` and ``devices=[i]`` is
``phantom:i``; more than one device is refused at ``Trainer(...)``.
Lightning's own code is not changed.
"""

import importlib
import importlib.util
import sys
from typing import Any, Dict, List, Union

import torch

from . import device_module as _dm  # torch.<name>
from ._name import BACKEND_NAME

__all__ = ["NAMESPACES", "accelerator_class", "register", "PhantomAccelerator"]

# Lightning's two distributions, by the package that holds the Trainer.
NAMESPACES = ("lightning.pytorch", "pytorch_lightning")

_classes: Dict[str, type] = {}


def _device_indices(devices: Union[int, str, List[int]]) -> List[int]:
    """``devices=`` as phantom device indices: an int n is the first n
    devices (-1: all), a list names them, a string is either spelling
    ("1", "0,", "-1")."""
    count = _dm.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            devices = 1
        elif "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()]
        else:
            devices = int(text)
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise ValueError(
            f"Trainer(accelerator={BACKEND_NAME!r}, devices={devices!r}): devices "
            f"must be an int, a list of device indices or a string such as '0,'"
        )
    if isinstance(devices, int):
        indices = list(range(count)) if devices == -1 else list(range(devices))
    else:
        indices = [int(i) for i in devices]
    bad = [i for i in indices if not 0 <= i < count]
    if bad:
        raise ValueError(
            f"Trainer(accelerator={BACKEND_NAME!r}, devices={devices!r}) asks for "
            f"{BACKEND_NAME} device(s) {bad}, but the driver offers {count}"
        )
    if len(indices) != 1:
        raise ValueError(
            f"Trainer(accelerator={BACKEND_NAME!r}, devices={devices!r}) asks for "
            f"{len(indices)} devices, but {BACKEND_NAME} has no distributed (c10d) "
            f"backend for Lightning to train across devices with; pass devices=1 "
            f"or devices=[i] to train on {BACKEND_NAME}:i"
        )
    return indices


def _build(namespace: str) -> type:
    accelerators = importlib.import_module(namespace + ".accelerators")

    class PhantomAccelerator(accelerators.Accelerator):
        """Lightning accelerator for the phantom device (see the module
        docstring of ``torch_phantom.lightning``)."""

        @staticmethod
        def name() -> str:
            return BACKEND_NAME

        @staticmethod
        def is_available() -> bool:
            return _dm.is_available()

        @staticmethod
        def auto_device_count() -> int:
            # "auto" means one device: there is no backend to train across
            # several (the module docstring).
            return 1 if _dm.is_available() else 0

        @staticmethod
        def parse_devices(devices: Any) -> List[int]:
            return _device_indices(devices)

        @staticmethod
        def get_parallel_devices(devices: List[int]) -> List[torch.device]:
            return [torch.device(BACKEND_NAME, i) for i in devices]

        def setup_device(self, device: torch.device) -> None:
            # Lightning first calls this with its single-device strategy's
            # CPU placeholder; setup() below moves the strategy to phantom
            # and calls it again with the phantom device.
            if device.type == BACKEND_NAME:
                _dm.set_device(device)

        def setup(self, trainer: Any) -> None:
            strategy = trainer.strategy
            _place_strategy_on_phantom(strategy, trainer)
            self.setup_device(strategy.root_device)
            _autocast_on_phantom(strategy, namespace)

        def get_device_stats(self, device: Any) -> Dict[str, Any]:
            return _dm.memory_stats(device)

        def teardown(self) -> None:
            _dm.empty_cache()

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(
                cls.name(), cls,
                description="Phantom: a fake discrete accelerator (torch_phantom)",
            )

    PhantomAccelerator.__module__ = __name__
    PhantomAccelerator.__qualname__ = "PhantomAccelerator"
    return PhantomAccelerator


def _chosen_device(trainer: Any) -> torch.device:
    """The phantom device ``devices=`` chose: Lightning keeps the devices it
    parsed in its accelerator connector (``get_parallel_devices`` above),
    and hands only the CPU placeholder to the strategy."""
    connector = getattr(trainer, "_accelerator_connector", None)
    devices = getattr(connector, "_parallel_devices", None)
    if not devices:
        raise RuntimeError(
            "torch_phantom.lightning: cannot find the devices this Trainer was "
            "given (this Lightning version keeps them elsewhere); pass "
            f"strategy=SingleDeviceStrategy(device='{BACKEND_NAME}:0') to Trainer"
        )
    return torch.device(devices[0])


def _place_strategy_on_phantom(strategy: Any, trainer: Any) -> None:
    root = strategy.root_device
    if root.type == BACKEND_NAME:
        return
    if root.type != "cpu" or not hasattr(strategy, "_root_device"):
        raise RuntimeError(
            f"torch_phantom.lightning: the Trainer's strategy "
            f"{type(strategy).__name__} runs on {root}, not on {BACKEND_NAME}; pass "
            f"Trainer(accelerator={BACKEND_NAME!r}, devices=1) without a "
            f"strategy, or a strategy built with device='{BACKEND_NAME}:0'"
        )
    # Lightning's connector gives every single-device accelerator other than
    # CUDA, MPS and XLA the CPU as its strategy's device.
    strategy._root_device = _chosen_device(trainer)


def _autocast_on_phantom(strategy: Any, namespace: str) -> None:
    precision_module = importlib.import_module(namespace + ".plugins.precision")
    mixed = precision_module.MixedPrecision
    plugin = strategy.precision_plugin
    if type(plugin) is not mixed or plugin.device == BACKEND_NAME:
        return
    # Lightning chose "cuda" for autocast (and, for 16-mixed, built its
    # GradScaler for CUDA, which disabled itself on a CPU-only torch).
    strategy.precision_plugin = mixed(plugin.precision, device=BACKEND_NAME)


def accelerator_class(namespace: str = None) -> type:
    """``PhantomAccelerator`` for one Lightning namespace
    (``"lightning.pytorch"`` or ``"pytorch_lightning"``); by default the
    first of them installed. Pass an instance to ``Trainer(accelerator=...)``
    of that namespace."""
    if namespace is None:
        namespace = _installed_namespaces()[0]
    if namespace not in NAMESPACES:
        raise ValueError(f"{namespace!r} is not one of Lightning's namespaces {NAMESPACES}")
    if namespace not in _classes:
        _classes[namespace] = _build(namespace)
    return _classes[namespace]


def register(namespace: str) -> None:
    """Registers ``"phantom"`` in ``namespace``'s ``AcceleratorRegistry``
    (once; a name another package registered first is left alone)."""
    registry = importlib.import_module(namespace + ".accelerators").AcceleratorRegistry
    if BACKEND_NAME not in registry:
        accelerator_class(namespace).register_accelerators(registry)


def _installed_namespaces() -> List[str]:
    found = [ns for ns in NAMESPACES if ns in sys.modules]
    for ns in NAMESPACES:
        if ns not in found and importlib.util.find_spec(ns.split(".")[0]) is not None:
            found.append(ns)
    if not found:
        raise ImportError(
            "PyTorch Lightning is not installed: pip install lightning (or "
            "pytorch-lightning)"
        )
    return found


def __getattr__(name: str) -> Any:
    if name == "PhantomAccelerator":
        return accelerator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
