"""Shared machinery of the conformance suite: the expected-failures file,
the per-test/per-sample recorder behind report.json, and the comparison of
a phantom result with the CPU's.

Every test of the suite is identified by a key ``(check, op, dtype)``:
``check`` is ``forward``, ``noncontiguous``, ``inplace``, ``out``,
``backward`` (or ``framework`` for the tests of test_device_type.py), ``op``
the OpInfo's full name (``div.floor_rounding``), ``dtype`` a short dtype
name (``float32``) or ``-``.
"""

import json
import os
import threading
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED_PATH = os.path.join(HERE, "expected_failures.json")
REPORT_PATH = os.environ.get(
    "PHANTOM_CONFORMANCE_REPORT", os.path.join(HERE, "report.json")
)

CHECKS = ("forward", "noncontiguous", "inplace", "out", "backward")


def dtype_str(dtype):
    return "-" if dtype is None else str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------
# expected_failures.json
# --------------------------------------------------------------------------


class Expectations:
    """The tracked list of every test that is allowed not to pass.

    Each entry: ``{"check", "op", "dtypes" (list, or omitted for every
    dtype), "kind": "xfail" | "skip", "reason"}``. ``check`` may be ``*``.
    ``xfail``: the test runs and must fail (a pass is an error: remove the
    entry), unless the entry has ``"strict": false``: then the outcome
    depends on the machine (the CPU kernels' rounding differs between
    instruction sets) and a pass is recorded as ``passed``. ``skip``: the test is not run (crashes, hangs, or has nothing
    to compare) and is reported as skipped with the reason.
    """

    def __init__(self, path=EXPECTED_PATH):
        self.path = path
        self.entries = []
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
            self.entries = data.get("entries", [])
        self._index = defaultdict(list)
        for entry in self.entries:
            self._index[entry["op"]].append(entry)

    def lookup(self, check, op, dtype):
        for entry in self._index.get(op, ()):
            if entry["check"] not in ("*", check):
                continue
            dtypes = entry.get("dtypes")
            if dtypes is not None and dtype not in dtypes:
                continue
            return entry
        return None


EXPECTED = Expectations()


# --------------------------------------------------------------------------
# Recorder: what report.json and the closing summary are made of
# --------------------------------------------------------------------------


class Recorder:
    """Outcome of every test, with sample counts. ``status`` is one of
    ``passed``, ``xfailed`` (failed, listed), ``failed`` (failed, not
    listed), ``xpassed`` (listed as xfail but passed: an error),
    ``skipped`` (listed skip) and ``unlisted-skip`` (skipped, not listed:
    an error)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tests = {}

    def record(self, key, status, samples=0, matched=0, reason="", nodeid="", error=""):
        check, op, dtype = key
        with self.lock:
            self.tests[key] = {
                "check": check,
                "op": op,
                "dtype": dtype,
                "status": status,
                "samples": samples,
                "matched": matched,
                "reason": reason,
                "error": error,
                "nodeid": nodeid,
            }

    def counts(self):
        c = defaultdict(int)
        for t in self.tests.values():
            c[t["status"]] += 1
        return c

    def sample_totals(self):
        samples = sum(t["samples"] for t in self.tests.values())
        matched = sum(t["matched"] for t in self.tests.values())
        return samples, matched

    def report(self):
        ops = {}
        for t in sorted(self.tests.values(), key=lambda t: (t["op"], t["check"], t["dtype"])):
            entry = ops.setdefault(
                t["op"],
                {"op": t["op"], "dtypes": [], "samples": 0, "matched": 0,
                 "passed": 0, "failed": 0, "skipped": 0, "tests": []},
            )
            if t["dtype"] != "-" and t["dtype"] not in entry["dtypes"]:
                entry["dtypes"].append(t["dtype"])
            entry["samples"] += t["samples"]
            entry["matched"] += t["matched"]
            if t["status"] == "passed":
                entry["passed"] += 1
            elif t["status"] in ("skipped", "unlisted-skip"):
                entry["skipped"] += 1
            else:  # failed, xfailed, xpassed
                entry["failed"] += 1
            entry["tests"].append(
                {k: t[k] for k in ("check", "dtype", "status", "samples", "matched", "reason", "error")}
            )
        counts = self.counts()
        samples, matched = self.sample_totals()
        return {
            "torch": torch.__version__,
            "summary": {
                "tests": len(self.tests),
                "passed": counts["passed"],
                "failed": counts["failed"] + counts["xfailed"] + counts["xpassed"],
                "skipped": counts["skipped"] + counts["unlisted-skip"],
                "expected_failures": counts["xfailed"],
                "unexpected_failures": counts["failed"],
                "unexpected_passes": counts["xpassed"],
                "unlisted_skips": counts["unlisted-skip"],
                "samples": samples,
                "samples_matched": matched,
                "samples_matched_pct": round(100.0 * matched / samples, 3) if samples else None,
                "ops": len(ops),
            },
            "ops": list(ops.values()),
        }


RECORDER = Recorder()


# --------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------


class Mismatch(AssertionError):
    pass


def _is_seq(x):
    return isinstance(x, (list, tuple)) and not isinstance(x, torch.Size)


def compare(actual, expected, device_type, path="output", strict_device=True):
    """Asserts that ``actual`` (computed on phantom) matches ``expected``
    (computed on the CPU): tensors with torch.testing.assert_close and its
    default per-dtype tolerances (NaN equal to NaN), after checking that
    every tensor the phantom op returned lives on phantom; containers
    element-wise; anything else with ==."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}")
        if (
            strict_device
            and expected.device.type == "cpu"
            and actual.device.type != device_type
        ):
            raise Mismatch(
                f"{path}: the CPU returns a CPU tensor, phantom returned a tensor "
                f"on '{actual.device}' (expected a {device_type} tensor)"
            )
        if expected.layout != actual.layout:
            raise Mismatch(f"{path}: layout {actual.layout} != {expected.layout}")
        if expected.layout != torch.strided:
            actual = actual.to_dense()
            expected = expected.to_dense()
        try:
            torch.testing.assert_close(
                actual.detach().cpu(), expected.detach(), equal_nan=True,
                check_device=False, check_stride=False,
            )
        except AssertionError as error:
            raise Mismatch(f"{path}: {error}") from None
        return
    if _is_seq(expected):
        if not _is_seq(actual) or len(actual) != len(expected):
            raise Mismatch(f"{path}: expected a sequence of {len(expected)}, got {actual!r:.200}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, device_type, f"{path}[{i}]", strict_device)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise Mismatch(f"{path}: dict keys differ")
        for k in expected:
            compare(actual[k], expected[k], device_type, f"{path}[{k!r}]", strict_device)
        return
    if isinstance(expected, float) and isinstance(actual, float):
        try:
            torch.testing.assert_close(actual, expected, equal_nan=True)
        except AssertionError as error:
            raise Mismatch(f"{path}: {error}") from None
        return
    if isinstance(expected, torch.device) and isinstance(actual, torch.device):
        if (expected.type == "cpu") != (actual.type == device_type):
            raise Mismatch(f"{path}: device {actual} vs {expected}")
        return
    if actual != expected:
        raise Mismatch(f"{path}: {actual!r:.200} != {expected!r:.200}")


def shape_check(actual, expected, device_type, path="output", strict_device=True):
    """For ops whose values are undefined (``empty``): metadata only."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{path}: expected a tensor")
        if strict_device and actual.device.type != device_type:
            raise Mismatch(f"{path}: on {actual.device}, expected {device_type}")
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise Mismatch(
                f"{path}: {tuple(actual.shape)}/{actual.dtype} != "
                f"{tuple(expected.shape)}/{expected.dtype}"
            )
        return
    if _is_seq(expected):
        if not _is_seq(actual) or len(actual) != len(expected):
            raise Mismatch(f"{path}: sequence length differs")
        for i, (a, e) in enumerate(zip(actual, expected)):
            shape_check(a, e, device_type, f"{path}[{i}]", strict_device)
        return
    compare(actual, expected, device_type, path, strict_device)


# --------------------------------------------------------------------------
# Driver shared by the module and optimizer suites
# --------------------------------------------------------------------------


def sample_limit(check, default):
    """Samples (configurations) per test for ``check``:
    PHANTOM_CONFORMANCE_SAMPLES_<CHECK>, else PHANTOM_CONFORMANCE_SAMPLES,
    else ``default``; 0 means all."""
    value = os.environ.get("PHANTOM_CONFORMANCE_SAMPLES")
    value = os.environ.get(f"PHANTOM_CONFORMANCE_SAMPLES_{check.upper()}", value)
    return default if value is None else int(value)


def describe(error):
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}"[:400]


class SampleStats:
    """Samples compared in one test, and the failures among them."""

    def __init__(self):
        self.samples = 0
        self.matched = 0
        self.failures = []

    def run(self, label, fn):
        """Runs one sample's comparison; ``fn`` returns False when the
        sample does not apply (not counted)."""
        try:
            counted = fn()
        except Exception as error:  # noqa: BLE001 - recorded as a failure
            self.samples += 1
            self.failures.append(f"{label}: {describe(error)}")
            return
        if counted is not False:
            self.samples += 1
            self.matched += 1


def conform(test, key, body):
    """Runs ``body(stats)`` for the test ``key`` and enforces
    expected_failures.json as test_ops.py does: a listed skip is not run, a
    listed xfail must fail, an unlisted failure fails, a test that compared
    nothing fails unless listed as a skip."""
    import unittest

    import pytest

    nodeid = test.id()
    entry = EXPECTED.lookup(*key)
    if entry is not None and entry["kind"] == "skip":
        RECORDER.record(key, "skipped", reason=entry["reason"], nodeid=nodeid)
        raise unittest.SkipTest(f"listed in expected_failures.json: {entry['reason']}")
    stats = SampleStats()
    body(stats)
    try:
        getattr(torch, "phantom").synchronize()
    except Exception as error:  # noqa: BLE001 - a sticky stream error
        stats.failures.append(f"synchronize after the test: {describe(error)}")
    error = stats.failures[0] if stats.failures else ""
    if entry is not None:  # xfail
        if stats.failures:
            RECORDER.record(key, "xfailed", stats.samples, stats.matched,
                            entry["reason"], nodeid, error)
            pytest.xfail(f"listed in expected_failures.json: {entry['reason']}")
        if not entry.get("strict", True):  # the machine decides: a pass is a pass
            RECORDER.record(key, "passed", stats.samples, stats.matched, entry["reason"], nodeid)
            return
        RECORDER.record(key, "xpassed", stats.samples, stats.matched, entry["reason"], nodeid)
        test.fail(f"{'/'.join(key)} is listed in expected_failures.json as failing "
                  f"({entry['reason']!r}) but passed on {stats.samples} samples: remove the entry")
    if stats.failures:
        RECORDER.record(key, "failed", stats.samples, stats.matched, error, nodeid, error)
        shown = "\n  ".join(stats.failures[:3])
        more = len(stats.failures) - 3
        test.fail(f"{'/'.join(key)}: {len(stats.failures)} of {stats.samples} samples "
                  f"differ from the CPU (not listed in expected_failures.json):\n  {shown}"
                  + (f"\n  ... and {more} more" if more > 0 else ""))
    if stats.samples == 0:
        reason = "no applicable sample (nothing compared)"
        RECORDER.record(key, "unlisted-skip", 0, 0, reason, nodeid)
        test.fail(f"{'/'.join(key)}: {reason}; list it as a skip in expected_failures.json")
    RECORDER.record(key, "passed", stats.samples, stats.matched, "", nodeid)
