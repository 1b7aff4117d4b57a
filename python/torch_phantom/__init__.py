"""Phantom: a PyTorch device backend over a fake discrete accelerator.

Importing this package loads the C++ runtime (libphantom, through ``_C``),
which registers the device with ATen, then renames PrivateUse1 to
``phantom``, installs ``torch.phantom`` and generates the ``Tensor.phantom()``,
``Tensor.is_phantom`` and ``Module.phantom()`` methods. After that::

    import torch, torch_phantom
    x = torch.randn(3, device="phantom")

``torch.device("privateuseone")`` keeps naming the same device. With the
package installed, ``import torch`` loads it automatically (the
``torch.backends`` entry point); ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns
that off.
"""

import torch

from ._name import BACKEND_NAME
from . import _C  # noqa: F401  (loads libphantom: registers the backend)
from . import device_module as _device_module
from . import memory as _memory

__all__ = ["BACKEND_NAME"]
__version__ = "0.1.0"


def _register() -> None:
    if getattr(torch, BACKEND_NAME, None) is _device_module:
        return
    torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    torch._register_device_module(BACKEND_NAME, _device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True
    )


_register()

# A malformed PHANTOM_ALLOC_CONF is an error at start-up, not at the first
# allocation deep inside a model.
_memory._allocator_settings()
