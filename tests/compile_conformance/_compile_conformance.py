"""Shared machinery of the compile conformance suite: the expected-failures
list, the recorder behind report.json, and the comparison of results
(the eager suite's own, tests/conformance/_conformance.py).

Each test is one OpInfo (float32 forward), keyed by its full name.
Statuses: ``passed``; ``failed`` (the CPU compiles the op and matches
eager, phantom does not, and it is not listed); ``xfailed`` (the same,
listed); ``xpassed`` (listed but passes: an error); ``cpu-fails`` (the
CPU does not compile it correctly: not counted); ``not-applicable`` (no
sample, or the sample raises eagerly); ``skipped`` (listed as skip).
"""

import json
import os
import sys
import threading

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "conformance"))

from _conformance import Mismatch, compare, shape_check  # noqa: E402,F401

EXPECTED_PATH = os.path.join(HERE, "expected_failures.json")
REPORT_PATH = os.environ.get(
    "PHANTOM_COMPILE_CONFORMANCE_REPORT", os.path.join(HERE, "report.json")
)

# The share of the ops the CPU compiles correctly that phantom must also
# compile correctly (issue 25).
TARGET_PCT = 95.0


class Expectations:
    """``expected_failures.json``: ``{"entries": [{"op", "kind": "xfail" |
    "skip", "reason"}]}``. ``xfail``: phantom must fail where the CPU
    passes (a pass is an error: remove the entry); ``skip``: not run."""

    def __init__(self, path=EXPECTED_PATH):
        self.entries = []
        if os.path.exists(path):
            with open(path) as f:
                self.entries = json.load(f).get("entries", [])
        self._by_op = {entry["op"]: entry for entry in self.entries}

    def lookup(self, op):
        return self._by_op.get(op)


EXPECTED = Expectations()


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.tests = {}

    def record(self, op, status, reason="", error=""):
        with self.lock:
            self.tests[op] = {"op": op, "status": status, "reason": reason, "error": error}

    def summary(self):
        counts = {}
        for test in self.tests.values():
            counts[test["status"]] = counts.get(test["status"], 0) + 1
        counted = sum(counts.get(s, 0) for s in ("passed", "failed", "xfailed", "xpassed"))
        matched = counts.get("passed", 0) + counts.get("xpassed", 0)
        return {
            "ops": len(self.tests),
            "counts": counts,
            "cpu_compiles_and_matches": counted,
            "phantom_compiles_and_matches": matched,
            "phantom_pct": round(100.0 * matched / counted, 2) if counted else None,
            "target_pct": TARGET_PCT,
        }

    def report(self, full):
        return {
            "torch": torch.__version__,
            "full": full,
            "summary": self.summary(),
            "ops": [self.tests[op] for op in sorted(self.tests)],
        }


RECORDER = Recorder()
