"""Shared setup of the user-facing pytest suite.

The environment defaults below are set before torch (and so the phantom
driver) is imported: two devices, so cross-device behaviour is covered, and
1 GiB of memory per device, so out-of-memory tests are fast and
deterministic. A caller may override either variable.

Under the race detector (PHANTOM_RACE_DETECTOR set, as
scripts/test_race_detector_suite.sh does) every test runs with it on, in
the mode the setting names; a test that cannot is skipped with its reason,
never silently: whole files in RACE_SUITE_EXCLUDED_FILES below, single
tests by ``@pytest.mark.no_race_detector(reason)``.
PHANTOM_RACE_SUITE_SAMPLE=N keeps the first test of each file and every
Nth after it, in collection order (the suite script's quick default).
"""

import os

os.environ.setdefault("PHANTOM_DEVICE_COUNT", "2")
os.environ.setdefault("PHANTOM_DEVICE_MEMORY", "1GiB")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch_phantom  # noqa: E402,F401
from torch_phantom.testing import faults  # noqa: E402

DEVICE_COUNT = int(os.environ["PHANTOM_DEVICE_COUNT"])

RACE_DETECTOR_ON = os.environ.get("PHANTOM_RACE_DETECTOR", "0").strip() not in ("", "0")

# Files that cannot run under the race detector, and why.
RACE_SUITE_EXCLUDED_FILES = {
    "test_race_detector.py":
        "plants races on purpose and switches the detector on and off by "
        "setting and by call in its own processes",
    "test_race_detector_copies.py":
        "plants host accesses to non_blocking copies' destinations on purpose "
        "and switches the detector on and off in its own processes",
}


def _configure_race_suite(config):
    config.addinivalue_line(
        "markers",
        "no_race_detector(reason): skipped when the suite runs under the race "
        "detector (PHANTOM_RACE_DETECTOR), for the reason given")


def _race_suite_exclusion(item):
    marker = item.get_closest_marker("no_race_detector")
    if marker is not None:
        return marker.kwargs.get("reason") or (marker.args[0] if marker.args else
                                               "marked no_race_detector")
    return RACE_SUITE_EXCLUDED_FILES.get(item.path.name)


def _select_for_race_suite(config, items):
    if not RACE_DETECTOR_ON:
        return
    sample = int(os.environ.get("PHANTOM_RACE_SUITE_SAMPLE", "1") or 1)
    kept, dropped, position = [], [], {}
    for item in items:
        reason = _race_suite_exclusion(item)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"not under the race detector: {reason}"))
            kept.append(item)  # reported as a skip, with its reason
            continue
        index = position.get(item.path, 0)
        position[item.path] = index + 1
        (kept if index % sample == 0 else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def run_python(code, extra_env=None, timeout=60):
    """Runs ``code`` in a fresh interpreter with this process's environment
    (PYTHONPATH included, so dev builds and installed packages both work)
    plus ``extra_env``; returns the CompletedProcess (text mode)."""
    env = dict(os.environ)
    if extra_env:
        env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def slow_kernel_on(stream, microseconds=30000):
    """Queues on `stream` one kernel that takes `microseconds` (the fault
    injector's latency), so that work queued after it is still pending."""
    with torch.phantom.stream(stream):
        # Made on `stream` itself: filled on another stream, it would race
        # with the kernel that reads it (the race detector says so).
        warm = torch.ones(8, device="phantom")
        faults.set_latency_us(microseconds)
        try:
            warm * 2
        finally:
            faults.set_latency_us(0)


@pytest.fixture(autouse=True)
def _restore_current_device():
    """Every test starts on phantom:0 and leaves the device synchronized, so
    one test's set_device or queued work (or, under the race detector, a
    race it has not reported yet) cannot leak into the next."""
    torch.phantom.set_device(0)
    yield
    torch.phantom.set_device(0)
    for index in range(torch.phantom.device_count()):
        torch.phantom.synchronize(index)
    if RACE_DETECTOR_ON:
        # A host access caught outside any op is reported at the next op:
        # report it here, in the test that made it, not in the next one
        # (the synchronize above has forgotten the uses of freed memory).
        torch.phantom.race_detector._report_pending()


@pytest.fixture
def two_devices():
    if torch.phantom.device_count() < 2:
        pytest.skip("needs PHANTOM_DEVICE_COUNT >= 2")


def assert_passes_in_subprocess(code, extra_env=None):
    """Runs test ``code`` (after ``import torch, torch_phantom``) in a fresh
    interpreter and fails unless it exits cleanly. For checks whose failure
    mode may be a crash (a segfault or stack overflow in the backend), so
    that one bug cannot take the rest of the suite down with it."""
    result = run_python("import torch, torch_phantom\n" + code, extra_env)
    assert result.returncode == 0, (
        f"subprocess exited with {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr[-4000:]}"
    )
    return result


_FORKED_HARNESS = """
import json, os, sys, tempfile, traceback
import torch, torch_phantom
cases = json.loads(sys.argv[1])
prelude = sys.argv[2]
results = {}
for name, code in cases.items():
    log = tempfile.TemporaryFile(mode="w+")
    pid = os.fork()
    if pid == 0:  # child: the device is first initialised here
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            exec(compile(prelude + "\\n" + code, name, "exec"), {"torch": torch})
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(1)
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    log.seek(0)
    results[name] = [os.waitstatus_to_exitcode(status), log.read()[-3000:]]
print("RESULTS" + json.dumps(results))
"""


def run_cases_forked(cases, prelude=""):
    """Runs each snippet of ``cases`` ({name: code}) in its own process and
    returns {name: (exit code, output)}; a negative exit code is the signal
    that killed it. One interpreter imports torch once and forks a child per
    case before the device is initialised, so a case that crashes the
    process (a backend bug) fails alone, at a fraction of the cost of a
    fresh interpreter per case."""
    result = subprocess.run(
        [sys.executable, "-c", _FORKED_HARNESS, json.dumps(cases), textwrap.dedent(prelude)],
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    marker = [line for line in result.stdout.splitlines() if line.startswith("RESULTS")]
    assert result.returncode == 0 and marker, result.stderr[-4000:]
    return {name: tuple(v) for name, v in json.loads(marker[-1][len("RESULTS"):]).items()}


def assert_case_passed(results, name):
    code, output = results[name]
    assert code == 0, f"case {name!r} exited with {code}:\n{output}"


# --------------------------------------------------------------------------
# Drivers without a kernel view (scripts/test_no_kernel_view.sh)
# --------------------------------------------------------------------------
#
# A test marked ``@pytest.mark.requires_kernel_view("why")`` (or a module
# with that ``pytestmark``) checks what only the kernel view gives: native
# kernels, generic ops queued without a wait, compiled kernels, kernels
# failing on the stream. Without a kernel view (PHANTOM_FAKE_NO_KERNEL_VIEW=1,
# the remote driver) it is skipped with its reason; every other test runs
# through the copying CPU fallback. NO_KERNEL_VIEW_SAMPLE=N keeps the first
# N runnable tests of each file (in file order) and deselects the rest: the
# representative sample the script runs by default.


def _skip_marked(items, marker_name, why):
    """Skips every test marked ``marker_name(reason)``, saying ``why: reason``."""
    for item in items:
        marker = item.get_closest_marker(marker_name)
        if marker is not None:
            reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"{why}: {reason}"))


def _configure_no_kernel_view(config):
    config.addinivalue_line(
        "markers",
        "requires_kernel_view(reason): needs the driver's kernel view; skipped "
        "without one (docs/operators.md, 'Without a kernel view')")


def _select_without_kernel_view(config, items):
    if torch_phantom._C._has_kernel_view():
        return
    _skip_marked(items, "requires_kernel_view", "needs the driver's kernel view")
    sample = os.environ.get("NO_KERNEL_VIEW_SAMPLE")
    if not sample:
        return
    per_file, kept, deselected = {}, [], []
    for item in items:
        runnable = not any(m.name in ("skip", "skipif", "requires_kernel_view")
                           and (m.name != "skipif" or (m.args and m.args[0]))
                           for m in item.iter_markers())
        path = str(item.path)
        if runnable and per_file.get(path, 0) < int(sample):
            per_file[path] = per_file.get(path, 0) + 1
            kept.append(item)
        elif runnable:
            deselected.append(item)
        else:
            kept.append(item)  # reported as skipped, with its reason
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept


# --------------------------------------------------------------------------
# Drivers other than the fake (scripts/test_no_kernel_view.sh DRIVER=remote)
# --------------------------------------------------------------------------
#
# A test marked ``@pytest.mark.requires_fake_driver("why")`` uses what only
# the fake driver offers: its test-only settings (PHANTOM_FAKE_*), or an
# OPTIONAL HAL section the remote driver lacks (telemetry, interprocess
# sharing, the activity trace; graph capture needs the kernel view anyway,
# so its tests are requires_kernel_view). Under another
# driver (PHANTOM_DRIVER naming a library other than libphantom_fake.so) it
# is skipped with its reason. The driver is read from the setting, not from
# the runtime, so collecting the suite does not start a remote server.

FAKE_DRIVER_LIBRARY = "libphantom_fake.so"
DRIVER_LIBRARY = os.path.basename(os.environ.get("PHANTOM_DRIVER", "").strip()
                                  or FAKE_DRIVER_LIBRARY)
ON_FAKE_DRIVER = DRIVER_LIBRARY == FAKE_DRIVER_LIBRARY


def _configure_other_drivers(config):
    config.addinivalue_line(
        "markers",
        "requires_fake_driver(reason): uses a setting or an OPTIONAL HAL section "
        "only the fake driver offers; skipped under another driver (PHANTOM_DRIVER)")


def _skip_without_the_fake(items):
    if ON_FAKE_DRIVER:
        return
    _skip_marked(items, "requires_fake_driver",
                 f"needs the fake driver, not {DRIVER_LIBRARY}")


# --------------------------------------------------------------------------
# pytest's hooks: one definition each (a second would replace the first)
# --------------------------------------------------------------------------


def pytest_configure(config):
    _configure_race_suite(config)
    _configure_no_kernel_view(config)
    _configure_other_drivers(config)


def pytest_collection_modifyitems(config, items):
    _select_for_race_suite(config, items)
    _skip_without_the_fake(items)  # before the sample, which counts runnable tests
    _select_without_kernel_view(config, items)
