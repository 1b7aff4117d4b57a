"""Phantom's ``DeviceInterface``: how Dynamo and Inductor drive the device.

Dynamo traces device code through a per-device table of the runtime calls
``torch.cuda`` offers (current device and stream, guards, events,
synchronize, properties). ``PhantomInterface`` fills that table from the
device module (``torch.phantom``, or ``torch.<name>`` for a renamed build);
it is registered for ``"<name>"`` and ``"<name>:<i>"`` when this module is
imported, which ``_compile_hooks`` does right after
``torch._dynamo.device_interface`` is imported (never from
``import torch_phantom``).

``Worker`` answers the questions Inductor's compile workers ask without
touching the device (properties recorded by the parent process, as CUDA
does). Phantom computes with the CPU's kernels, so every dtype the CPU
takes is supported, bfloat16 natively; Triton is not (Inductor's C++
backend generates phantom's kernels, ``_inductor_backend.py``).
"""

from typing import Any, NamedTuple

import torch
from torch._dynamo import device_interface as _di

from . import _C
from . import device_module as _dm
from ._device_index import parse as _parse_device
from ._name import BACKEND_NAME


class PhantomDeviceProperties(NamedTuple):
    """What Inductor reads of a device (``DeviceProperties.create``)."""

    name: str
    total_memory: int
    multi_processor_count: int
    type: str = BACKEND_NAME


def _properties(index: int) -> PhantomDeviceProperties:
    _dm._lazy_init()
    properties = _C._device_properties(index)
    return PhantomDeviceProperties(
        **{field: properties[field] for field in PhantomDeviceProperties._fields
           if field in properties})


class PhantomInterface(_di.DeviceInterface):
    device = _dm.device  # type: ignore[assignment]
    Event = _dm.Event  # type: ignore[assignment]
    Stream = _dm.Stream  # type: ignore[assignment]

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            _di.caching_worker_current_devices[BACKEND_NAME] = device

        @staticmethod
        def current_device() -> int:
            if BACKEND_NAME in _di.caching_worker_current_devices:
                return _di.caching_worker_current_devices[BACKEND_NAME]
            return _dm.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> PhantomDeviceProperties:
            # The package's rule for device arguments, with the worker's own
            # current device (a compile worker does not start the device).
            index = _parse_device(device)
            if index is None or index < 0:
                index = PhantomInterface.Worker.current_device()
            cached = _di.caching_worker_device_properties
            if BACKEND_NAME not in cached:
                cached[BACKEND_NAME] = [
                    _properties(i) for i in range(_dm.device_count())
                ]
            return cached[BACKEND_NAME][index]

    current_device = staticmethod(_dm.current_device)
    set_device = staticmethod(_dm.set_device)
    device_count = staticmethod(_dm.device_count)
    stream = staticmethod(_dm.stream)  # type: ignore[assignment]
    current_stream = staticmethod(_dm.current_stream)
    set_stream = staticmethod(_dm.set_stream)  # type: ignore[assignment]
    synchronize = staticmethod(_dm.synchronize)
    memory_allocated = staticmethod(_dm.memory_allocated)

    @staticmethod
    def is_available() -> bool:
        return _dm.is_available()

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        _dm.set_stream(
            _dm.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type
            )
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        _dm._lazy_init()
        return _C._raw_stream(device_idx)

    @staticmethod
    def exchange_device(device: int) -> int:
        _dm._lazy_init()
        return _C._exchange_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        # CUDA skips the switch before initialisation; phantom's switch
        # is a thread-local store either way.
        return PhantomInterface.exchange_device(device)

    @classmethod
    def get_device_properties(cls, device: Any = None) -> PhantomDeviceProperties:
        return cls.Worker.get_device_properties(device)

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        # Kernels are the host CPU's code: the capability that matters to
        # a compiled artifact is the CPU's instruction set, which Inductor
        # records separately (AOTI_CPU_ISA), as for the CPU.
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @classmethod
    def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
        return True  # the CPU's kernels take every dtype

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return False

    @classmethod
    def raise_if_triton_unavailable(cls, device: Any = None) -> None:
        raise RuntimeError(
            f"Triton has no {BACKEND_NAME} backend: Inductor compiles {BACKEND_NAME} "
            f"code with its C++ backend (see docs/compile.md)"
        )


def register() -> None:
    """Registers ``PhantomInterface`` for the backend's name and each
    ``<name>:<i>``, as Dynamo registers CUDA's. Idempotent; run when this
    module is imported."""
    _di.register_interface_for_device(BACKEND_NAME, PhantomInterface)
    for index in range(_C._device_count()):
        _di.register_interface_for_device(f"{BACKEND_NAME}:{index}", PhantomInterface)



def make_streams_traceable() -> None:
    """Lets Dynamo trace phantom's streams and events as it traces CUDA's.

    Dynamo knows ``torch.cuda``'s stream functions and its ``Stream`` and
    ``Event`` classes by name; phantom's would be traced into, and stop at
    the first ``_C`` call (a graph break, an error under fullgraph). So
    the functions are put in the graph as CUDA's are (``allow_in_graph``:
    Dynamo then recognises them as this interface's ``stream`` and
    ``current_stream``), and the classes join the classes Dynamo
    constructs at trace time and passes to the graph as objects. Runs
    once ``torch._dynamo`` has finished importing (``_compile_hooks``)."""
    import functools

    from torch._dynamo.variables.user_defined import UserDefinedClassVariable

    phantom = _dm
    torch.compiler.allow_in_graph([
        phantom.current_stream,
        phantom.default_stream,
        phantom.set_stream,
        phantom.stream,
    ])
    original = UserDefinedClassVariable._in_graph_classes
    if getattr(original, "_phantom_wrapped", False):
        return

    @functools.cache
    def in_graph_classes():
        return original() | {phantom.Stream, phantom.Event}

    in_graph_classes._phantom_wrapped = True  # type: ignore[attr-defined]
    UserDefinedClassVariable._in_graph_classes = staticmethod(in_graph_classes)


register()
