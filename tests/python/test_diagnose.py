"""``python -m torch_phantom``: the diagnose command (torch_phantom/_diagnose.py).

Each test runs the command in a fresh interpreter, as a user would, and
reads its report: versions, devices, settings, the self-test and the ops
report; the exit status is 1 when a check fails."""
import os
import re
import subprocess
import sys

import pytest
import torch

import torch_phantom

HAL_HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "device", "hal", "phantom", "hal.h")


def _diagnose(*args, **env):
    """Runs ``python -m torch_phantom *args`` with this environment plus
    ``env`` (a value of None removes the variable)."""
    environment = dict(os.environ)
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return subprocess.run([sys.executable, "-m", "torch_phantom", *args], env=environment,
                          capture_output=True, text=True, timeout=120)


def _check_lines(output):
    """{check label: (ok, detail)} from the self-test section."""
    checks = {}
    for line in output.splitlines():
        match = re.match(r"  (ok  |FAIL)  (.+?)\s+[\d.]+ ms  (.*)", line)
        if match:
            checks[match.group(2)] = (match.group(1) == "ok  ", match.group(3))
    return checks


@pytest.mark.requires_kernel_view("expects the native kernels in the self-test's ops report")
def test_a_healthy_device_reports_everything_and_exits_0():
    result = _diagnose(PHANTOM_DEVICE_COUNT="2", PHANTOM_DEVICE_MEMORY="512MiB",
                       PHANTOM_DEVICES="4")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    # Versions, from sources other than the command's own.
    header_abi = re.search(r"#define PH_HAL_ABI_VERSION (\d+)", open(HAL_HEADER).read()).group(1)
    assert f"HAL ABI        driver {header_abi}, runtime {header_abi}\n" in out
    assert f"torch          {torch.__version__} " in out
    assert f"torch_phantom  {torch_phantom.__version__} " in out
    assert re.search(r"driver         libphantom_fake\.so \(/.*libphantom_fake\.so\)", out)
    # Devices and settings as this environment sets them.
    assert "Devices (2)" in out
    assert len(re.findall(r"phantom:\d  Phantom fake accelerator: 512\.00 MiB", out)) == 2
    assert re.search(r"PHANTOM_DEVICE_MEMORY\s+'512MiB' \(set\).*in force: 512\.00 MiB per device", out)
    assert re.search(r"PHANTOM_SYNC_GENERIC\s+default 0 \(off\)", out)
    assert re.search(r"PHANTOM_DEVICES\s+'4'\s+UNKNOWN", out)
    # Every check, on both devices, passed.
    checks = _check_lines(out)
    for device in ("phantom:0", "phantom:1"):
        for name in ("allocation round trip", "copies", "op on the default stream",
                     "op on a side stream", "event timing"):
            assert checks[f"{device}: {name}"][0], (device, name, checks)
    assert checks["phantom:0: training step"][0]
    assert "phantom:0 -> phantom:1" in checks["phantom:0: copies"][1]
    # The ops report of the self-test: addmm took its native kernel.
    assert re.search(r"aten::addmm\s+[1-9]\d*\s+0\s+0", out)
    assert out.rstrip().splitlines()[-1].startswith("phantom self-test: all checks passed")


def test_no_device_is_a_failed_check_and_exit_1():
    result = _diagnose(PHANTOM_DEVICE_COUNT="0")
    assert result.returncode == 1, result.stdout + result.stderr
    ok, detail = _check_lines(result.stdout)["a phantom device is available"]
    assert not ok and "reports 0 devices" in detail
    assert "Devices (0)\n  none: " in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith(
        "phantom self-test FAILED (")


@pytest.mark.requires_kernel_view(
    "injects kernel faults, and ops without a kernel view launch no kernels")
def test_injected_faults_fail_their_checks_and_the_others_still_run():
    # The first allocation and the first kernel fail (docs/fault-injection.md).
    result = _diagnose(PHANTOM_DEVICE_COUNT="2", PHANTOM_FAULT_ALLOC="1",
                       PHANTOM_FAULT_KERNEL="1")
    assert result.returncode == 1, result.stdout + result.stderr
    checks = _check_lines(result.stdout)
    failed = {label: detail for label, (ok, detail) in checks.items() if not ok}
    assert list(failed) == ["phantom:0: allocation round trip",
                            "phantom:0: op on the default stream"], checks
    assert failed["phantom:0: allocation round trip"].startswith("OutOfMemoryError: ")
    assert "Injected fault" in failed["phantom:0: allocation round trip"]
    assert failed["phantom:0: op on the default stream"].startswith("AcceleratorError: ")
    assert "injected device fault: kernel #1" in failed["phantom:0: op on the default stream"]
    assert checks["phantom:1: event timing"][0]  # later checks ran, and passed
    assert result.stdout.rstrip().splitlines()[-1] == (
        "phantom self-test FAILED ({}): phantom:0: allocation round trip, "
        "phantom:0: op on the default stream".format(
            re.search(r"FAILED \(([\d.]+ s)\)", result.stdout).group(1)))


def test_arguments_are_refused_and_help_is_the_description():
    result = _diagnose("--json")
    assert result.returncode == 2
    assert "python -m torch_phantom takes no arguments (got --json)" in result.stderr
    result = _diagnose("--help")
    assert result.returncode == 0
    assert "python -m torch_phantom" in result.stdout and "Self-test" not in result.stdout
