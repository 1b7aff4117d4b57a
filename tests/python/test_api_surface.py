"""The shape of ``torch.phantom`` as users browse it: ``__all__`` lists
exactly its public names, each documented; ``help()`` shows those and not
the module's imports; docs/api-coverage.md matches torch.cuda's names. The
testing helpers (``torch_phantom.testing``, with fault injection) are held
to the same rules, outside the device module."""

import inspect
import pydoc

import pytest
import torch

import torch_phantom.testing

import api_coverage

SUBMODULES = ["memory", "streams", "random", "nvtx", "race_detector"]
# Modules of the package outside torch.phantom, by the name users import.
PACKAGE_MODULES = {
    "torch_phantom.testing": torch_phantom.testing,
    "torch_phantom.testing.faults": torch_phantom.testing.faults,
}


def all_modules():
    """(the name users write, module) of every public module but torch.phantom."""
    for name in SUBMODULES:
        yield f"torch.phantom.{name}", getattr(torch.phantom, name)
    yield from PACKAGE_MODULES.items()


def public_names(module):
    return {name for name in vars(module) if not name.startswith("_")}


def test_all_lists_exactly_the_public_names():
    exported = set(torch.phantom.__all__)
    assert len(exported) == len(torch.phantom.__all__), "a name is listed twice"
    # default_generators is built on demand by the module's __getattr__.
    assert exported - {"default_generators"} == public_names(torch.phantom)
    for name in exported:
        assert getattr(torch.phantom, name) is not None, name


@pytest.mark.parametrize("module_name,module", list(all_modules()),
                         ids=[name for name, _ in all_modules()])
def test_submodules_list_their_public_functions(module_name, module):
    defined_here = {
        name for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        and (inspect.isfunction(value) or inspect.isclass(value))
    }
    assert defined_here <= set(module.__all__), defined_here - set(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name


def documented_objects():
    for name in torch.phantom.__all__:
        value = getattr(torch.phantom, name)
        if inspect.isfunction(value) or inspect.isclass(value) or inspect.ismodule(value):
            yield f"torch.phantom.{name}", value
            if inspect.isclass(value) and value.__module__.startswith("torch_phantom"):
                for attr, member in vars(value).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        yield f"torch.phantom.{name}.{attr}", member
    for module_name, module in all_modules():
        for name in module.__all__:
            yield f"{module_name}.{name}", getattr(module, name)


def test_every_public_function_class_and_method_has_a_docstring():
    undocumented = [name for name, value in documented_objects()
                    if not (inspect.getdoc(value) or "").strip()
                    or (inspect.isclass(value) and value.__doc__ is None)]
    assert not undocumented, undocumented


def test_help_shows_the_api_and_not_the_imports():
    """help(torch.phantom) lists, under CLASSES, FUNCTIONS and DATA, only
    names of __all__: not threading, typing's Any or _C."""
    text = pydoc.render_doc(torch.phantom, renderer=pydoc.plaintext)
    listed, section = set(), None
    for line in text.splitlines():
        if line and not line[0].isspace():
            section = line.strip()
        elif section in ("FUNCTIONS", "DATA") and line.startswith("    ") \
                and not line.startswith("     "):
            listed.add(line.strip().split("(")[0].split(" = ")[0])
        elif section == "CLASSES" and line.startswith("    class "):
            listed.add(line.split()[1].split("(")[0])
    # Dunders (__all__, the module's __getattr__) are pydoc's own listing.
    listed = {name for name in listed if name and not name.startswith("__")}
    assert {"get_device_properties", "memory_summary", "Stream", "has_half"} <= listed
    assert listed <= set(torch.phantom.__all__), listed - set(torch.phantom.__all__)


def test_api_coverage_page_is_up_to_date():
    rows, problems = api_coverage.classify()
    assert not problems, "\n".join(problems)
    with open(api_coverage.PAGE) as page:
        committed = page.read()
    assert committed == api_coverage.render(), (
        "docs/api-coverage.md is out of date; regenerate it with "
        "`cd tests/python && python api_coverage.py --write`"
    )


def test_at_most_five_device_generic_names_are_missing_without_an_issue():
    assert len(api_coverage.uncovered_missing()) <= 5, api_coverage.uncovered_missing()
