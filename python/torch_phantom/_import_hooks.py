"""Integrations that register phantom with a library when it is imported.

Some libraries find devices through a registry of their own: PyTorch
Lightning resolves ``Trainer(accelerator="phantom")`` in its
``AcceleratorRegistry``. Phantom's entry must be there before the name is
looked up, whichever of torch_phantom and the library is imported first,
and without importing the library for programs that never use it. So
``install()`` (run when torch_phantom is imported) registers with a library
already imported, and otherwise puts a finder at the front of
``sys.meta_path`` that recognises only the watched module names: for those it
lets the other finders find the module as usual and wraps its loader so that
the registration runs right after the module's own code. The library's code
is untouched; a registration that fails only warns, so importing the
library never fails because of phantom.
"""

import importlib.abc
import sys
import warnings
from typing import Callable, Dict

from ._name import BACKEND_NAME


def _register_with_lightning(namespace: str) -> Callable[[], None]:
    def register() -> None:
        from . import lightning

        lightning.register(namespace)

    return register


# Module whose import triggers a registration -> the registration.
_HOOKS: Dict[str, Callable[[], None]] = {
    "lightning.pytorch.accelerators": _register_with_lightning("lightning.pytorch"),
    "pytorch_lightning.accelerators": _register_with_lightning("pytorch_lightning"),
}


def _run(module_name: str) -> None:
    try:
        _HOOKS[module_name]()
    except Exception as error:  # never break the library's own import
        warnings.warn(
            f"torch_phantom could not register the {BACKEND_NAME} device with "
            f"{module_name}: {type(error).__name__}: {error}",
            stacklevel=2,
        )


class _ChainedLoader(importlib.abc.Loader):
    """The module's own loader, followed by its registration."""

    def __init__(self, loader: importlib.abc.Loader, module_name: str) -> None:
        self._loader = loader
        self._module_name = module_name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _run(self._module_name)

    def __getattr__(self, name: str):
        # get_resource_reader, get_source, is_package, ...: the real loader's.
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)


class _RegistrationFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ChainedLoader(spec.loader, fullname)
        return spec


def install() -> None:
    """Registers with the watched libraries already imported, and watches
    for the others (once per process)."""
    for module_name in _HOOKS:
        if module_name in sys.modules:
            _run(module_name)
    if not any(isinstance(finder, _RegistrationFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegistrationFinder())
