"""Phantom: a PyTorch device backend over a fake discrete accelerator.

Importing this package loads the C++ runtime (libphantom, through ``_C``),
which registers the device with ATen, then renames PrivateUse1 to
``phantom``, installs ``torch.phantom`` and generates the ``Tensor.phantom()``,
``Tensor.is_phantom`` and ``Module.phantom()`` methods (a build with
another ``PHANTOM_BACKEND_NAME`` uses that name instead: ``BACKEND_NAME``,
docs/porting.md). After that::

    import torch, torch_phantom
    x = torch.randn(3, device="phantom")

``torch.device("privateuseone")`` keeps naming the same device. With the
package installed, ``import torch`` loads it automatically (the
``torch.backends`` entry point); ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns
that off.
"""

import torch

from . import _settings

# Every PHANTOM_* setting is checked first, by the C++ settings parser
# (torch-free, csrc/Settings.cpp): a malformed value raises one ValueError
# (_settings.SettingError) naming the variable and what it accepts, before
# libphantom is loaded, so torch is left as it was and no exit hook exists.
_settings.check()

from ._name import BACKEND_NAME  # noqa: E402
from . import _C  # noqa: E402,F401  (loads libphantom: registers the backend)
from . import device_module as _device_module  # noqa: E402
from . import _exit  # noqa: E402  (releases autograd's graph tasks at exit)
from . import reductions as _reductions  # noqa: E402
from .graphs import wrap_in_graph  # noqa: E402,F401  (HPU-graphs-style wrapper)
from . import distributed  # noqa: E402,F401  (registers the "pccl" c10d backend)

__all__ = ["BACKEND_NAME", "ops_report", "reset_ops_report"]
__version__ = "0.1.0"


def _register() -> None:
    if getattr(torch, BACKEND_NAME, None) is _device_module:
        return
    torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    torch._register_device_module(BACKEND_NAME, _device_module)
    # torch.phantom.memory etc. are importable by those names too
    # (`import torch.phantom.memory`, `from torch.phantom.streams import
    # Stream`), as torch.cuda's submodules are.
    import sys

    for name in ("memory", "streams", "random", "nvtx", "_gpu_trace",
                 "race_detector"):
        sys.modules[f"torch.{BACKEND_NAME}.{name}"] = getattr(_device_module, name)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True
    )


_register()
# Phantom tensors and events through torch.multiprocessing (reductions.py).
_reductions._register()

# torch.compile learns about phantom when it is imported, not here.
from . import _compile_hooks  # noqa: E402

_compile_hooks.install()


def ops_report() -> list:
    """How often each op ran on phantom, and how: a list of dicts
    ``{"op", "native", "async", "sync", "copied", "sync_reason"}``, most
    called first.
    ``native`` calls took a phantom kernel that queues the CPU kernel
    directly (add, sub, mul, div, relu); ``async`` calls took the generic
    path and were only queued (outputs computed ahead); ``sync`` calls took
    the generic path and made the host wait, for ``sync_reason``;
    ``copied`` calls ran through the copying CPU fallback, on host copies
    of their tensors, because the driver has no kernel view
    (docs/operators.md, "Without a kernel view"). Other ops
    with phantom kernels of their own (factories, copies, views, fill_)
    are not listed. A vendor reads this to plan native kernels."""
    return _C._ops_report()


def reset_ops_report() -> None:
    """Zeroes the counts ``ops_report()`` returns."""
    _C._reset_ops_report()


def _print_ops_report_at_exit() -> None:
    rows = ops_report()
    print(f"{BACKEND_NAME} ops report: {len(rows)} ops")
    print(f"{'op':<48} {'native':>8} {'async':>8} {'sync':>8} {'copied':>8}  sync reason")
    for row in rows:
        print(f"{row['op']:<48} {row['native']:>8} {row['async']:>8} {row['sync']:>8} "
              f"{row['copied']:>8}  {row['sync_reason']}")


# Exit hooks last, once the package has loaded.
_exit.install()
if _settings.value("PHANTOM_OPS_REPORT"):
    __import__("atexit").register(_print_ops_report_at_exit)
if _settings.value("PHANTOM_RACE_DETECTOR"):
    _device_module.race_detector._enable_from_setting(_settings.value("PHANTOM_RACE_DETECTOR"))

# Registers phantom with PyTorch Lightning when it is imported
# (torch_phantom.lightning; nothing is imported until then).
from . import _import_hooks  # noqa: E402

_import_hooks.install()
