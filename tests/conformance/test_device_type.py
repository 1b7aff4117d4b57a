"""PyTorch's device-generic test framework targets phantom.

``instantiate_device_type_tests(..., only_for=("phantom",))`` must produce
phantom tests through ``PrivateUse1TestBase``, with and without autoload,
whatever was imported first, and ``PYTORCH_TESTING_DEVICE_ONLY_FOR`` /
``..._EXCEPT_FOR`` must select it as they select ``cuda``. The first half
is itself a device-generic test class instantiated for phantom.
"""

import os
import subprocess
import sys
import textwrap

import torch
import torch_phantom.testing

torch_phantom.testing.enable_device_type_tests()

from torch.testing._internal import common_device_type as cdt  # noqa: E402
from torch.testing._internal.common_device_type import (  # noqa: E402
    deviceCountAtLeast,
    dtypes,
    instantiate_device_type_tests,
    onlyPRIVATEUSE1,
)
from torch.testing._internal.common_utils import TestCase  # noqa: E402

DEVICE_TYPE = torch_phantom.testing.DEVICE_TYPE


class TestDeviceGeneric(TestCase):
    def test_device(self, device):
        self.assertEqual(self.device_type, DEVICE_TYPE)
        self.assertEqual(device, f"{DEVICE_TYPE}:0")
        x = torch.arange(6, device=device).reshape(2, 3)
        self.assertEqual(x.device, torch.device(device))
        self.assertEqual(x.sum().item(), 15)

    @dtypes(torch.float32, torch.int64, torch.bool)
    def test_dtypes(self, device, dtype):
        x = torch.ones(4, device=device, dtype=dtype)
        self.assertEqual(x.dtype, dtype)
        self.assertEqual(x.cpu(), torch.ones(4, dtype=dtype))

    @onlyPRIVATEUSE1
    def test_only_privateuse1(self, device):
        self.assertTrue(torch.device(device).type == DEVICE_TYPE)

    @deviceCountAtLeast(2)
    def test_all_devices(self, devices):
        self.assertEqual(
            devices,
            [f"{DEVICE_TYPE}:{i}" for i in range(torch.phantom.device_count())],
        )
        y = torch.ones(3, device=devices[1]) + 1
        self.assertEqual(y.to(devices[0]).sum().item(), 6.0)


instantiate_device_type_tests(TestDeviceGeneric, globals(), only_for=(DEVICE_TYPE,))


def test_phantom_test_base_registered():
    assert cdt.PrivateUse1TestBase in cdt.device_type_test_bases
    assert cdt.get_desired_device_type_test_bases(only_for=(DEVICE_TYPE,)) == [
        cdt.PrivateUse1TestBase
    ]
    # The instantiated class above (named after "privateuse1", as PyTorch
    # names every PrivateUse1 backend's classes).
    assert "TestDeviceGenericPRIVATEUSE1" in globals()
    assert "test_device_phantom" in dir(globals()["TestDeviceGenericPRIVATEUSE1"])


_INSTANTIATE = """
import os, sys
from torch.testing._internal import common_device_type as cdt
from torch.testing._internal.common_utils import TestCase
class TestT(TestCase):
    def test_x(self, device):
        pass
scope = {"TestT": TestT}
kwargs = eval(os.environ.get("ONLY_FOR_KWARGS", "{}"))
cdt.instantiate_device_type_tests(TestT, scope, **kwargs)
print("CLASSES", sorted(k for k in scope if k.startswith("TestT")))
print("TESTS", sorted(t for k, c in scope.items() if k.startswith("TestT")
                      for t in dir(c) if t.startswith("test_x")))
"""


def _run(code, **env):
    full_env = dict(os.environ)
    full_env.update(env)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _tests(stdout):
    line = [l for l in stdout.splitlines() if l.startswith("TESTS")][-1]
    return eval(line[len("TESTS"):])


def test_without_autoload_import_backend_first():
    out = _run(
        "import torch\n"
        "assert not hasattr(torch, 'phantom'), 'autoload was supposed to be off'\n"
        "import torch_phantom.testing\n"
        "torch_phantom.testing.enable_device_type_tests()\n" + _INSTANTIATE,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        ONLY_FOR_KWARGS="{'only_for': ('phantom',)}",
    )
    assert _tests(out) == ["test_x_phantom"]


def test_without_autoload_framework_imported_first():
    """A plugin imported the framework before the backend: enabling it
    afterwards still adds PrivateUse1TestBase."""
    out = _run(
        "import torch\n"
        "from torch.testing._internal import common_device_type as cdt\n"
        "assert cdt.PrivateUse1TestBase not in cdt.device_type_test_bases\n"
        "import torch_phantom.testing\n"
        "torch_phantom.testing.enable_device_type_tests()\n" + _INSTANTIATE,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
        ONLY_FOR_KWARGS="{'only_for': ('phantom',)}",
    )
    assert _tests(out) == ["test_x_phantom"]


def test_with_autoload_plain_import_torch():
    """Installed package: `import torch` alone is enough."""
    out = _run(
        "import torch\n"
        "assert hasattr(torch, 'phantom'), 'autoload did not load torch_phantom'\n"
        + _INSTANTIATE,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        ONLY_FOR_KWARGS="{'only_for': ('phantom',)}",
    )
    assert _tests(out) == ["test_x_phantom"]


def test_env_only_for_selects_phantom():
    out = _run(
        "import torch\n" + _INSTANTIATE,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        PYTORCH_TESTING_DEVICE_ONLY_FOR="phantom",
    )
    assert _tests(out) == ["test_x_phantom"]


def test_env_only_for_cpu_and_phantom():
    out = _run(
        "import torch\n" + _INSTANTIATE,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        PYTORCH_TESTING_DEVICE_ONLY_FOR="cpu,phantom",
    )
    assert _tests(out) == ["test_x_cpu", "test_x_phantom"]


def test_env_except_for_phantom():
    out = _run(
        "import torch\n" + _INSTANTIATE,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        PYTORCH_TESTING_DEVICE_EXCEPT_FOR="phantom",
    )
    assert _tests(out) == ["test_x_cpu"]


def test_privateuseone_alias_in_only_for():
    """only_for=("privateuse1",) names the backend too, as in PyTorch."""
    out = _run(
        "import torch\n" + _INSTANTIATE,
        TORCH_DEVICE_BACKEND_AUTOLOAD="1",
        ONLY_FOR_KWARGS="{'only_for': ('privateuse1',)}",
    )
    assert _tests(out) == ["test_x_phantom"]
