"""Callbacks for PyTorch's GPU trace hooks on phantom.

After ``torch._C._activate_gpu_trace()``, the runtime calls these
registries' callbacks for each phantom event created, recorded, waited on,
synchronized and destroyed, each stream created and synchronized, each
device synchronize, and each block of device memory allocated and freed —
what ``torch.cuda._gpu_trace`` gives for CUDA, and what a stream sanitizer
builds on. Arguments are integers: an event's or stream's driver handle
(``Stream.native_handle``), or a device address (``Tensor.data_ptr()`` of
the first tensor in the block). Activation is for the whole process and
cannot be undone; each traced call then takes the GIL to run the
callbacks, so keep them short.

A device synchronize fires two registries: torch's
``DeviceSynchronizationCallbacks``, with no argument (as for CUDA, where a
tool reads it as every device), and phantom's
``DeviceSynchronizationWithIndexCallbacks``, with the index of the device
whose streams were all waited for. Both fire for
``torch.phantom.synchronize(i)`` and for the caching allocator's wait for
every stream of a device before it returns cached memory to the driver
(``torch.phantom.empty_cache()``, the retry after running out of memory).
"""
from collections.abc import Callable

from torch._utils import CallbackRegistry

from ._name import BACKEND_NAME

EventCreationCallbacks: "CallbackRegistry[int]" = CallbackRegistry(f"{BACKEND_NAME} event creation")
EventDeletionCallbacks: "CallbackRegistry[int]" = CallbackRegistry(f"{BACKEND_NAME} event deletion")
EventRecordCallbacks: "CallbackRegistry[int, int]" = CallbackRegistry(f"{BACKEND_NAME} event record")
EventWaitCallbacks: "CallbackRegistry[int, int]" = CallbackRegistry(f"{BACKEND_NAME} event wait")
MemoryAllocationCallbacks: "CallbackRegistry[int]" = CallbackRegistry(f"{BACKEND_NAME} memory allocation")
MemoryDeallocationCallbacks: "CallbackRegistry[int]" = CallbackRegistry(f"{BACKEND_NAME} memory deallocation")
StreamCreationCallbacks: "CallbackRegistry[int]" = CallbackRegistry(f"{BACKEND_NAME} stream creation")
DeviceSynchronizationCallbacks: "CallbackRegistry[[]]" = CallbackRegistry(f"{BACKEND_NAME} device synchronization")
StreamSynchronizationCallbacks: "CallbackRegistry[int]" = CallbackRegistry(f"{BACKEND_NAME} stream synchronization")
EventSynchronizationCallbacks: "CallbackRegistry[int]" = CallbackRegistry(f"{BACKEND_NAME} event synchronization")
DeviceSynchronizationWithIndexCallbacks: "CallbackRegistry[int]" = CallbackRegistry(
    f"{BACKEND_NAME} device synchronization with index")
_device_index_observer_installed = False


def register_callback_for_event_creation(cb: Callable[[int], None]) -> None:
    EventCreationCallbacks.add_callback(cb)


def register_callback_for_event_deletion(cb: Callable[[int], None]) -> None:
    EventDeletionCallbacks.add_callback(cb)


def register_callback_for_event_record(cb: Callable[[int, int], None]) -> None:
    EventRecordCallbacks.add_callback(cb)


def register_callback_for_event_wait(cb: Callable[[int, int], None]) -> None:
    EventWaitCallbacks.add_callback(cb)


def register_callback_for_memory_allocation(cb: Callable[[int], None]) -> None:
    MemoryAllocationCallbacks.add_callback(cb)


def register_callback_for_memory_deallocation(cb: Callable[[int], None]) -> None:
    MemoryDeallocationCallbacks.add_callback(cb)


def register_callback_for_stream_creation(cb: Callable[[int], None]) -> None:
    StreamCreationCallbacks.add_callback(cb)


def register_callback_for_device_synchronization(cb: Callable[[], None]) -> None:
    DeviceSynchronizationCallbacks.add_callback(cb)


def register_callback_for_stream_synchronization(cb: Callable[[int], None]) -> None:
    StreamSynchronizationCallbacks.add_callback(cb)


def register_callback_for_event_synchronization(cb: Callable[[int], None]) -> None:
    EventSynchronizationCallbacks.add_callback(cb)


def register_callback_for_device_synchronization_with_index(cb: Callable[[int], None]) -> None:
    """``cb(device_index)`` after every stream of that device was waited for."""
    global _device_index_observer_installed
    DeviceSynchronizationWithIndexCallbacks.add_callback(cb)
    if not _device_index_observer_installed:
        from . import _C  # the runtime calls the registry through it

        _C._set_device_sync_observer(DeviceSynchronizationWithIndexCallbacks.fire_callbacks)
        _device_index_observer_installed = True
