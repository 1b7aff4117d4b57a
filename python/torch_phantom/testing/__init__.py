"""Testing code on the device: PyTorch's device-generic tests, and fault
injection.

``torch_phantom.testing.faults`` makes the device fail on purpose (an
out-of-memory error at the k-th allocation, a device error at the k-th
kernel, latency on every kernel and copy; ``faults.py``,
docs/fault-injection.md). The rest of this module runs PyTorch's
device-generic tests on the device.

PyTorch's test framework (``torch.testing._internal.common_device_type``)
decides which device types exist once, when it is first imported: it adds
``PrivateUse1TestBase`` to ``device_type_test_bases`` only if
``torch.phantom.is_available()`` is true at that moment. So the backend must
be loaded before that module is imported. With the package installed,
``import torch`` already loads it (the ``torch.backends`` entry point); with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` it does not, and a test suite should
start with::

    import torch_phantom.testing
    torch_phantom.testing.enable_device_type_tests()

    from torch.testing._internal.common_device_type import (
        instantiate_device_type_tests, ops)
    ...
    instantiate_device_type_tests(TestFoo, globals(), only_for=("phantom",))

``enable_device_type_tests()`` loads the backend and, should
``common_device_type`` have been imported before the backend was loaded
(by a plugin or another conftest), adds ``PrivateUse1TestBase`` to it after
the fact, so the order of imports stops mattering. It never imports
``torch.testing._internal`` itself (that is slow and pulls in numpy and
expecttest): it only patches the module if it is already there.

Fused optimizers (``Adam(fused=True)`` ...) run on phantom: torch 2.13's
``torch.utils._foreach_utils._get_fused_kernels_supported_devices()``, the
one list ``torch.optim`` consults, already names the PrivateUse1 backend,
and the fused kernels (``_fused_adam_`` ...) reach the generic path, which
runs the CPU's. PyTorch has no hook through which a backend declares that
to its *test* metadata, though: each ``OptimizerInfo`` of
``common_optimizers.optim_db`` lists the device types it tests fused on
(``supports_fused_on``), and no PrivateUse1 backend is among them, so no
suite ever tries ``fused=True`` on phantom. ``declare_fused_optimizers()``
adds phantom wherever the CPU is listed, since those are the kernels phantom
runs.
"""

import sys

import torch

from .._name import BACKEND_NAME
from . import faults

__all__ = ["enable_device_type_tests", "declare_fused_optimizers", "DEVICE_TYPE", "faults"]

DEVICE_TYPE = BACKEND_NAME

_CDT = "torch.testing._internal.common_device_type"


def enable_device_type_tests() -> bool:
    """Makes ``instantiate_device_type_tests(..., only_for=("phantom",))``
    generate phantom tests, whichever was imported first. Returns True when
    the phantom device is available (so tests will be generated for it)."""
    import torch_phantom  # noqa: F401  (registers the backend and torch.phantom)

    available = bool(getattr(torch, BACKEND_NAME).is_available())
    cdt = sys.modules.get(_CDT)
    if available and cdt is not None:
        bases = cdt.device_type_test_bases
        if cdt.PrivateUse1TestBase not in bases:
            bases.append(cdt.PrivateUse1TestBase)
    return available


def declare_fused_optimizers() -> list:
    """Adds phantom to ``supports_fused_on`` of every ``OptimizerInfo`` in
    ``torch.testing._internal.common_optimizers.optim_db`` that lists the
    CPU, so that ``_get_optim_inputs_including_global_cliquey_kwargs`` and
    the suites built on it test ``fused=True`` on phantom. Imports
    ``common_optimizers`` (after ``enable_device_type_tests()``, which it
    calls). Returns the names of the optimizers declared."""
    enable_device_type_tests()
    from torch.testing._internal.common_optimizers import optim_db

    declared = []
    for info in optim_db:
        if "cpu" in info.supports_fused_on:
            if DEVICE_TYPE not in info.supports_fused_on:
                info.supports_fused_on = (*info.supports_fused_on, DEVICE_TYPE)
            declared.append(info.name)
    return declared
