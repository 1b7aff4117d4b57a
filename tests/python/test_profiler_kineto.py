"""torch.profiler with ProfilerActivity.PrivateUse1: phantom's activity
profiler (device/runtime/KinetoProfiler.cpp over the HAL's activity trace)
puts every kernel and copy on a row per device and stream, with real
times on the CPU events' clock, linked to the op that queued it; and
profile_memory records phantom allocations. Each case runs in a fresh
process (conftest.run_python), as a profiler session is process-wide.
"""
import json

import pytest

from conftest import run_python

TRACE_PROGRAM = r"""
import json, os, sys, tempfile
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

x = torch.randn(256, 256, device="phantom")
side = torch.phantom.Stream()
torch.phantom.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    with record_function("my_step"):
        y = torch.mm(x, x)
        z = torch.relu(y)
        host = torch.ones(1 << 16)
        dev = host.to("phantom")
        dev.zero_()
        with torch.phantom.stream(side):
            w = torch.sigmoid(x)
        back = z.cpu()
path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
with open(path) as f:
    trace = json.load(f)
averages = {e.key: (e.device_time_total, e.self_device_time_total)
            for e in prof.key_averages()}
print(json.dumps({
    "events": [e for e in trace["traceEvents"] if e.get("ph") == "X"],
    "averages": averages,
    "streams": [torch.phantom.current_stream().stream_id, side.stream_id],
}))
"""


def _run(program):
    result = run_python(program, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _trace():
    return _run(TRACE_PROGRAM)


@pytest.mark.requires_kernel_view("expects kernels on the device rows")
def test_kernels_and_copies_appear_on_device_rows_linked_to_their_ops():
    data = _trace()
    events = data["events"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    names = {e["name"] for e in kernels}
    assert any("mm" in n for n in names), names
    assert any("relu" in n for n in names), names
    assert any("sigmoid" in n for n in names), names
    cpu_ops = {e["args"].get("External id"): e for e in events
               if e.get("cat") == "cpu_op"}
    for kernel in kernels:
        # Device rows: pid is the device, tid the stream (not the host's).
        assert kernel["pid"] == 0 and kernel["args"]["device"] == 0
        assert kernel["tid"] == kernel["args"]["stream"]
        # Linked to the CPU op that launched it, and after it started.
        op = cpu_ops.get(kernel["args"].get("External id"))
        assert op is not None, kernel
        assert kernel["ts"] >= op["ts"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert any(c["name"].startswith("Memcpy HtoD") and
               c["args"]["bytes"] == 4 * (1 << 16) for c in copies), copies
    assert any(c["name"].startswith("Memcpy DtoH") and
               c["args"]["bytes"] == 4 * 256 * 256 for c in copies), copies


@pytest.mark.requires_kernel_view("expects kernels on the device rows")
def test_work_on_two_streams_lands_on_two_rows():
    events = _trace()["events"]
    sigmoid = [e for e in events if e.get("cat") == "kernel"
               and "sigmoid" in e["name"]]
    mm = [e for e in events if e.get("cat") == "kernel" and "mm" in e["name"]]
    assert sigmoid and mm
    assert sigmoid[0]["tid"] != mm[0]["tid"]


@pytest.mark.requires_fake_driver(
    "device times come from the driver's activity trace (ph_activity_*), "
    "which the remote driver does not offer")
def test_key_averages_has_device_time_per_op():
    averages = _trace()["averages"]
    assert averages["aten::mm"][0] > 0, averages["aten::mm"]
    assert averages["aten::relu"][0] > 0 or averages["aten::clamp_min"][0] > 0


CPU_ONLY_PROGRAM = r"""
import json, os, tempfile
import torch
from torch.profiler import ProfilerActivity, profile
x = torch.randn(64, 64, device="phantom")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    y = (x @ x).cpu()
path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
with open(path) as f:
    cats = sorted({e.get("cat") for e in json.load(f)["traceEvents"]
                   if e.get("ph") == "X"})
print(json.dumps(cats))
"""


def test_without_the_device_activity_no_device_rows_are_recorded():
    cats = _run(CPU_ONLY_PROGRAM)
    assert "cpu_op" in cats
    assert "kernel" not in cats and "gpu_memcpy" not in cats


MEMORY_PROGRAM = r"""
import json
import torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
             profile_memory=True) as prof:
    t = torch.empty(1 << 20, dtype=torch.uint8, device="phantom")
    del t
usage = {e.key: e.device_memory_usage for e in prof.key_averages()}
print(json.dumps(usage))
"""


@pytest.mark.no_race_detector(
    "under the race detector every op is dispatched twice (to the detector's "
    "dispatch mode, then to its kernel), so the profile holds each op twice and "
    "a PythonDispatchMode event")
def test_profile_memory_records_phantom_allocations():
    usage = _run(MEMORY_PROGRAM)
    assert usage["aten::empty"] == 1 << 20, usage


GRAPH_PROGRAM = r"""
import json, os, tempfile
import torch
from torch.profiler import ProfilerActivity, profile
x = torch.randn(64, 64, device="phantom")
g = torch.phantom.Graph()
with torch.phantom.graph(g):
    y = torch.relu(torch.mm(x, x))
torch.phantom.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    g.replay()
    torch.phantom.synchronize()
path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
with open(path) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
print(json.dumps({
    "replays": [e["args"].get("External id") for e in events
                if e.get("cat") == "cpu_op" and e["name"] == "phantom::graph_replay"],
    "kernels": [[e["name"], e["args"].get("External id"), e["ts"], e["dur"]]
                for e in events if e.get("cat") == "kernel"],
}))
"""


@pytest.mark.requires_kernel_view("graph capture runs the ops' kernels on the device")
def test_a_graph_replay_shows_each_recorded_op_linked_to_the_replay():
    data = _run(GRAPH_PROGRAM)
    (replay,) = data["replays"]
    assert replay is not None
    by_name = {}
    for name, external, start, length in data["kernels"]:
        by_name.setdefault(name, []).append((external, start, length))
    # Each recorded op is its own piece of device work, in capture order,
    # linked to the replay that ran it (not one item for the whole graph).
    (mm,) = by_name["aten::mm"]
    relu = by_name.get("aten::relu") or by_name["aten::clamp_min"]
    assert mm[0] == replay and relu[0][0] == replay
    assert mm[1] + mm[2] <= relu[0][1]


USER_RANGES_PROGRAM = r"""
import json, os, tempfile
import torch
from torch.profiler import ProfilerActivity, profile, record_function

x = torch.randn(128, 128, device="phantom")
side = torch.phantom.Stream()
torch.phantom.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    before = x.sin()
    with record_function("outer"):
        y = torch.mm(x, x)
        with record_function("inner"):
            z = torch.relu(y + 1)
        with torch.phantom.stream(side):
            s = torch.sigmoid(x)
    with torch.phantom.nvtx.range("my_nvtx"):
        w = z.tanh()
    after = x.cos()
    torch.phantom.synchronize()
path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
with open(path) as f:
    trace = json.load(f)
print(json.dumps({"events": [e for e in trace["traceEvents"] if e.get("ph") == "X"]}))
"""


@pytest.mark.requires_fake_driver(
    "device rows come from the driver's activity trace (ph_activity_*), "
    "which the remote driver does not offer")
@pytest.mark.requires_kernel_view("expects kernels on the device rows")
def test_user_ranges_appear_on_the_device_rows_spanning_their_work():
    events = _run(USER_RANGES_PROGRAM)["events"]
    kernels = {}
    for e in events:
        if e.get("cat") == "kernel":
            kernels.setdefault(e["name"].split("::")[-1], e)
    device_ranges = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    by_name = {}
    for r in device_ranges:
        by_name.setdefault(r["name"], []).append(r)
    assert set(by_name) == {"outer", "inner", "my_nvtx"}, by_name

    def covers(r, k):
        return r["ts"] <= k["ts"] + 1e-3 and k["ts"] + k["dur"] <= r["ts"] + r["dur"] + 1e-3

    # One row per stream the range queued work on, on the device's pid.
    outer = {r["tid"]: r for r in by_name["outer"]}
    assert kernels["sigmoid"]["tid"] != kernels["mm"]["tid"]
    assert set(outer) == {kernels["mm"]["tid"], kernels["sigmoid"]["tid"]}
    main_outer = outer[kernels["mm"]["tid"]]
    assert covers(main_outer, kernels["mm"]) and covers(main_outer, kernels["relu"])
    assert covers(outer[kernels["sigmoid"]["tid"]], kernels["sigmoid"])
    assert not covers(main_outer, kernels["sin"]) and not covers(main_outer, kernels["cos"])
    (inner,) = by_name["inner"]
    assert covers(inner, kernels["relu"]) and not covers(inner, kernels["mm"])
    (nv,) = by_name["my_nvtx"]
    assert covers(nv, kernels["tanh"]) and not covers(nv, kernels["relu"])
    for r in device_ranges:
        assert r["pid"] == 0 and r["args"]["device"] == 0
    # Linked to the CPU range of the same name.
    cpu_ranges = {e["args"].get("External id"): e["name"] for e in events
                  if e.get("cat") == "user_annotation"}
    for r in device_ranges:
        assert cpu_ranges.get(r["args"].get("External id")) == r["name"], r
