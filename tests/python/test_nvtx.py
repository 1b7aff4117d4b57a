"""torch.phantom.nvtx: the profiler ranges of torch.cuda.nvtx, kept per
thread, and handed to listeners (where a profiler subscribes)."""

import threading

import pytest
import torch

nvtx = torch.phantom.nvtx


@pytest.fixture
def events():
    received = []
    remove = nvtx._add_listener(received.append)
    yield received
    remove()


def test_push_and_pop_return_depths_and_reach_the_listener(events):
    assert nvtx.range_push("outer") == 0
    assert nvtx.range_push("inner") == 1
    nvtx.mark("here")
    assert nvtx.range_pop() == 1
    assert nvtx.range_pop() == 0
    assert nvtx.range_pop() == -1  # nothing open, as NVTX answers
    assert [(e.kind, e.message, e.ident) for e in events] == [
        ("push", "outer", 0), ("push", "inner", 1), ("mark", "here", -1),
        ("pop", "inner", 1), ("pop", "outer", 0)]
    times = [e.time_ns for e in events]
    assert times == sorted(times)


def test_each_thread_has_its_own_stack(events):
    nvtx.range_push("main")
    depths = []
    thread = threading.Thread(target=lambda: depths.append(
        (nvtx.range_push("worker"), nvtx.range_pop())))
    thread.start()
    thread.join()
    assert depths == [(0, 0)]
    assert nvtx.range_pop() == 0
    assert {e.thread for e in events if e.message == "worker"} == {thread.ident}


def test_range_context_manager_formats_and_closes_on_error(events):
    with pytest.raises(KeyError):
        with nvtx.range("step {} of {total}", 3, total=10):
            raise KeyError("boom")
    assert [(e.kind, e.message) for e in events] == [
        ("push", "step 3 of 10"), ("pop", "step 3 of 10")]

    @nvtx.range("decorated")
    def work():
        return 5

    assert work() == 5
    assert events[-1].message == "decorated"


def test_start_and_end_may_cross_threads(events):
    ident = nvtx.range_start("load")
    thread = threading.Thread(target=nvtx.range_end, args=(ident,))
    thread.start()
    thread.join()
    assert [(e.kind, e.ident) for e in events] == [("start", ident), ("end", ident)]
    with pytest.raises(ValueError, match="no range with this id is open"):
        nvtx.range_end(ident)


def test_messages_must_be_text():
    with pytest.raises(TypeError, match="the message must be a str, got int"):
        nvtx.range_push(3)
    with pytest.raises(TypeError, match="the message must be a str"):
        nvtx.mark(None)


PROFILED_RANGES = r"""
import json, os, tempfile, threading
import torch, torch_phantom
from torch.profiler import ProfilerActivity, profile
nvtx = torch.phantom.nvtx
x = torch.randn(64, 64, device="phantom")
nvtx.range_push("opened_before")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
    nvtx.range_pop()
    nvtx.range_push("outer")
    y = torch.mm(x, x)
    with nvtx.range("inner {}", 1):
        z = torch.relu(y)
    nvtx.range_pop()
    ident = nvtx.range_start("across_threads")
    ender = threading.Thread(target=nvtx.range_end, args=(ident,))
    ender.start()
    ender.join()
    nvtx.mark("here")
    torch.phantom.synchronize()
nvtx.range_push("after_profiling")
nvtx.range_pop()
with torch.autograd.profiler.profile(use_device="phantom") as legacy:
    with nvtx.range("legacy_range"):
        torch.mm(x, x)
path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
with open(path) as f:
    events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
print(json.dumps({
    "annotations": {e["name"]: [e["ts"], e["dur"]] for e in events
                    if e.get("cat") == "user_annotation"},
    "mm": [[e["ts"], e["dur"]] for e in events
           if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"],
    "averages": sorted({e.key for e in prof.key_averages()}),
    "legacy": sorted({e.key for e in legacy.key_averages()}),
}))
"""


@pytest.mark.no_race_detector(
    "under the race detector every op is dispatched twice (to the detector's "
    "dispatch mode, then to its kernel), so the profile holds each op twice and "
    "a PythonDispatchMode event")
def test_ranges_are_ranges_of_a_recording_torch_profiler():
    import json

    from conftest import run_python

    result = run_python(PROFILED_RANGES, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    ranges = data["annotations"]
    # What the profiler recorded, and only that: a range opened before it
    # started, or one after it stopped, is not in its trace.
    assert set(ranges) == {"outer", "inner 1", "across_threads", "here"}
    outer_start, outer_length = ranges["outer"]
    inner_start, inner_length = ranges["inner 1"]
    assert outer_start <= inner_start
    assert inner_start + inner_length <= outer_start + outer_length
    (mm_start, mm_length), = data["mm"]
    assert outer_start <= mm_start and mm_start + mm_length <= inner_start
    assert ranges["across_threads"][1] >= 0
    assert ranges["here"][1] <= ranges["outer"][1]
    assert {"outer", "inner 1", "here"} <= set(data["averages"])
    assert "legacy_range" in data["legacy"]
    assert "after_profiling" not in data["legacy"]
