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
from . import faults  # noqa: F401  (also torch.phantom.faults)
from . import _exit  # noqa: F401  (releases autograd's graph tasks at exit)

__all__ = ["BACKEND_NAME", "faults", "ops_report", "reset_ops_report"]
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

# torch.compile learns about phantom when it is imported, not here.
from . import _compile_hooks  # noqa: E402

_compile_hooks.install()

# A malformed PHANTOM_ALLOC_CONF is an error at start-up, not at the first
# allocation deep inside a model.
_memory._allocator_settings()
# Likewise a malformed PHANTOM_FAULT_* knob (torch_phantom.faults).
_C._faults_check_environment()


def _check_switches() -> None:
    """The on/off settings take 0 or 1. Anything else ("true", "yes", a
    typo) would silently mean off, so it is an error at start-up, as a
    malformed PHANTOM_ALLOC_CONF is."""
    import os

    for name in ("PHANTOM_SYNC_GENERIC", "PHANTOM_OPS_REPORT", "PHANTOM_DEBUG_MEMO",
                 "PHANTOM_NO_LENDING"):
        value = os.environ.get(name)
        if value not in (None, "", "0", "1"):
            raise ValueError(
                f"{name}={value!r} is not 0 or 1; set {name}=1 to turn it "
                f"on, or unset it"
            )


_check_switches()


def ops_report() -> list:
    """How often each op ran on phantom, and how: a list of dicts
    ``{"op", "native", "async", "sync", "sync_reason"}``, most called first.
    ``native`` calls took a phantom kernel that queues the CPU kernel
    directly (add, sub, mul, div, relu); ``async`` calls took the generic
    path and were only queued (outputs computed ahead); ``sync`` calls took
    the generic path and made the host wait, for ``sync_reason``. Other ops
    with phantom kernels of their own (factories, copies, views, fill_)
    are not listed. A vendor reads this to plan native kernels."""
    return _C._ops_report()


def reset_ops_report() -> None:
    _C._reset_ops_report()


def _print_ops_report_at_exit() -> None:
    rows = ops_report()
    print(f"phantom ops report: {len(rows)} ops")
    print(f"{'op':<48} {'native':>8} {'async':>8} {'sync':>8}  sync reason")
    for row in rows:
        print(f"{row['op']:<48} {row['native']:>8} {row['async']:>8} {row['sync']:>8}  "
              f"{row['sync_reason']}")


if __import__("os").environ.get("PHANTOM_OPS_REPORT") == "1":
    __import__("atexit").register(_print_ops_report_at_exit)
