"""torch.autograd.profiler.profile(use_device="phantom"): the legacy
profiler times every op on the device with a pair of phantom events
(device/runtime/ProfilerStubs.cpp) and says nothing spurious while it runs.
"""

import json

import pytest

from conftest import run_python

PROFILE_PROGRAM = r"""
import json, warnings
import torch
warnings.simplefilter("always")
x = torch.randn(128, 128, device="phantom")
with warnings.catch_warnings(record=True) as caught:
    with torch.autograd.profiler.profile(use_device="phantom") as prof:
        y = x @ x
        z = y.relu()
        torch.phantom.synchronize()
events = prof.key_averages()
table = events.table(sort_by="self_cpu_time_total", row_limit=5)
print(json.dumps({
    "device_time": {e.key: e.device_time_total for e in events},
    "self_device_time": {e.key: e.self_device_time_total for e in events},
    "device_type": {e.key: str(e.device_type) for e in prof.function_events},
    "warnings": [str(w.message) for w in caught],
    "table_names_phantom": "PHANTOM" in table,
}))
"""


def _profile():
    result = run_python(PROFILE_PROGRAM, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_device_time_is_reported_per_op():
    report, _ = _profile()
    # The matmul ran on the device, so the device saw it take time.
    assert report["device_time"]["aten::mm"] > 0
    assert report["self_device_time"]["aten::mm"] > 0
    assert report["device_time"]["aten::relu"] > 0
    # The table has phantom's device-time columns, named after the backend.
    assert report["table_names_phantom"]


def test_profiling_prints_no_spurious_warnings():
    report, stderr = _profile()
    assert report["warnings"] == []
    # Without the stubs torch warns on stderr, once per op.
    assert "not enabled" not in stderr
    assert "INTERNAL ASSERT" not in stderr
    assert "Traceback" not in stderr


@pytest.mark.no_race_detector(
    "under the race detector every op is dispatched twice (to the detector's "
    "dispatch mode, then to its kernel), so the profile holds each op twice")
def test_profiling_a_second_device_and_a_side_stream():
    program = r"""
import json
import torch
x = torch.randn(64, 64, device="phantom:1")
side = torch.phantom.Stream(device="phantom:1")
side.wait_stream(torch.phantom.current_stream(1))  # x is written on the default stream
with torch.autograd.profiler.profile(use_device="phantom") as prof:
    with torch.phantom.device(1), torch.phantom.stream(side):
        y = x @ x
    torch.phantom.synchronize(1)
mm = [e for e in prof.function_events if e.name == "aten::mm"]
print(json.dumps([e.device_time_total for e in mm]))
"""
    result = run_python(program, timeout=120)
    assert result.returncode == 0, result.stderr
    times = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(times) == 1 and times[0] > 0
    assert "not enabled" not in result.stderr
