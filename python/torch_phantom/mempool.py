"""Memory pools on phantom (``torch.phantom.MemPool``,
``torch.phantom.use_mem_pool``), the counterpart of ``torch.cuda.MemPool``.

A pool is memory set apart from the caching allocator's shared cache.
Inside ``use_mem_pool(pool)`` the calling thread's allocations on the
pool's device come from it; a tensor's memory goes back to the pool when
the tensor dies and is handed out again to the pool's later allocations on
the same stream. Graphs can capture into a pool (``graph(g, pool=pool.id)``)
so that several graphs and eager code share its memory. The pool gives its
memory back to the driver when the ``MemPool`` object is deleted and no
graph captured into it remains; memory a tensor still holds then goes back
when the tensor dies (docs/graphs.md, "Memory pools").
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Tuple, Union

import torch

from . import _C
from ._name import BACKEND_NAME

__all__ = ["MemPool", "use_mem_pool"]


class MemPool:
    """A private pool of phantom memory.

    ``id`` is the pool's id (a pair of ints, as ``torch.cuda.MemPool.id``);
    ``use_count()`` counts its users (this object, and graphs captured into
    it not yet reset); ``snapshot()`` lists its segments as
    ``torch.phantom.memory_snapshot()`` does.
    """

    def __init__(self, allocator=None, use_on_oom: bool = False,
                 no_split: bool = False) -> None:
        if allocator is not None:
            raise NotImplementedError(
                f"torch.{BACKEND_NAME}.MemPool(allocator=...): {BACKEND_NAME} "
                "pools take their memory from the device driver; custom "
                "allocators are not supported. Call MemPool() without an "
                "allocator."
            )
        if use_on_oom:
            raise NotImplementedError(
                f"torch.{BACKEND_NAME}.MemPool(use_on_oom=True) is not supported: a "
                "pool's free memory is not lent to allocations outside it. "
                "Call MemPool() without use_on_oom."
            )
        del no_split  # a pool's blocks are never split on phantom
        from .device_module import _lazy_init

        _lazy_init()
        self._id: Tuple[int, int] = tuple(_C._mempool_create())

    @property
    def id(self) -> Tuple[int, int]:
        """The pool's id, for ``torch.phantom.graph(g, pool=...)``."""
        return self._id

    @property
    def allocator(self):
        """None: the pool takes memory from the driver (CUDA's default)."""
        return None

    def use_count(self) -> int:
        """Users of the pool: this object plus graphs captured into it."""
        return _C._mempool_use_count(*self._id)

    def snapshot(self) -> list:
        """The pool's segments, as ``torch.phantom.memory_snapshot()``."""
        from .memory import memory_snapshot

        return memory_snapshot(mempool_id=self._id)

    def __del__(self) -> None:
        pool_id = getattr(self, "_id", None)
        if pool_id is not None and _C is not None:
            _C._mempool_release(*pool_id)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool,
                 device: Union[torch.device, str, int, None] = None
                 ) -> Iterator[None]:
    """Routes the calling thread's allocations on ``device`` (default: the
    current phantom device) to ``pool`` for the duration of the block.
    Other threads, and other devices, allocate as usual."""
    if not isinstance(pool, MemPool):
        raise TypeError(
            f"use_mem_pool expects a torch.{BACKEND_NAME}.MemPool, got "
            f"{type(pool).__name__}; create one with torch.{BACKEND_NAME}.MemPool()"
        )
    from .memory import _index

    index = _index(device)
    _C._mempool_begin_allocate(index, *pool.id)
    try:
        yield
    finally:
        _C._mempool_end_allocate(index, *pool.id)
