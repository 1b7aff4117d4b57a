"""Running PyTorch's device-generic tests on phantom.

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
"""

import sys

import torch

from ._name import BACKEND_NAME

__all__ = ["enable_device_type_tests", "DEVICE_TYPE"]

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
