"""Setup of the conformance suite (docs/conformance.md).

Order matters: the phantom backend must be loaded before anything imports
``torch.testing._internal.common_device_type``, which decides once, at
import, whether ``PrivateUse1TestBase`` exists. With the package installed
``import torch`` loads it (autoload); with TORCH_DEVICE_BACKEND_AUTOLOAD=0
``torch_phantom.testing.enable_device_type_tests()`` below does, and also
repairs the order if a plugin imported the framework first.

This file also enforces expected_failures.json for what the test bodies do
not see (a test the framework skipped or that failed outside its body),
writes report.json and prints the closing ``N passed, N failed, N skipped``
(known, listed failures on a line of their own before it).
"""

import faulthandler
import json
import os
import sys

os.environ.setdefault("PHANTOM_DEVICE_COUNT", "2")
os.environ.setdefault("PHANTOM_DEVICE_MEMORY", "4GiB")
# Our failure messages name the failing samples themselves.
os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch_phantom.testing  # noqa: E402

# TORCH_WARN_ONCE warns at every call: the checks compare each call's
# warnings with the CPU's, which must not depend on which ran first.
torch.set_warn_always(True)

if not torch_phantom.testing.enable_device_type_tests():
    raise RuntimeError(
        "the phantom device is not available, so PyTorch's device-generic "
        "tests cannot target it: "
        + (torch_phantom._C._driver_error() or "no device (PHANTOM_DEVICE_COUNT=0?)")
    )

from _conformance import EXPECTED, RECORDER, REPORT_PATH  # noqa: E402

import unittest  # noqa: E402

from torch.testing._internal import common_utils  # noqa: E402


def _extract_test_fn():
    """common_utils.extract_test_fn without inspect.stack(): the original
    reads the source of every frame on the stack (and scans sys.modules for
    each) to find the running test, three times per OpInfo test, which cost
    ~70% of this suite's time. Same result, walking the frames only."""
    frame = sys._getframe(1)
    while frame is not None:
        self_val = frame.f_locals.get("self")
        if isinstance(self_val, unittest.TestCase):
            try:
                test_id = self_val.id()
                *_, cls_name, test_name = test_id.rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            except Exception:  # noqa: BLE001 - as the original: give up quietly
                return None
        frame = frame.f_back
    return None


common_utils.extract_test_fn = _extract_test_fn

# A hung test dumps every thread's stack and ends the run instead of
# stalling CI (seconds; 0 disables).
TEST_TIMEOUT = float(os.environ.get("PHANTOM_CONFORMANCE_TIMEOUT", "300"))


# The test files whose tests are keyed (check, op/module/optimizer, dtype);
# each has a TEST_KEYS {instantiated test name: key}.
KEYED_MODULES = ("test_ops", "test_modules", "test_optimizers", "test_sparse_ops")


def _key(item):
    keys = getattr(getattr(item, "module", None), "TEST_KEYS", {})
    if item.name in keys:
        return keys[item.name]
    return ("framework", f"{item.path.stem}::{item.name}", "-")


@pytest.fixture(autouse=True)
def _phantom_test_guard():
    """Every test starts on phantom:0, ends synchronized, and is stopped
    (with a traceback of every thread) if it hangs."""
    if TEST_TIMEOUT > 0:
        faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True)
    torch.phantom.set_device(0)
    yield
    if TEST_TIMEOUT > 0:
        faulthandler.cancel_dump_traceback_later()
    torch.phantom.set_device(0)
    for index in range(torch.phantom.device_count()):
        try:
            torch.phantom.synchronize(index)
        except Exception:  # noqa: BLE001 - reported by the test itself
            pass


def pytest_collection_modifyitems(config, items):
    """Tests listed as ``skip`` that no test body consults (framework
    tests) are skipped here."""
    for item in items:
        check, op, dtype = _key(item)
        if check != "framework":
            continue
        entry = EXPECTED.lookup(check, op, dtype)
        if entry is not None and entry["kind"] == "skip":
            item.add_marker(pytest.mark.skip(reason=entry["reason"]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    key = _key(item)
    if key in RECORDER.tests and RECORDER.tests[key]["nodeid"]:
        # The test body recorded its own outcome and enforced the list.
        # A failure outside the body (teardown) still counts.
        if rep.failed and rep.when != "call":
            RECORDER.record(key, "failed", reason=f"{rep.when} failed", nodeid=item.nodeid)
        return
    if rep.when == "call" or rep.failed or rep.skipped:
        entry = EXPECTED.lookup(*key)
        if rep.skipped:
            if hasattr(rep, "wasxfail"):
                return
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            if entry is not None and entry["kind"] == "skip":
                RECORDER.record(key, "skipped", reason=entry["reason"])
            else:
                RECORDER.record(key, "unlisted-skip", reason=reason)
                rep.outcome = "failed"
                rep.longrepr = (
                    f"{'/'.join(key)} was skipped ({reason}) but is not listed in "
                    "expected_failures.json: list it with its reason"
                )
        elif rep.failed:
            text = str(rep.longrepr).strip().splitlines()
            error = text[-1][:400] if text else ""
            if entry is not None and entry["kind"] == "xfail":
                RECORDER.record(key, "xfailed", reason=entry["reason"], error=error)
                rep.outcome = "skipped"
                rep.wasxfail = entry["reason"]
            else:
                RECORDER.record(key, "failed", reason=error, error=error)
        elif rep.when == "call":
            if entry is not None and entry["kind"] == "xfail" and not entry.get("strict", True):
                RECORDER.record(key, "passed", reason=entry["reason"])  # the machine decides
            elif entry is not None and entry["kind"] == "xfail":
                RECORDER.record(key, "xpassed", reason=entry["reason"])
                rep.outcome = "failed"
                rep.longrepr = (
                    f"{'/'.join(key)} is listed in expected_failures.json as failing "
                    f"({entry['reason']!r}) but passed: remove the entry"
                )
            else:
                RECORDER.record(key, "passed")


def _complete():
    """Every keyed test of every keyed file ran (a full run)."""
    for name in KEYED_MODULES:
        keys = getattr(sys.modules.get(name), "TEST_KEYS", None)
        if not keys or not all(k in RECORDER.tests for k in keys.values()):
            return False
    return True


def pytest_sessionfinish(session, exitstatus):
    if not RECORDER.tests:
        return
    report = RECORDER.report()
    report["complete"] = _complete()
    session.config._phantom_report = report
    if report["complete"] or "PHANTOM_CONFORMANCE_REPORT" in os.environ:
        with open(REPORT_PATH, "w") as f:
            json.dump(report, f, indent=1, sort_keys=False)
            f.write("\n")
        session.config._phantom_report_path = REPORT_PATH


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = getattr(config, "_phantom_report", None)
    if report is None:
        return
    s = report["summary"]
    tr = terminalreporter
    tr.section("phantom conformance")
    tr.write_line(
        f"tests: {s['tests']} ({s['ops']} ops); expected failures {s['expected_failures']}, "
        f"unexpected failures {s['unexpected_failures']}, unexpected passes "
        f"{s['unexpected_passes']}, unlisted skips {s['unlisted_skips']}"
    )
    if s["samples"]:
        tr.write_line(
            f"samples matching the CPU: {s['samples_matched']} of {s['samples']} "
            f"({s['samples_matched_pct']}%)"
        )
    path = getattr(config, "_phantom_report_path", None)
    tr.write_line(
        f"report: {path}" if path else
        "report: not written (partial run; set PHANTOM_CONFORMANCE_REPORT=<path> to write one)"
    )


def pytest_unconfigure(config):
    """The closing line, after pytest's own summary."""
    report = getattr(config, "_phantom_report", None)
    if report is None:
        return
    s = report["summary"]
    # Known failures (listed with their reasons) are reported on their own
    # line; "failed" in the closing line counts what fails this run: a
    # failure not listed, or a listed one that now passes (as pytest counts
    # xfail apart from failed).
    failed = s["unexpected_failures"] + s["unexpected_passes"] + s["unlisted_skips"]
    matched = s.get("samples_matched_pct")
    sys.stdout.write(
        f"conformance: {s['expected_failures']} known failures listed in "
        f"expected_failures.json"
        + (f"; {matched}% of samples match the CPU" if matched is not None else "")
        + "\n")
    sys.stdout.write(f"{s['passed']} passed, {failed} failed, {s['skipped']} skipped\n")
    sys.stdout.flush()
