"""Autoloading through the ``torch.backends`` entry point.

With the package installed, ``import torch`` alone must make
``torch.phantom`` and the ``phantom`` device available;
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` must turn that off; and a broken
installation must only warn, never break ``import torch``. (A malformed
``PHANTOM_*`` setting is one warning too, without the advice to reinstall:
tests/python/test_settings.py checks stderr for every setting.)

The tests against the installed distribution skip in dev builds (where the
package is on PYTHONPATH but not installed). The others simulate an
installation with a throw-away ``.dist-info`` carrying the same entry point
the package declares (``torch_phantom_autoload:load``), so the entry point
function itself is exercised in every build.
"""

import importlib.metadata
import os
import textwrap

import pytest

from conftest import run_python

AUTOLOAD_CHECK = """
import sys, torch
print("loaded" if "torch_phantom" in sys.modules else "not-loaded")
print(torch.phantom.device_count())
x = torch.ones(2, device="phantom")
print(x.device, x.sum().item())
"""

DISABLED_CHECK = """
import sys, torch
print(hasattr(torch, "phantom"), "torch_phantom" in sys.modules)
"""


def installed_entry_point():
    for ep in importlib.metadata.entry_points(group="torch.backends"):
        if ep.name == "torch_phantom":
            return ep
    return None


requires_install = pytest.mark.skipif(
    installed_entry_point() is None,
    reason="torch_phantom is not pip-installed (dev build on PYTHONPATH): "
    "no torch.backends entry point to autoload",
)


def fake_install(tmp_path):
    """A .dist-info on a new PYTHONPATH entry declaring the entry point."""
    dist = tmp_path / "torch_phantom_fake-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_phantom_fake\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_phantom = torch_phantom_autoload:load\n")
    return tmp_path


def env_with_path_first(path, **extra):
    pythonpath = os.pathsep.join(p for p in [str(path), os.environ.get("PYTHONPATH", "")] if p)
    return {"PYTHONPATH": pythonpath, **extra}


def clean_autoload_env(**extra):
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    env.update(extra)
    return env


@requires_install
def test_installed_entry_point_targets_autoload():
    ep = installed_entry_point()
    assert ep.value == "torch_phantom_autoload:load"
    assert callable(ep.load())


@requires_install
def test_import_torch_autoloads_installed_package():
    result = run_python(AUTOLOAD_CHECK, clean_autoload_env())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[0] == "loaded"
    assert lines[1] == os.environ["PHANTOM_DEVICE_COUNT"]
    assert "phantom:0" in result.stdout


@requires_install
def test_autoload_disabled_for_installed_package():
    result = run_python(DISABLED_CHECK, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_entry_point_autoloads(tmp_path):
    path = fake_install(tmp_path)
    result = run_python(AUTOLOAD_CHECK, env_with_path_first(path, **clean_autoload_env()))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[0] == "loaded"
    assert lines[1] == os.environ["PHANTOM_DEVICE_COUNT"]
    assert "phantom:0" in result.stdout
    assert "Warning" not in result.stderr, result.stderr


def test_entry_point_respects_autoload_off(tmp_path):
    path = fake_install(tmp_path)
    result = run_python(DISABLED_CHECK, env_with_path_first(path, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_broken_installation_only_warns(tmp_path):
    path = fake_install(tmp_path)
    # A torch_phantom that fails to import, found before the real one.
    broken = path / "torch_phantom"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('simulated broken build')\n")
    code = textwrap.dedent(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        assert torch.ones(2).sum().item() == 2
        print(hasattr(torch, "phantom"))
        for w in caught:
            print("WARNING", w.category.__name__, w.message)
        """
    )
    result = run_python(code, env_with_path_first(path, **clean_autoload_env()))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.splitlines()[0] == "False"
    assert "WARNING RuntimeWarning" in out
    assert "simulated broken build" in out
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in out


def test_explicit_import_after_autoload_is_idempotent(tmp_path):
    path = fake_install(tmp_path)
    code = """
import torch
first = torch.phantom
import torch_phantom
assert torch.phantom is first
torch_phantom._register()
assert torch.phantom is first
print(torch.ones(1, device="phantom").device)
"""
    result = run_python(code, env_with_path_first(path, **clean_autoload_env()))
    assert result.returncode == 0, result.stderr
    assert "phantom:0" in result.stdout
