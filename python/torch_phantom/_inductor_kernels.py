"""Phantom's Inductor backend: what the generated code runs (run time).

The Python module Inductor writes for a phantom graph imports this module
(``PhantomWrapperCodegen.write_header``):

- ``PhantomAsyncCompile`` compiles the graph's C++ kernels as Inductor's
  ``AsyncCompile`` does (same code cache, same compile workers), but binds
  each phantom kernel's name to a ``_C._CompiledKernel``: a launcher that,
  when called, queues the kernel on the current stream of its tensors'
  device, where the kernel's trampoline runs it over the kernel view of
  device memory (``ops/phantom/ops/CompiledKernel.h``). CPU kernels in the
  same graph (work on CPU tensors) keep Inductor's Python binding.
- ``empty_strided_phantom`` allocates a buffer from the caching allocator
  on the current stream of a phantom device.
- ``get_raw_stream`` is the driver handle of a device's current stream.
- ``PhantomDeviceGuard`` makes a graph's device current while it runs
  (Inductor's device guard line).
"""

from torch._inductor.async_compile import AsyncCompile, get_compile_threads
from torch._inductor.codecache import CppPythonBindingsCodeCache, LambdaFuture

from . import _C
from ._inductor_backend import ENTRY_MARK, ENTRY_SYMBOL, argument_kinds

empty_strided_phantom = _C._empty_strided_phantom


def get_raw_stream(device_index: int) -> int:
    return _C._raw_stream(device_index)


class PhantomDeviceGuard:
    """``with PhantomDeviceGuard(i):`` makes device ``i`` current and
    restores the previous one on exit (the device was initialised by the
    tensors that reached the graph)."""

    __slots__ = ("index", "previous")

    def __init__(self, index: int):
        self.index = index
        self.previous = -1

    def __enter__(self):
        self.previous = _C._exchange_device(self.index)
        return self

    def __exit__(self, *exc) -> bool:
        if self.previous != self.index:  # one call per graph when unchanged
            _C._set_device(self.previous)
        return False


def _kernel_name(source_code: str) -> str:
    start = source_code.index(ENTRY_MARK) + len(ENTRY_MARK)
    return source_code[start:source_code.index("\n", start)].strip()


def _launcher(binding, kinds: str, name: str):
    """The launcher of the kernel whose Python binding (the extension
    module's ``kernel`` function) is ``binding``: the trampoline lives in
    the same shared library."""
    library = binding.__self__.__file__
    return _C._compiled_kernel(library, ENTRY_SYMBOL, kinds, name)


class PhantomAsyncCompile(AsyncCompile):
    def cpp_pybinding(self, argtypes, source_code: str):
        if ENTRY_MARK not in source_code:
            return super().cpp_pybinding(argtypes, source_code)  # a CPU kernel
        kinds = argument_kinds(argtypes)
        name = _kernel_name(source_code)
        if get_compile_threads() <= 1:
            binding = CppPythonBindingsCodeCache.load_pybinding(argtypes, source_code)
            return _launcher(binding, kinds, name)
        get_binding = CppPythonBindingsCodeCache.load_pybinding_async(
            argtypes, source_code, submit_fn=self.submit
        )
        return LambdaFuture(lambda: _launcher(get_binding(), kinds, name))
