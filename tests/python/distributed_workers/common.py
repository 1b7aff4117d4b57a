"""What every distributed worker shares: joining the group, naming checks,
reporting.

A worker runs many named checks in one process group; ``Checks.run(name,
fn)`` records "ok" or the exception's type and message (and keeps going),
and ``Checks.report()`` prints them as the ``RESULT <json>`` line the
harness (distributed_harness.py) reads.
"""

import json
import os
import sys
import traceback

os.environ.setdefault("PHANTOM_DEVICE_COUNT", "2")
os.environ.setdefault("PHANTOM_DEVICE_MEMORY", "1GiB")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch_phantom  # noqa: E402,F401

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def device():
    """Each rank's device: phantom:(rank % device_count)."""
    return torch.device("phantom", RANK % torch.phantom.device_count())


class Checks:
    def __init__(self):
        self.results = {}

    def run(self, name, fn):
        try:
            fn()
            self.results[name] = "ok"
        except Exception as e:  # noqa: BLE001 - reported to the test
            self.results[name] = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)

    def report(self, **extra):
        payload = dict(self.results)
        payload.update(extra)
        print("RESULT " + json.dumps(payload), flush=True)


def report(**values):
    print("RESULT " + json.dumps(values), flush=True)


def assert_equal(actual, expected, what=""):
    actual = actual.cpu() if isinstance(actual, torch.Tensor) else actual
    if isinstance(expected, torch.Tensor):
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            raise AssertionError(
                f"{what}: got {actual.dtype}{tuple(actual.shape)}, "
                f"expected {expected.dtype}{tuple(expected.shape)}"
            )
        if not torch.equal(actual, expected):
            raise AssertionError(f"{what}: got {actual.flatten()[:8]}, expected {expected.flatten()[:8]}")
    elif actual != expected:
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")


def raises(fn, match):
    """Runs fn, which must raise an exception whose message contains
    ``match``; returns the message."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        if match not in str(e):
            raise AssertionError(f"raised {type(e).__name__} without {match!r}: {e}") from e
        return str(e)
    raise AssertionError(f"did not raise (expected {match!r})")
