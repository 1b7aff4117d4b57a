"""Lazy registration of phantom with torch.compile.

Dynamo and Inductor learn about a device through registries that live in
their own modules (``torch._dynamo.device_interface``,
``torch._inductor.codegen.common``). Importing those modules from
``import torch_phantom`` would make every phantom user pay for
``torch._dynamo`` (seconds, and hundreds of modules) although most never
compile anything. So nothing is registered here: a finder on
``sys.meta_path`` watches for the few torch modules that hold the
registries and, right after one of them has run, registers phantom in it:

- ``torch._dynamo.device_interface``: phantom's ``DeviceInterface``
  (``_dynamo_interface.py``);
- ``torch._dynamo.utils``: ``is_compile_supported("phantom")`` answers
  True (torch's own answer is False for any device it does not list);
- ``torch._dynamo`` (once the whole package has run): phantom's stream
  functions and classes become traceable as CUDA's are;
- ``torch._inductor.codegen.cpp`` and ``torch._inductor.codegen.wrapper``
  (whichever finishes last): phantom's Inductor backend, whose classes
  subclass the C++ scheduling and the Python wrapper defined there
  (``_inductor_backend.py``).

A module already imported when this runs (``import torch._dynamo`` before
``import torch_phantom``) gets its registration at once. The finder only
looks names up in a dict for every other import; it never imports torch's
modules itself.
"""

import importlib.abc
import sys
import threading
import warnings
from typing import Callable, Dict, List

from ._name import BACKEND_NAME

_lock = threading.Lock()


def _register_dynamo_interface(_module) -> None:
    # The module registers the interface when its body has run (also when
    # something else imported it first, and that import is what brought
    # Dynamo in).
    from . import _dynamo_interface  # noqa: F401


def _make_streams_traceable(_module) -> None:
    from . import _dynamo_interface

    _dynamo_interface.make_streams_traceable()


def _patch_is_compile_supported(utils_module) -> None:
    """``torch._dynamo.utils.is_compile_supported`` lists the devices it
    knows and answers False for any other, so libraries that ask it before
    using a compiled or pure-PyTorch path (torchvision's roi_align) would
    refuse phantom. Phantom compiles wherever Dynamo runs (its kernels come
    from the C++ compiler the CPU path uses), so its answer is Dynamo's."""
    original = utils_module.is_compile_supported
    if getattr(original, "_phantom_wrapped", False):
        return

    def is_compile_supported(device_type):
        import torch

        if torch.device(device_type).type == BACKEND_NAME:
            from torch._dynamo.eval_frame import is_dynamo_supported

            return is_dynamo_supported()
        return original(device_type)

    is_compile_supported._phantom_wrapped = True  # type: ignore[attr-defined]
    is_compile_supported.__doc__ = original.__doc__
    is_compile_supported.__wrapped__ = original  # type: ignore[attr-defined]
    utils_module.is_compile_supported = is_compile_supported


_INDUCTOR_MODULES = ("torch._inductor.codegen.cpp", "torch._inductor.codegen.wrapper")


def _register_inductor_backend(_module) -> None:
    # Both modules must have run: the backend's classes subclass theirs.
    if all(name in sys.modules and name not in _Finder.running
           for name in _INDUCTOR_MODULES):
        # Registers the backend when its body has run (see above).
        from . import _inductor_backend  # noqa: F401


_HOOKS: Dict[str, Callable] = {
    "torch._dynamo": _make_streams_traceable,
    "torch._dynamo.device_interface": _register_dynamo_interface,
    "torch._dynamo.utils": _patch_is_compile_supported,
    "torch._inductor.codegen.cpp": _register_inductor_backend,
    "torch._inductor.codegen.wrapper": _register_inductor_backend,
}


def _run(hook: Callable, module) -> None:
    """Runs a hook; a failure only warns. The import that triggered it is
    torch's own and must go on: torch.compile then works for every device
    but phantom, and says why for phantom."""
    try:
        hook(module)
    except Exception as error:  # noqa: BLE001 - never break torch's import
        warnings.warn(
            f"torch.compile cannot use the {BACKEND_NAME} device: registering it with "
            f"{module.__name__} failed ({type(error).__name__}: {error})",
            RuntimeWarning,
            stacklevel=2,
        )


class _Finder(importlib.abc.MetaPathFinder):
    """Runs a hook after a watched module has executed. It finds the
    module's spec with the other finders and wraps that spec's loader
    instance (one per module) so that ``exec_module`` calls the hook once
    the module's body has run; the loader keeps its type and everything
    else, so tracebacks and ``inspect`` still see torch's own file."""

    # Watched modules whose body is executing right now.
    running: set = set()

    def find_spec(self, fullname, path, target=None):
        hook = _HOOKS.get(fullname)
        if hook is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_register(module):
            _Finder.running.add(fullname)
            try:
                exec_module(module)
            finally:
                _Finder.running.discard(fullname)
            _run(hook, module)

        loader.exec_module = exec_then_register
        return spec


_finder = _Finder()


def install() -> None:
    """Puts the finder first on ``sys.meta_path`` and registers phantom in
    the watched modules that are already imported. Idempotent."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    already: List[str] = [name for name in _HOOKS if name in sys.modules]
    for name in already:
        _run(_HOOKS[name], sys.modules[name])
