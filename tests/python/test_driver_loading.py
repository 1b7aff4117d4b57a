"""The driver is loaded at run time (PHANTOM_DRIVER; docs/fake-driver.md,
"Loading"): the installed fake by default, by file name or path when named,
and a driver that cannot be loaded is one clear error naming the file and
the setting, with the device reported unavailable instead of a crash.
"""

import os

import torch_phantom

from conftest import run_python

_USE = """
import torch, torch_phantom
print(torch.phantom.is_available(), torch.phantom.device_count())
try:
    print((torch.ones(3, device="phantom") * 2).sum().item())
except RuntimeError as error:
    print("RuntimeError:", error)
print(torch_phantom._C._hal_info()["driver_library"])
"""


def _run(driver=None):
    # An empty value is the setting unset: the default, whatever driver the
    # suite itself runs on.
    env = {"PHANTOM_DRIVER": driver if driver is not None else ""}
    result = run_python(_USE, env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_installed_fake_is_the_default_driver():
    lines = _run()
    assert lines[:2] == ["True 2", "6.0"]
    assert lines[2] == os.path.join(os.path.dirname(torch_phantom.__file__), "libphantom_fake.so")


def test_a_driver_named_by_file_name_or_path_is_loaded():
    path = os.path.join(os.path.dirname(torch_phantom.__file__), "libphantom_fake.so")
    for driver in ("libphantom_fake.so", path):
        assert _run(driver)[:3] == ["True 2", "6.0", path]


def test_a_missing_driver_is_one_error_naming_the_file_and_the_setting():
    lines = _run("/nonexistent/libmy_driver.so")
    assert lines[0] == "False 0"
    assert lines[1].startswith("RuntimeError: ")
    assert "cannot load the phantom driver '/nonexistent/libmy_driver.so'" in lines[1]
    assert "set PHANTOM_DRIVER to the file name or path of a phantom driver library" in lines[1]
    assert lines[2] == ""
