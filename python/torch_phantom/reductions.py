"""Phantom tensors across processes, as ``torch.multiprocessing`` sends CUDA
tensors (see docs/multiprocessing.md).

``torch.multiprocessing`` pickles tensors with ``ForkingPickler`` and the
reducers ``torch.multiprocessing.reductions`` registers. For a phantom
tensor, torch's ``reduce_tensor`` already does the right thing (it pickles
the tensor's metadata and its storage); its ``reduce_storage`` only knows
CPU storages. This module registers, through the same
``ForkingPickler.register`` that torch uses, a reducer for
``torch.UntypedStorage`` that sends a phantom storage by an interprocess
memory handle (``_C._share_storage``, device/runtime/phantom/Ipc.h) and
hands every other storage to torch's own reducer; and one for
``torch.phantom.Event`` (interprocess events).

The receiving side mirrors ``rebuild_cuda_tensor``: a storage already
received is found in torch's ``shared_cache`` (keyed by the memory handle
and the storage's offset in it), and the new send's reference count is
released at once; otherwise the handle is opened
(``_C._new_shared_storage``). The sending process keeps the memory alive
until every receiver has let go of it (``torch.phantom.ipc_collect``).

A ``multiprocessing.Queue`` pickles in a background thread (its feeder),
where an exception only reaches stderr and the receiver would wait
forever. A storage that cannot be sent from there is therefore pickled as
the error itself: ``get()`` in the receiving process raises it, and the
sender warns.
"""

import threading
import warnings
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _torch_reductions

from . import _C
from ._name import BACKEND_NAME

# torch's reducer, for every storage that is not phantom's.
_torch_reduce_storage = _torch_reductions.reduce_storage


def _in_queue_feeder() -> bool:
    # multiprocessing.Queue's feeder thread (CPython names it so).
    return threading.current_thread().name == "QueueFeederThread"


def _raise_in_receiver(kind: str, message: str):
    error = NotImplementedError if kind == "NotImplementedError" else RuntimeError
    raise error(
        f"the sending process could not send a {BACKEND_NAME} tensor or event: {message}"
    )


def _unsendable(error: Exception):
    """What a Queue's feeder pickles instead of a storage it cannot send."""
    kind = type(error).__name__
    message = str(error)
    warnings.warn(
        f"a {BACKEND_NAME} tensor put on a multiprocessing Queue cannot be sent "
        f"(the receiver's get() raises this): {message}",
        RuntimeWarning,
    )
    return (_raise_in_receiver, (kind, message))


def _rebuild_empty_storage(device: int):
    return torch.UntypedStorage(0, device=torch.device(BACKEND_NAME, device))


def _rebuild_phantom_storage(
    device,
    handle,
    storage_size_bytes,
    storage_offset_bytes,
    ref_counter_handle,
    ref_counter_offset,
    event_handle,
    event_sync_required,
):
    key = (handle, storage_offset_bytes)
    storage = _torch_reductions.storage_from_cache(torch.UntypedStorage, key)
    if storage is not None:
        # Already held here: this send's count is not needed.
        _C._release_ipc_counter(ref_counter_handle, ref_counter_offset)
        return storage
    from . import device_module

    device_module._lazy_init()
    storage = _C._new_shared_storage(
        device,
        handle,
        storage_size_bytes,
        storage_offset_bytes,
        ref_counter_handle,
        ref_counter_offset,
        event_handle,
        event_sync_required,
    )
    _torch_reductions.shared_cache[key] = _torch_reductions.StorageWeakRef(storage)
    return storage


def _reduce_phantom_storage(storage):
    if storage.nbytes() == 0:
        return (_rebuild_empty_storage, (storage.device.index,))
    shared = _C._share_storage(storage)
    handle, storage_offset_bytes = shared[1], shared[3]
    # A process that unpickles its own message gets its own storage back.
    _torch_reductions.shared_cache[(handle, storage_offset_bytes)] = (
        _torch_reductions.StorageWeakRef(storage)
    )
    return (_rebuild_phantom_storage, shared)


def _reduce_untyped_storage(storage):
    if storage.device.type != BACKEND_NAME:
        return _torch_reduce_storage(storage)
    try:
        return _reduce_phantom_storage(storage)
    except Exception as error:
        if not _in_queue_feeder():
            raise
        return _unsendable(error)


def _rebuild_event(device: int, handle: bytes):
    from .streams import Event

    return Event.from_ipc_handle(device, handle)


def _reduce_event(event):
    try:
        return (_rebuild_event, (event.device.index, event.ipc_handle()))
    except Exception as error:
        if not _in_queue_feeder():
            raise
        return _unsendable(error)


def _register() -> None:
    from .streams import Event

    ForkingPickler.register(torch.UntypedStorage, _reduce_untyped_storage)
    ForkingPickler.register(Event, _reduce_event)
