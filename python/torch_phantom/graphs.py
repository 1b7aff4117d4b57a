"""Graph capture and replay on phantom (``torch.phantom.Graph``,
``torch.phantom.graph``), the counterpart of ``torch.cuda.graphs``.

A graph records the device work queued on a stream once and replays it with
one launch, which removes the host's per-op cost (docs/graphs.md). The
class is ``torch.accelerator.Graph`` itself (phantom registers its
implementation with torch), so code written against the device-generic API
needs nothing from here; this module adds the ``torch.cuda``-style helpers.
"""
from __future__ import annotations

import gc
import threading
from typing import Optional

import torch

from . import _C
from . import device_module as _dm  # torch.<name> (circular: used at call time)

__all__ = [
    "Graph",
    "PhantomGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]


class Graph(torch.accelerator.Graph):
    """A phantom graph: ``torch.accelerator.Graph`` on the phantom device.

    ``capture_begin()``/``capture_end()`` record the work queued on the
    current stream; ``replay()`` runs it again on the current stream.
    Allocations made during the capture come from the graph's private pool
    (``pool()``), kept until ``reset()``.
    """


PhantomGraph = Graph


def graph_pool_handle() -> tuple:
    """An id of a new memory pool, to share one pool between graphs
    (``torch.phantom.graph(g, pool=handle)``)."""
    return _C._graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """True while the current phantom stream records a graph."""
    return _C._is_current_stream_capturing()


_side_streams: dict = {}
_side_lock = threading.Lock()


def _default_capture_stream() -> torch.Stream:
    device = _dm.current_device()
    with _side_lock:
        if device not in _side_streams:
            _side_streams[device] = _dm.Stream(device)
        return _side_streams[device]


class graph:
    """Context manager capturing the work inside it into ``phantom_graph``,
    as ``torch.cuda.graph`` does: on a side stream by default (``stream``),
    into ``pool`` if given (from ``graph_pool_handle()`` or another graph's
    ``pool()``), with ``capture_error_mode`` one of "global",
    "thread_local", "relaxed" (hal.h, "Modes")."""

    def __init__(
        self,
        phantom_graph: torch.accelerator.Graph,
        pool: Optional[tuple] = None,
        stream: Optional[torch.Stream] = None,
        capture_error_mode: str = "global",
    ) -> None:
        if capture_error_mode not in ("default", "global", "thread_local", "relaxed"):
            raise ValueError(
                f"capture_error_mode={capture_error_mode!r} is not one of "
                "'global', 'thread_local', 'relaxed'"
            )
        self.graph = phantom_graph
        self.pool = pool
        self.capture_stream = stream if stream is not None else _default_capture_stream()
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = None

    def __enter__(self) -> None:
        _dm.synchronize()
        gc.collect()
        _dm.empty_cache()
        self.capture_stream.wait_stream(_dm.current_stream())
        self._stream_ctx = _dm.stream(self.capture_stream)
        self._stream_ctx.__enter__()
        self.graph.graph_pool = self.pool
        self.graph.capture_error_mode = self.capture_error_mode
        try:
            self.graph.capture_begin()
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            try:
                self.graph.capture_end()
            except Exception:
                if exc_type is None:
                    raise
                # The error inside the block (an op that cannot be
                # captured) is the one to report; the failed capture was
                # discarded and the graph can capture again.
        finally:
            self._stream_ctx.__exit__(None, None, None)
            # Later work on the current stream sees what the capture's
            # stream did before it (nothing ran during the capture).
            _dm.current_stream().wait_stream(self.capture_stream)


class _PhantomAsCuda:
    """What torch.cuda.make_graphed_callables uses of ``torch.cuda``,
    answered by phantom."""

    CUDAGraph = Graph
    graph = graph

    @staticmethod
    def Stream(*args, **kwargs):  # noqa: N802 (torch.cuda's name)
        return _dm.Stream(*args, **kwargs)

    @staticmethod
    def stream(s):
        return _dm.stream(s)

    @staticmethod
    def synchronize(device=None):
        _dm.synchronize(device)

    @staticmethod
    def graph_pool_handle():
        return graph_pool_handle()


class _TorchWithPhantomAsCuda:
    cuda = _PhantomAsCuda()

    def __getattr__(self, name):
        return getattr(torch, name)


_graphed_impl = None


def make_graphed_callables(callables, sample_args, num_warmup_iters=3,
                           allow_unused_input=False, pool=None):
    """``torch.cuda.make_graphed_callables`` on phantom: graphs of the
    forward and backward passes of each callable (a function or a module),
    replayed by the returned callables. Same arguments and rules as torch's
    (sample_args give the static inputs' shapes; modules must have no
    hooks; autocast only with caching off)."""
    global _graphed_impl
    if _graphed_impl is None:
        import types

        from torch.cuda import graphs as cuda_graphs

        original = cuda_graphs.make_graphed_callables
        namespace = dict(original.__globals__)
        # The same algorithm, with torch.cuda's graph, stream and pool
        # calls answered by phantom (nested functions inherit these
        # globals).
        namespace["torch"] = _TorchWithPhantomAsCuda()
        namespace["graph_pool_handle"] = graph_pool_handle
        _graphed_impl = types.FunctionType(
            original.__code__, namespace, original.__name__,
            original.__defaults__, original.__closure__)
        _graphed_impl.__kwdefaults__ = original.__kwdefaults__
    return _graphed_impl(callables, sample_args, num_warmup_iters,
                         allow_unused_input, pool)


def _signature(leaves):
    """What decides whether a call can replay a graph: each tensor's shape,
    dtype, device and strides, and every other argument's value."""
    key = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            key.append(("tensor", tuple(leaf.shape), leaf.dtype, str(leaf.device),
                        leaf.stride()))
        else:
            key.append(("value", type(leaf), leaf))
    return tuple(key)


class _GraphedInference(torch.nn.Module):
    """See wrap_in_graph."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self._graphs: dict = {}
        self._eager: set = set()
        self._warned = False

    def forward(self, *args, **kwargs):
        import torch.utils._pytree as pytree

        leaves, spec = pytree.tree_flatten((args, kwargs))
        try:
            key = (spec, _signature(leaves))
            hash(key)
        except TypeError:
            return self.module(*args, **kwargs)  # unhashable arguments
        if key in self._eager:
            return self.module(*args, **kwargs)
        entry = self._graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(leaves, spec)
            except RuntimeError as error:
                self._eager.add(key)
                if not self._warned:
                    self._warned = True
                    import warnings

                    warnings.warn(
                        "torch_phantom.wrap_in_graph: this call cannot be "
                        f"captured, so it runs eagerly ({error})".split("\n")[0],
                        stacklevel=2,
                    )
                return self.module(*args, **kwargs)
            self._graphs[key] = entry
        static_leaves, g, output = entry
        for static, leaf in zip(static_leaves, leaves):
            if isinstance(leaf, torch.Tensor):
                static.copy_(leaf)
        g.replay()
        return output

    def _capture(self, leaves, spec):
        import torch.utils._pytree as pytree

        static_leaves = [
            leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf
            for leaf in leaves
        ]
        args, kwargs = pytree.tree_unflatten(static_leaves, spec)
        with torch.no_grad():
            self.module(*args, **kwargs)  # warm-up: lazy initialisation
            g = Graph()
            with graph(g):
                output = self.module(*args, **kwargs)
        return static_leaves, g, output


def wrap_in_graph(module: torch.nn.Module) -> torch.nn.Module:
    """Wraps an inference module as HPU graphs do: the first call with a
    given input signature (tensor shapes, dtypes, devices, strides and the
    values of non-tensor arguments) captures a graph, later calls with that
    signature copy their tensors into the graph's static inputs and replay
    it. The returned output is the graph's static output, overwritten by
    the next call with the same signature (clone it to keep it). Calls that
    cannot be captured warn once and run eagerly. Runs without autograd."""
    return _GraphedInference(module)
