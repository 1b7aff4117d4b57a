"""torch.phantom.memory's memory history, as torch.cuda.memory's:
_record_memory_history, _snapshot, _dump_snapshot and
_attach_out_of_memory_observer, and PyTorch's memory_viz reading the
snapshots (device/runtime/AllocatorHistory.cpp, python/csrc/MemoryHistory.cpp).
"""

import json
import pickle

import pytest
import torch
from torch.cuda import _memory_viz

from conftest import run_python, slow_kernel_on

memory = torch.phantom.memory


@pytest.fixture(autouse=True)
def _history_off():
    yield
    memory._record_memory_history(None)


def _entries(snapshot, addr, device=0):
    return [e for e in snapshot["device_traces"][device] if e.get("addr") == addr]


def _block_at(snapshot, addr):
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["address"] == addr:
                return segment, block
    raise AssertionError(f"no block at {addr:#x}")


def _names(frames):
    return [f["name"] for f in frames]


def _allocate_in_a_named_function(n):
    return torch.empty(n, device="phantom")


def test_snapshot_blocks_match_live_tensors():
    memory._record_memory_history()
    small = _allocate_in_a_named_function(1000)  # 4000 bytes
    large = torch.empty(3 << 20, device="phantom")  # 12 MiB
    snapshot = memory._snapshot()

    segment, block = _block_at(snapshot, small.data_ptr())
    assert block["state"] == "active_allocated"
    assert block["size"] == 4096 and block["requested_size"] == 4000
    assert segment["segment_type"] == "small"
    # The block remembers the Python code that allocated it.
    assert "_allocate_in_a_named_function" in _names(block["frames"])
    assert any(f["filename"].endswith("test_memory_history.py") for f in block["frames"])

    segment, block = _block_at(snapshot, large.data_ptr())
    assert block["state"] == "active_allocated"
    assert block["size"] == 12 << 20
    assert segment["segment_type"] == "large"

    for segment in snapshot["segments"]:
        # The blocks tile their segment, in address order.
        address = segment["address"]
        for b in segment["blocks"]:
            assert b["address"] == address
            address += b["size"]
        assert address == segment["address"] + segment["total_size"]
        allocated = sum(b["size"] for b in segment["blocks"]
                        if b["state"] == "active_allocated")
        assert allocated == segment["allocated_size"]


def test_history_records_alloc_then_free_after_del():
    memory._record_memory_history(context="all")
    x = _allocate_in_a_named_function(1000)
    addr = x.data_ptr()
    del x
    entries = _entries(memory._snapshot(), addr)
    assert [e["action"] for e in entries][-3:] == [
        "alloc", "free_requested", "free_completed"]
    alloc, requested, completed = entries[-3:]
    assert alloc["size"] == requested["size"] == completed["size"] == 4096
    assert alloc["stream"] == 0
    assert alloc["time_us"] <= requested["time_us"] <= completed["time_us"]
    assert "_allocate_in_a_named_function" in _names(alloc["frames"])
    # context="all": the free has the stack that freed it.
    assert "test_history_records_alloc_then_free_after_del" in _names(requested["frames"])


@pytest.mark.requires_kernel_view(
    "keeps a side stream busy with a slow kernel (slow_kernel_on); without a "
    "kernel view the op runs on the host at once and queues nothing")
def test_free_completes_only_after_the_stream_that_used_it_finishes():
    side = torch.phantom.Stream()
    memory._record_memory_history()
    x = torch.ones(1000, device="phantom")
    addr = x.data_ptr()
    slow_kernel_on(side, microseconds=300000)
    x.record_stream(side)
    del x
    torch.empty(1, device="phantom")  # the allocator looks at pending frees
    pending = memory._snapshot()
    assert [e["action"] for e in _entries(pending, addr)][-2:] == [
        "alloc", "free_requested"]
    block = _block_at(pending, addr)[1]
    assert block["state"] == "active_pending_free"
    assert "test_free_completes_only_after_the_stream_that_used_it_finishes" in _names(
        block["frames"])

    side.synchronize()
    torch.empty(1, device="phantom")
    done = memory._snapshot()
    assert [e["action"] for e in _entries(done, addr)][-3:] == [
        "alloc", "free_requested", "free_completed"]


def test_segments_from_and_back_to_the_driver_are_recorded():
    memory.empty_cache()
    memory._record_memory_history()
    x = torch.empty(40 << 20, dtype=torch.uint8, device="phantom")
    addr = x.data_ptr()
    del x
    memory.empty_cache()
    actions = [(e["action"], e["size"]) for e in _entries(memory._snapshot(), addr)]
    assert actions == [
        ("segment_alloc", 40 << 20), ("alloc", 40 << 20),
        ("free_requested", 40 << 20), ("free_completed", 40 << 20),
        ("segment_free", 40 << 20)]


def test_recording_off_records_nothing():
    memory._record_memory_history()
    torch.empty(10, device="phantom")
    memory._record_memory_history(None)  # stops and drops the history
    x = _allocate_in_a_named_function(1000)
    del x
    y = torch.empty(1000, device="phantom")
    snapshot = memory._snapshot()
    assert snapshot["device_traces"] == [[] for _ in range(torch.phantom.device_count())]
    assert _block_at(snapshot, y.data_ptr())[1]["frames"] == []


def test_state_keeps_stacks_of_live_blocks_without_a_history():
    memory._record_memory_history(enabled="state")
    x = _allocate_in_a_named_function(1000)
    snapshot = memory._snapshot()
    assert all(trace == [] for trace in snapshot["device_traces"])
    assert "_allocate_in_a_named_function" in _names(
        _block_at(snapshot, x.data_ptr())[1]["frames"])


def test_python_stacks_leave_out_cpp_frames():
    memory._record_memory_history(stacks="python")
    x = _allocate_in_a_named_function(1000)
    frames = _block_at(memory._snapshot(), x.data_ptr())[1]["frames"]
    assert "_allocate_in_a_named_function" in _names(frames)
    assert not any("phantom::" in name or "torch::" in name for name in _names(frames))


def test_max_entries_keeps_the_latest():
    memory._record_memory_history(max_entries=3)
    tensors = [torch.empty(1000, device="phantom") for _ in range(5)]
    trace = memory._snapshot()["device_traces"][0]
    assert [e["addr"] for e in trace] == [t.data_ptr() for t in tensors[2:]]


def test_skip_actions_leaves_them_out():
    memory._record_memory_history(skip_actions=["free_requested"])
    x = torch.empty(1000, device="phantom")
    addr = x.data_ptr()
    del x
    actions = [e["action"] for e in _entries(memory._snapshot(), addr)]
    assert actions[-2:] == ["alloc", "free_completed"]


def test_memory_viz_renders_a_dumped_snapshot(tmp_path):
    memory._record_memory_history()
    x = torch.empty(1000, device="phantom")
    y = torch.empty(3 << 20, device="phantom")
    del x
    path = tmp_path / "snapshot.pickle"
    memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert _block_at(snapshot, y.data_ptr())[1]["state"] == "active_allocated"

    text = _memory_viz.trace(snapshot)
    assert "Device 0" in text and "del " in text and "free completed" in text
    summary = _memory_viz.segsum(snapshot)
    assert f"segments: {len(snapshot['segments'])}" in summary
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        assert html.startswith("\n<!DOCTYPE html>") and "snapshot.pickle" in html
    # trace_plot's filter (alloc/free pairs) accepts phantom's entries.
    _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snapshot)))


def test_memory_snapshot_lists_segments_with_frames():
    memory._record_memory_history()
    x = _allocate_in_a_named_function(1000)
    segments = torch.phantom.memory_snapshot()
    blocks = [b for s in segments for b in s["blocks"] if b["address"] == x.data_ptr()]
    assert len(blocks) == 1
    assert "_allocate_in_a_named_function" in _names(blocks[0]["frames"])


OOM_PROGRAM = r"""
import json
import torch
calls = []
torch.phantom.memory._attach_out_of_memory_observer(lambda *args: calls.append(args))
def failing(*args):
    raise RuntimeError("an observer that fails")
torch.phantom.memory._attach_out_of_memory_observer(failing)
torch.phantom.memory._record_memory_history()
requested = 2 << 30  # the device has 1 GiB
try:
    torch.empty(requested, dtype=torch.uint8, device="phantom")
except torch.OutOfMemoryError:
    pass
else:
    raise SystemExit("no OutOfMemoryError")
free, total = torch.phantom.mem_get_info(0)
ooms = [e for e in torch.phantom.memory._snapshot()["device_traces"][0]
        if e["action"] == "oom"]
print(json.dumps({"calls": calls, "free": free, "total": total,
                  "ooms": [[e["size"], e["device_free"]] for e in ooms],
                  "requested": requested}))
"""


def test_out_of_memory_observer_gets_the_devices_numbers():
    result = run_python(OOM_PROGRAM, extra_env={"PHANTOM_DEVICE_MEMORY": "1GiB"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    requested, free, total = report["requested"], report["free"], report["total"]
    assert report["calls"] == [[0, requested, total, free]]
    assert report["ooms"] == [[requested, free]]
    # The failing observer is reported, not raised instead of the OOM.
    assert "an observer that fails" in result.stderr


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(enabled=True), TypeError, "legacy"),
    (dict(enabled="yes"), ValueError, "enabled='yes'"),
    (dict(context="stack"), ValueError, "context='stack'"),
    (dict(stacks="cpp"), ValueError, "stacks='cpp'"),
    (dict(max_entries=0), ValueError, "at least 1"),
    (dict(skip_actions=["allocs"]), ValueError, "'allocs' is not an action"),
    (dict(compile_context=True), NotImplementedError, "compile_context"),
    (dict(device="phantom:9"), Exception, "9"),
])
def test_bad_arguments_are_refused_at_the_call(kwargs, error, words):
    with pytest.raises(error, match=words):
        memory._record_memory_history(**kwargs)
    # Nothing was switched on.
    torch.empty(10, device="phantom")
    assert all(t == [] for t in memory._snapshot()["device_traces"])


def test_a_non_callable_observer_is_refused():
    with pytest.raises(TypeError, match="observer must be callable"):
        memory._attach_out_of_memory_observer(42)


def test_alloc_conf_records_from_start_up():
    program = r"""
import json
import torch
x = torch.empty(1000, device="phantom")
snapshot = torch.phantom.memory._snapshot()
entries = [e for e in snapshot["device_traces"][0] if e["addr"] == x.data_ptr()]
print(json.dumps({"actions": [e["action"] for e in entries],
                  "frames": [f["filename"] for e in entries for f in e["frames"]],
                  "settings": snapshot["allocator_settings"]}))
"""
    result = run_python(program, extra_env={"PHANTOM_ALLOC_CONF": "record_memory_history:100"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The first allocation of the process is there, with its segment.
    assert report["actions"] == ["segment_alloc", "alloc"]
    assert report["settings"]["record_memory_history"] == 100
    # Python frames, as stacks="python": the program's own line is there.
    assert "<string>" in report["frames"]
    assert not any(name.endswith((".cpp", ".c", ".h")) for name in report["frames"])


def test_alloc_conf_refuses_a_malformed_history_size():
    result = run_python("import torch_phantom",
                        extra_env={"PHANTOM_ALLOC_CONF": "record_memory_history:0"})
    assert result.returncode != 0
    assert "record_memory_history" in result.stderr
