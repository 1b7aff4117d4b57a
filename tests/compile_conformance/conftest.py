"""Setup of the compile conformance suite (docs/compile.md).

Compiles in this process (one compile worker: the suite's graphs are
small and a pool of workers would only compete for the machine's cores),
writes report.json after a complete run and prints the share of the ops
the CPU compiles correctly that phantom compiles correctly too.
"""

import faulthandler
import json
import os
import sys

os.environ.setdefault("PHANTOM_DEVICE_COUNT", "2")
os.environ.setdefault("PHANTOM_DEVICE_MEMORY", "4GiB")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch_phantom  # noqa: E402,F401

from _compile_conformance import RECORDER, REPORT_PATH  # noqa: E402

# A hung test dumps every thread's stack and ends the run (seconds).
TEST_TIMEOUT = float(os.environ.get("PHANTOM_CONFORMANCE_TIMEOUT", "600"))


@pytest.fixture(autouse=True)
def _guard():
    if TEST_TIMEOUT > 0:
        faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True)
    torch.phantom.set_device(0)
    yield
    if TEST_TIMEOUT > 0:
        faulthandler.cancel_dump_traceback_later()
    try:
        torch.phantom.synchronize()
    except Exception:  # noqa: BLE001 - the test has reported it
        pass


def pytest_sessionfinish(session, exitstatus):
    module = sys.modules.get("test_compile_ops")
    if module is None or not RECORDER.tests:
        return
    complete = all(op.full_name in RECORDER.tests for op in module.OPS)
    report = RECORDER.report(full=module.FULL)
    report["complete"] = complete
    session.config._phantom_compile_report = report
    if complete or "PHANTOM_COMPILE_CONFORMANCE_REPORT" in os.environ:
        with open(REPORT_PATH, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = getattr(config, "_phantom_compile_report", None)
    if report is None:
        return
    s = report["summary"]
    tr = terminalreporter
    tr.section("phantom compile conformance")
    tr.write_line(f"ops run: {s['ops']} ({'all' if report['full'] else 'the default sample'}); "
                  f"statuses: {s['counts']}")
    if s["phantom_pct"] is not None:
        tr.write_line(
            f"of the {s['cpu_compiles_and_matches']} ops the CPU compiles and gets right, "
            f"phantom compiles and gets right {s['phantom_compiles_and_matches']} "
            f"({s['phantom_pct']}%; target {s['target_pct']}%)")
