"""PHANTOM_* settings: one parser, one error, limits that hold.

The settings are catalogued once, in C++ (device/common/phantom/common/
settings.h), and Python reaches the catalogue and the parser through
``torch_phantom._settings``. The tests take the list of settings from there,
so a new setting is covered without touching this file:

- every setting given a malformed value: autoloading through ``import
  torch`` prints exactly one warning with the parser's sentence, an explicit
  ``import torch_phantom`` raises one ValueError naming the variable, nothing
  of phantom is loaded (no libphantom mapped, the PrivateUse1 backend keeps
  its name, ``torch.accelerator`` still works) and nothing more reaches
  stderr, not at exit either;
- Python reads values through the parser (a switch with spaces around it);
- overflowing numbers are refused;
- every ``PHANTOM_*`` variable the code names is in the catalogue, and the
  README's settings table lists exactly the catalogue;
- the smallest accepted device (1 MiB, however spelled) allocates;
- an out-of-memory error says when the segment, not the request, found no
  room.

The parser's rules one by one are tested in C++ (tests/common), and a
LibTorch program's start-up in tests/runtime/settings_startup_test.cpp.
"""

import importlib.metadata
import json
import pathlib
import re

import pytest
import torch
from torch_phantom import _settings

from conftest import run_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
CATALOGUE = _settings.catalogue()
NAMES = [entry["name"] for entry in CATALOGUE]

# A value of each kind that no setting of that kind accepts; a setting of a
# new kind fails test_every_kind_has_a_bad_value until one is added here.
BAD_VALUE = {"count": "abc", "size": "lots", "switch": "true", "options": "bogus",
             "library": "drivers/", "choice": "sometimes"}


def sentence_for(name, value):
    """The parser's refusal of `value` for `name`."""
    with pytest.raises(ValueError) as caught:
        _settings.parse(name, value)
    assert caught.value.setting == name
    return str(caught.value)


def test_the_catalogue_lists_phantom_settings_once_each():
    assert len(NAMES) == len(set(NAMES)) >= 10
    assert all(name.startswith("PHANTOM_") for name in NAMES)
    for entry in CATALOGUE:
        assert entry["accepted"] and entry["default"] and entry["meaning"], entry


def test_every_kind_has_a_bad_value():
    for entry in CATALOGUE:
        assert entry["kind"] in BAD_VALUE, f"add a bad value for {entry['kind']!r}"


# --------------------------------------------------------------------------
# A malformed value: one error, nothing loaded, nothing at exit
# --------------------------------------------------------------------------

MALFORMED = [(name, BAD_VALUE[entry["kind"]]) for name, entry in zip(NAMES, CATALOGUE)] + [
    # The forms of the issue that were accepted or wrapped before.
    ("PHANTOM_ALLOC_CONF", "max_split_size_mb:99999999999999999999"),
    ("PHANTOM_DEVICE_COUNT", " 99999999999999999999"),
    ("PHANTOM_FAULT_KERNEL", " 3 kernels"),
]

_STARTUP_SCRIPT = """
import json, torch
state = {
    "phantom_attribute": hasattr(torch, "phantom"),
    "backend_name": torch._C._get_privateuse1_backend_name(),
    "accelerator_available": torch.accelerator.is_available(),
    "cpu_works": torch.ones(3).sum().item() == 3,
}
try:
    import torch_phantom
    state["import"] = None
except Exception as error:
    state["import"] = [type(error).__name__, isinstance(error, ValueError),
                       getattr(error, "setting", None), str(error)]
state["libphantom_mapped"] = "libphantom" in open("/proc/self/maps").read()
print(json.dumps(state))
"""


def _autoload_env(tmp_path):
    """The environment that makes `import torch` autoload phantom: the
    installed entry point, or (dev builds) a throw-away .dist-info naming
    the same entry point, as tests/python/test_autoload.py does."""
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    if any(ep.name == "torch_phantom"
           for ep in importlib.metadata.entry_points(group="torch.backends")):
        return env
    dist = tmp_path / "torch_phantom_fake-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_phantom_fake\n"
                                   "Version: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        "[torch.backends]\ntorch_phantom = torch_phantom_autoload:load\n")
    import os
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(tmp_path), os.environ.get("PYTHONPATH", "")] if p)
    return env


@pytest.mark.parametrize("name,value", MALFORMED, ids=[f"{n}={v}" for n, v in MALFORMED])
def test_a_malformed_setting_is_one_error_and_loads_nothing(tmp_path, name, value):
    sentence = sentence_for(name, value)
    assert sentence.startswith(f"{name}='{value}' is not ")
    assert re.fullmatch(r"PHANTOM_[A-Z_]+='[^']*' is not [^;]+; accepted: [^;]+; "
                        r"unset it for the default [^;]+", sentence), sentence
    result = run_python(_STARTUP_SCRIPT, {**_autoload_env(tmp_path), name: value})
    assert result.returncode == 0, result.stderr
    # stderr is the one warning of autoload, and nothing else: no traceback
    # at exit, no second message.
    assert re.fullmatch(r"[^\n]*: RuntimeWarning: phantom is not loaded: "
                        + re.escape(sentence) + r"\n  entrypoint\(\)\n",
                        result.stderr), result.stderr
    state = json.loads(result.stdout)
    assert state["import"] == ["SettingError", True, name, sentence]
    assert state == {
        "phantom_attribute": False,
        "backend_name": "privateuseone",
        "accelerator_available": False,
        "cpu_works": True,
        "import": state["import"],
        "libphantom_mapped": False,
    }


def test_with_autoload_off_the_import_error_is_all_there_is():
    code = """
try:
    import torch_phantom
except ValueError as error:
    print(error)
"""
    result = run_python(code, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
                               "PHANTOM_SYNC_GENERIC": "true"})
    assert result.returncode == 0
    assert result.stdout == sentence_for("PHANTOM_SYNC_GENERIC", "true") + "\n"
    assert result.stderr == ""


def test_well_formed_settings_load_silently(tmp_path):
    env = {**_autoload_env(tmp_path), "PHANTOM_SYNC_GENERIC": " 0 ",
           "PHANTOM_ALLOC_CONF": "MAX_SPLIT_SIZE_MB: 64 ,", "PHANTOM_DEVICE_MEMORY": "64 mib"}
    result = run_python("import torch\nprint(torch.ones(2, device='phantom').sum().item(),"
                        " torch.phantom.mem_get_info()[1])", env)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.split() == ["2.0", str(64 << 20)]


def test_python_reads_values_through_the_parser():
    # Spaces around a value are ignored by every reader; Python's own
    # `== "1"` test of PHANTOM_OPS_REPORT did not.
    result = run_python("import torch, torch_phantom\n(torch.ones(2, device='phantom') + 1).sin()",
                        {"PHANTOM_OPS_REPORT": " 1 "})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("phantom ops report:"), result.stdout


def test_values_come_back_typed():
    assert _settings.parse("PHANTOM_DEVICE_MEMORY", "2047KiB") == 2047 << 10
    assert _settings.parse("PHANTOM_DEVICE_COUNT", None) == 2
    assert _settings.parse("PHANTOM_SYNC_GENERIC", "1") is True
    assert _settings.parse("PHANTOM_ALLOC_CONF",
                           "max_split_size_mb:64,garbage_collection_threshold:0.5") == {
        "max_split_size_mb": 64, "garbage_collection_threshold": 0.5}
    with pytest.raises(KeyError, match="PHANTOM_NOPE is not a phantom setting"):
        _settings.parse("PHANTOM_NOPE", "1")


OVERFLOWING = {
    "count": "99999999999999999999",
    "size": "99999999999999999999T",
    "switch": "18446744073709551617",  # 2**64 + 1 wraps to 1
}


@pytest.mark.parametrize("entry", [e for e in CATALOGUE if e["kind"] in OVERFLOWING],
                         ids=lambda e: e["name"])
def test_overflowing_numbers_are_refused(entry):
    value = OVERFLOWING[entry["kind"]]
    expected = "0 or 1" if entry["kind"] == "switch" else "in range: larger than"
    with pytest.raises(ValueError, match=re.escape(f"{entry['name']}='{value}' is not {expected}")):
        _settings.parse(entry["name"], value)


def test_overflowing_allocator_option_is_refused():
    with pytest.raises(ValueError, match=r"max_split_size_mb='99999999999999999999' is not "
                                         r"in range: larger than 1048576"):
        _settings.parse("PHANTOM_ALLOC_CONF", "max_split_size_mb:99999999999999999999")


# --------------------------------------------------------------------------
# One list: the code's variables, the catalogue and the README
# --------------------------------------------------------------------------


def test_every_phantom_variable_the_code_names_is_in_the_catalogue():
    named = set()
    for folder in ("device", "ops", "python"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".h", ".cc", ".cpp", ".py"}:
                named.update(re.findall(r"[\"'](PHANTOM_[A-Z0-9_]+)[\"']", path.read_text()))
    assert named, "no source found under the repository root"
    assert named <= set(NAMES), sorted(named - set(NAMES))


def test_the_readme_table_lists_exactly_the_catalogue_with_its_defaults():
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        match = re.match(r"\| `(PHANTOM_[A-Z0-9_]+)` \|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    assert sorted(rows) == sorted(NAMES)
    for entry in CATALOGUE:
        assert rows[entry["name"]][-1] == f"`{entry['default']}`", (entry["name"], rows[entry["name"]])


# --------------------------------------------------------------------------
# The limits hold
# --------------------------------------------------------------------------

_SMALL_DEVICE_SCRIPT = """
import torch
capacity = torch.phantom.mem_get_info()[1]
tiny = torch.ones(4, device="phantom")          # 16 bytes
many = [torch.full((100,), float(i), device="phantom") for i in range(50)]
half = torch.ones(capacity // 2 // 4, device="phantom")
assert tiny.sum().item() == 4 and many[7].sum().item() == 700
assert half.sum().item() == capacity // 2 // 4
assert torch.phantom.memory_reserved() <= capacity
del tiny, half, many
torch.phantom.empty_cache()
whole = torch.ones(capacity // 4, device="phantom")  # the whole device, one tensor
assert whole.cpu().sum().item() == capacity // 4  # the sum on the host: the device is full
print(capacity)
"""


@pytest.mark.parametrize("memory,capacity", [("1MiB", 1 << 20), ("1024KiB", 1 << 20),
                                             ("2047KiB", 2047 << 10), ("1048576", 1 << 20)])
def test_the_smallest_accepted_devices_allocate(memory, capacity):
    result = run_python(_SMALL_DEVICE_SCRIPT, {"PHANTOM_DEVICE_MEMORY": memory})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(capacity)]


_OOM_SCRIPT = """
import torch
def oom(numel):
    try:
        torch.empty(numel, device="phantom")
    except torch.OutOfMemoryError as error:
        return str(error)
    return "no error"
keep = torch.empty((1 << 20) // 4, device="phantom")   # the whole 1 MiB device
print(oom(4))
print(oom((1 << 20) // 4))                             # 1 MiB: the request itself
"""


def test_out_of_memory_says_when_the_segment_is_what_does_not_fit():
    result = run_python(_OOM_SCRIPT, {"PHANTOM_DEVICE_MEMORY": "1MiB"})
    assert result.returncode == 0, result.stderr[-3000:]
    segment, request = result.stdout.splitlines()
    # 16 bytes come from a 128 KiB segment on a 1 MiB device (docs/allocator.md).
    assert re.match(
        r"phantom out of memory: tried to allocate 16 bytes \(16 bytes\) on phantom:0, which "
        r"needs a new 128\.00 KiB segment of device memory \(the caching allocator serves "
        r"requests of this size from segments of that size\), and the device has no free "
        r"range that large\. Device capacity 1\.00 MiB;.* free on the device 0 bytes\. Free "
        r"tensors you no longer need, or use smaller batches\. The driver says: phantom device "
        r"0 is out of memory: tried to allocate 128\.00 KiB .*PHANTOM_DEVICE_MEMORY sets the "
        r"capacity", segment), segment
    assert request.startswith("phantom out of memory: tried to allocate 1.00 MiB (1048576 "
                              "bytes) on phantom:0. Device capacity"), request
    assert "segment" not in request
