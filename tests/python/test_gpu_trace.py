"""PyTorch's GPU trace hooks fire for phantom as they do for CUDA.

Tools such as a stream sanitizer register callbacks in
``torch.<device>._gpu_trace`` and call ``torch._C._activate_gpu_trace()``.
Activation lasts for the whole process, so each test runs in a new one.
"""
import json
import os
import subprocess
import sys

TRACE_ALL = """
import json
import torch
import torch.phantom._gpu_trace as gpu_trace

log = []
for kind in ("event_creation", "event_deletion", "event_record", "event_wait",
             "memory_allocation", "memory_deallocation", "stream_creation",
             "device_synchronization", "stream_synchronization",
             "event_synchronization"):
    register = getattr(gpu_trace, "register_callback_for_" + kind)
    register(lambda *args, kind=kind: log.append([kind, *args]))
torch._C._activate_gpu_trace()
"""


def run_traced(body):
    out = subprocess.run([sys.executable, "-c", TRACE_ALL + body],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_events_streams_and_syncs_are_traced_with_their_handles():
    result = run_traced("""
side = torch.phantom.Stream()
event = torch.phantom.Event()
x = torch.ones(4, device="phantom")
event.record()                      # on the current (default) stream
side.wait_event(event)
with torch.phantom.stream(side):
    y = x * 2
event.synchronize()
side.synchronize()
torch.phantom.synchronize()
print(json.dumps({
    "log": log,
    "default": torch.phantom.current_stream().native_handle,
    "side": side.native_handle,
}))
""")
    log, default, side = result["log"], result["default"], result["side"]
    kinds = [entry[0] for entry in log]
    created = [entry[1] for entry in log if entry[0] == "event_creation"]
    assert len(created) == 1
    event = created[0]
    assert ["event_record", event, default] in log
    assert ["event_wait", event, side] in log
    assert ["event_synchronization", event] in log
    assert ["stream_synchronization", side] in log
    assert "device_synchronization" in kinds
    # In program order: created before recorded, recorded before waited on.
    assert (kinds.index("event_creation") < kinds.index("event_record")
            < kinds.index("event_wait") < kinds.index("event_synchronization"))


def test_allocations_and_frees_are_traced_with_the_device_address():
    result = run_traced("""
x = torch.empty(1 << 20, dtype=torch.uint8, device="phantom")
address = x.data_ptr()
del x
print(json.dumps({"log": log, "address": address}))
""")
    log, address = result["log"], result["address"]
    assert ["memory_allocation", address] in log
    assert ["memory_deallocation", address] in log
    assert log.index(["memory_allocation", address]) < log.index(
        ["memory_deallocation", address])


def test_a_deleted_event_and_a_new_stream_are_traced():
    result = run_traced("""
stream = torch.phantom.Stream()
with torch.phantom.stream(stream):
    torch.ones(1, device="phantom")  # first use creates the driver stream
event = torch.phantom.Event()
event.record(stream)
del event
import gc; gc.collect()
print(json.dumps({"log": log, "stream": stream.native_handle}))
""")
    log, stream = result["log"], result["stream"]
    assert ["stream_creation", stream] in log
    created = [entry[1] for entry in log if entry[0] == "event_creation"]
    assert ["event_deletion", created[-1]] in log


def test_without_activation_no_callback_runs():
    out = subprocess.run([sys.executable, "-c", """
import torch
import torch.phantom._gpu_trace as gpu_trace
calls = []
gpu_trace.register_callback_for_memory_allocation(calls.append)
x = torch.ones(8, device="phantom") + 1
torch.phantom.synchronize()
print(len(calls))
"""], capture_output=True, text=True, timeout=300,
                         # (the race detector's setting would activate the trace)
                         env={k: v for k, v in os.environ.items() if k != "PHANTOM_RACE_DETECTOR"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0"
