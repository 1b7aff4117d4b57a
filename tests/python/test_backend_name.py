"""The backend's name is the build's choice, not a literal.

A vendor renames the backend with one build option (CMake's
``PHANTOM_BACKEND_NAME``; ``scripts/build_python.sh --backend-name``), and
``scripts/test_rename.sh`` builds and smoke-tests such a build in CI. These
tests keep the package honest in the default build, without a rebuild:
the name the package registers is the one the build wrote, and no module
of the package spells the device "phantom" in its code (``torch.phantom``,
``"phantom:0"``, a message naming the device) where it must say
``BACKEND_NAME``. Docstrings may say phantom; identifiers such as
``torch_phantom`` or ``_phantom_wrapped`` are names, not the device's.
"""

import ast
import pathlib
import re

import pytest
import torch
import torch_phantom

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "torch_phantom"
SOURCES = sorted(PACKAGE.rglob("*.py"))
# "phantom" as a word of its own: not torch_phantom, _phantom_x, phantom_y,
# PHANTOM_SETTING or Phantom (a class name).
DEVICE_WORD = re.compile(r"(?<![\w.])phantom(?!\w)")


def test_the_registered_name_is_the_one_the_build_wrote():
    from torch_phantom import _backend_name

    assert torch_phantom.BACKEND_NAME == _backend_name.BACKEND_NAME
    assert torch._C._get_privateuse1_backend_name() == torch_phantom.BACKEND_NAME
    assert getattr(torch, torch_phantom.BACKEND_NAME).synchronize is not None
    # The generated module is the build's, not a file of the source tree.
    assert not (PACKAGE / "_backend_name.py").exists()


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                yield body[0].value


def _hard_coded_names(path):
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node) for node in _docstrings(tree)}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "phantom"
                and isinstance(node.value, ast.Name) and node.value.id == "torch"):
            found.append(f"{path.name}:{node.lineno}: torch.phantom")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and DEVICE_WORD.search(node.value)):
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(PACKAGE)) for p in SOURCES])
def test_no_module_spells_the_device_name(path):
    assert not _hard_coded_names(path), (
        "use torch_phantom._name.BACKEND_NAME (and the device module, not "
        "torch.phantom) so a renamed build works: " + "; ".join(_hard_coded_names(path)))


def test_the_check_finds_a_hard_coded_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""phantom in a docstring is fine."""\n'
                      'import torch\n'
                      'def f(device="phantom"):\n'
                      '    return torch.phantom.synchronize(f"phantom:{0}")\n')
    found = _hard_coded_names(sample)
    assert [entry.split(": ", 1)[1] for entry in found] == [
        "'phantom'", "torch.phantom", "'phantom:'"], found
