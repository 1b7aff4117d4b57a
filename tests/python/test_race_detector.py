"""The stream race detector (torch.phantom.race_detector): each kind of race
planted is caught with the right names, and the same program made correct
reports nothing.

Each program runs in a new process: the detector activates PyTorch's GPU
trace hooks, which stay on for the whole process.
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

PRELUDE = """
import json, warnings
import torch
import torch.phantom.race_detector as rd
default = torch.phantom.current_stream()
side = torch.phantom.Stream()
"""


def run(body, env=None, enable="rd.enable()\n", prelude=PRELUDE):
    # From a file, as a user's script: reports quote its lines.
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "program.py")
        with open(script, "w") as f:
            f.write(prelude + enable + body)
        out = subprocess.run([sys.executable, script], capture_output=True, text=True,
                             timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


CATCH = """
def attempt(fn):
    try:
        fn()
        return None
    except rd.StreamRaceError as e:
        return {"text": str(e), "kinds": [r.kind for r in e.races]}
"""


def test_a_read_not_ordered_after_a_write_on_another_stream_is_reported_with_both_sites():
    result = run(CATCH + """
x = torch.ones(1000, device="phantom")
x.mul_(2)                                   # LINE-WRITE
def read():
    with torch.phantom.stream(side):
        y = x + 1                           # LINE-READ
print(json.dumps(attempt(read)))
""")
    assert result["kinds"] == ["unordered access"]
    text = result["text"]
    assert "aten.add.Tensor reading argument 'self' on stream" in text
    assert "aten.mul_.Tensor writing argument 'self'" in text
    assert "on the default stream of phantom:0" in text
    assert "LINE-WRITE" in text and "LINE-READ" in text
    assert "wait_stream" in text  # says what to do


def test_a_write_not_ordered_after_a_read_on_another_stream_is_reported():
    result = run(CATCH + """
x = torch.ones(1000, device="phantom")
torch.phantom.synchronize()
with torch.phantom.stream(side):
    y = x * 3                               # read on side
print(json.dumps(attempt(lambda: x.zero_())))  # write on default
""")
    assert result["kinds"] == ["unordered access"]
    assert "aten.zero_.default writing" in result["text"]
    assert "aten.mul.Tensor reading" in result["text"]


@pytest.mark.parametrize("order", [
    "side.wait_stream(default)",
    "e = torch.phantom.Event(); e.record(default); side.wait_event(e)",
    "torch.phantom.synchronize()",
    "default.synchronize()",
    "e = torch.phantom.Event(); e.record(default); e.synchronize()",
])
def test_the_same_program_ordered_reports_nothing(order):
    result = run(CATCH + f"""
x = torch.ones(1000, device="phantom")
x.mul_(2)
{order}
def read():
    with torch.phantom.stream(side):
        return (x + 1).sum().item()
print(json.dumps([attempt(read), (x + 1).sum().item()]))
""")
    assert result == [None, 3000.0]


def test_in_place_view_ops_touch_no_data():
    # set_ (how a tensor received from another process is rebuilt) and the
    # in-place view ops change a tensor's view of its storage: they read and
    # write none of its bytes.
    result = run(CATCH + """
x = torch.ones(1000, device="phantom")
side.wait_stream(default)
with torch.phantom.stream(side):
    x.mul_(2)                               # pending on side
def rebind():
    y = torch.empty(0, device="phantom")
    y.set_(x.untyped_storage(), 0, (1000,), (1,))
    y.unsqueeze_(0).t_()
def read_on_default():
    x.sum()
print(json.dumps([attempt(rebind), attempt(read_on_default)]))
""")
    assert result[0] is None
    assert result[1]["kinds"] == ["unordered access"]


def test_disjoint_views_of_one_storage_do_not_race_and_overlapping_ones_do():
    result = run(CATCH + """
x = torch.ones(1000, device="phantom")
side.wait_stream(default)                   # the fill is ordered before side's work
x[:500].mul_(2)
def disjoint():
    with torch.phantom.stream(side):
        x[500:].add_(1)
def overlapping():
    with torch.phantom.stream(side):
        x[400:600].add_(1)
print(json.dumps([attempt(disjoint), attempt(overlapping)]))
""")
    assert result[0] is None
    assert result[1]["kinds"] == ["unordered access"]


# x's block (4 MiB) freed on the default stream while side's read of it
# may still run (no record_stream). again(numel, stream) takes that memory
# (in part or whole) on `stream` and fills it; a race is reported at the
# op that first touches it (the allocation's own), and a program that
# reports nothing asserts it got the same bytes back, so what was checked
# was a reuse.
FREED_WHILE_READ = """
x = torch.ones(1 << 20, device="phantom")
old = x.data_ptr()
side.wait_stream(default)
with torch.phantom.stream(side):
    y = x * 2                               # LINE-USE
del x

def again(numel, stream=default):
    def use():
        with torch.phantom.stream(stream):
            z = torch.empty(numel, device="phantom")  # LINE-REUSE
            z.fill_(1)
        assert old <= z.data_ptr() < old + (4 << 20), "the block was not reused"
        z.sum().item()
    return attempt(use)
"""


def test_memory_freed_while_another_stream_may_use_it_is_reported_when_used_again():
    result = run(CATCH + FREED_WHILE_READ + """
print(json.dumps(again(1 << 20)))
""")
    assert result["kinds"] == ["freed while in use"]
    text = result["text"]
    assert "freed for reuse on the default stream of phantom:0" in text
    assert "aten.mul.Tensor reading argument 'self' on stream" in text
    assert "aten.empty.memory_format writing the output on the default stream" in text
    assert "LINE-USE" in text and "LINE-REUSE" in text
    assert "record_stream" in text and "wait_stream" in text  # says what to do


def test_a_part_of_a_freed_block_handed_out_again_is_checked_too():
    # Half the block: the allocator splits it and hands out the first half.
    result = run(CATCH + FREED_WHILE_READ + """
print(json.dumps(again(1 << 19)))
""")
    assert result["kinds"] == ["freed while in use"]


def test_a_free_whose_memory_is_used_again_only_after_the_use_finished_reports_nothing():
    result = run(CATCH + FREED_WHILE_READ + """
rd._report_pending()
first = attempt(lambda: (torch.ones(4, device="phantom") + 1).sum().item())
side.synchronize()
print(json.dumps([first, again(1 << 20)]))
""")
    assert result == [None, None]


def test_a_future_callbacks_stream_recorded_from_cpp_holds_the_block_back():
    """c10's Future runs a callback on a pool stream and records that stream
    on the value's blocks from C++ (the device guard's
    recordDataPtrOnStream), as record_stream does: the allocator holds the
    block back until the callback's work is done, so its reuse is no race.
    The detector hears of it through the runtime's record-stream observer."""
    result = run(CATCH + """
import gc, time
t = torch.full((1 << 20,), 2.0, device="phantom")
old = t.data_ptr()
fut = torch.futures.Future(devices=["phantom:0"])
fut.set_result(t)
child = fut.then(lambda f: f.value() * 2)   # on a pool stream, nothing waits for it
del t, fut
gc.collect()
time.sleep(0.3)                              # its work ends; the host does not see it

def reuse():
    x = torch.empty(1 << 20, device="phantom")
    x.fill_(1)
    assert x.data_ptr() == old, "the block was not reused"
    x.sum().item()
first = attempt(reuse)
assert torch.equal(child.wait().cpu(), torch.full((1 << 20,), 4.0))
print(json.dumps(first))
""")
    assert result is None


@pytest.mark.parametrize("ordered", [True, False])
def test_a_free_ordered_before_the_reuse_as_fsdp2_does_it_reports_nothing(ordered):
    # FSDP2's reduce-scatter output: allocated on side, read on default,
    # freed into side's pool while that read may run; side waits for
    # default before it allocates again.
    wait = "side.wait_stream(default)" if ordered else ""
    result = run(CATCH + f"""
with torch.phantom.stream(side):
    x = torch.ones(1 << 20, device="phantom")
old = x.data_ptr()
default.wait_stream(side)
total = x.sum()                             # read on default
del x
{wait}
def again():
    with torch.phantom.stream(side):
        z = torch.empty(1 << 20, device="phantom")
        z.fill_(3)
    assert z.data_ptr() == old, "the block was not reused"
print(json.dumps(attempt(again)))
""")
    if ordered:
        assert result is None
    else:
        assert result["kinds"] == ["freed while in use"]
        assert "aten.sum.default reading" in result["text"]
        assert "freed for reuse on stream 1 of phantom:0" in result["text"]


@pytest.mark.parametrize("fix", [
    "x.record_stream(side)",
    "side.synchronize()",
    "default.wait_stream(side)",
])
def test_the_free_made_safe_reports_nothing(fix):
    result = run(CATCH + f"""
x = torch.ones(1 << 20, device="phantom")
side.wait_stream(default)
with torch.phantom.stream(side):
    y = x * 2
{fix}
del x
def again():
    z = torch.empty(1 << 20, device="phantom")
    z.fill_(1).sum().item()
    return z.data_ptr()
print(json.dumps([attempt(again), torch.empty(1 << 20, device="phantom").data_ptr()]))
""")
    assert result[0] is None


def test_warn_action_warns_and_the_op_still_runs():
    result = run("""
x = torch.ones(10, device="phantom")
x.mul_(2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.phantom.stream(side):
        y = x + 1
    torch.phantom.synchronize()
kinds = [w.category.__name__ for w in caught]
print(json.dumps({"kinds": kinds, "shape": list(y.shape)}))
""", enable='rd.enable(action="warn")\n')
    # The read raced with the fill and the write: its values are whatever
    # the device held, which is the bug the warning names.
    assert result["kinds"] == ["StreamRaceWarning"]
    assert result["shape"] == [10]


@pytest.mark.parametrize("level, expected", [("1", "warn"), ("2", "error"), ("0", "off")])
def test_the_setting_turns_the_detector_on_at_import(level, expected):
    result = run("""
x = torch.ones(10, device="phantom")
x.mul_(2)
outcome = "off"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        with torch.phantom.stream(side):
            y = x + 1
        if any(w.category is rd.StreamRaceWarning for w in caught):
            outcome = "warn"
    except rd.StreamRaceError:
        outcome = "error"
print(json.dumps(outcome))
""", env={"PHANTOM_RACE_DETECTOR": level}, enable="")
    assert result == expected


def test_disable_stops_reporting_and_bad_actions_are_refused():
    result = run("""
rd.disable()
x = torch.ones(10, device="phantom")
x.mul_(2)
with torch.phantom.stream(side):
    y = x + 1
try:
    rd.enable(action="loud")
    refused = None
except ValueError as e:
    refused = str(e)
print(json.dumps({"enabled": rd.is_enabled(), "refused": refused}))
""")
    assert result["enabled"] is False
    assert "'error' or 'warn'" in result["refused"]


def test_a_correct_training_loop_with_a_copy_stream_reports_nothing():
    # Data copied in on a side stream, ordered with wait_stream and
    # record_stream, as real input pipelines do; forward, backward, step.
    result = run(CATCH + """
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to("phantom")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def train():
    losses = []
    for step in range(3):
        batch = torch.randn(8, 16).pin_memory()
        with torch.phantom.stream(side):
            x = batch.to("phantom", non_blocking=True)
        default.wait_stream(side)
        x.record_stream(default)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
print(json.dumps(attempt(train)))
""")
    assert result is None


# Programs the detector once misreported or broke when the whole suite ran
# under it (scripts/test_race_detector_suite.sh). Each is correct: none
# may report a race, crash, or change what the program computes.
SUITE_FOUND = CATCH + """
import threading
results = {}
def case(name):
    def register(fn):
        results[name] = attempt(fn)
    return register

@case("a host copy waits for its stream, so the free after it is safe")
def _():
    with torch.phantom.stream(side):
        y = torch.arange(4.0, device="phantom")
    default.wait_stream(side)
    assert y.tolist() == [0.0, 1.0, 2.0, 3.0]
    del y
    torch.ones(2, device="phantom") + 1

@case("a copy between devices runs on each device's own stream")
def _():
    a = torch.ones(8, device="phantom:0") * 2
    b = a.to("phantom:1")
    with torch.phantom.device(1):
        assert (b + 1).sum().item() == 24.0

@case("sparse tensors: their index and value tensors are tracked")
def _():
    i = torch.tensor([[0, 1], [1, 0]])
    sp = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (2, 2)).to("phantom")
    assert (sp + sp).to_dense().sum().item() == 6.0
    csr = torch.eye(3).to_sparse_csr().to("phantom")
    assert csr.to_dense().sum().item() == 3.0

@case("nested tensors: a jagged one's values and offsets are tracked")
def _():
    njt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)],
                                     layout=torch.jagged, device="phantom")
    assert (njt * 2).values().sum().item() == 10.0

@case("a stream set with set_stream, or rebuilt from its id, is the same stream; "
      "item() waits for its stream")
def _():
    torch.phantom.set_stream(side)
    z = torch.ones(3, device="phantom")
    again = torch.phantom.Stream(stream_id=side.stream_id, device_index=side.device_index,
                                 device_type=side.device_type)
    with torch.phantom.stream(again):
        z.add_(1)
    torch.phantom.set_stream(default)
    default.wait_stream(side)
    assert z.sum().item() == 6.0

@case("threads allocating, freeing and synchronizing at once")
def _():
    def work():
        for _ in range(30):
            (torch.ones(64, device="phantom") * 3).sum().item()
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    work()
    for t in threads:
        t.join()

@case("torch.compile's tracing is not checked; the compiled program runs")
def _():
    f = torch.compile(lambda u: (u * 2 + 1).relu())
    assert f(torch.ones(4, device="phantom")).sum().item() == 12.0

@case("an exception raised past freed tensors reaches its handler")
def _():
    def fails():
        t = torch.ones(1 << 16, device="phantom") * 2  # freed while unwinding
        raise ValueError("the original error")
    try:
        fails()
    except ValueError as e:
        assert str(e) == "the original error"

rd._report_pending()
print(json.dumps(results))
"""


@pytest.mark.requires_kernel_view(
    "one of its programs uses sparse tensors, which need the kernel view")
def test_programs_the_suite_found_misreported_report_nothing():
    result = run(SUITE_FOUND, env={"PHANTOM_DEVICE_COUNT": "2"})
    assert result == {name: None for name in result}
    assert len(result) == 8


def test_a_race_on_another_device_names_that_devices_streams():
    # The copy to phantom:0 reads `a` on phantom:1's current stream, which
    # is not ordered after the write on phantom:1's side stream.
    result = run(CATCH + """
with torch.phantom.device(1):
    other = torch.phantom.Stream()
    a = torch.ones(1000, device="phantom:1")
    other.wait_stream(torch.phantom.current_stream())
    with torch.phantom.stream(other):
        a.mul_(2)                           # LINE-WRITE
print(json.dumps(attempt(lambda: a.to("phantom:0"))))
""", env={"PHANTOM_DEVICE_COUNT": "2"})
    assert result["kinds"] == ["unordered access"]
    text = result["text"]
    assert "aten._to_copy.default reading argument 'self' on the default stream of phantom:1" in text
    assert "aten.mul_.Tensor writing argument 'self'" in text
    assert "of phantom:1, launched at" in text and "LINE-WRITE" in text


def test_the_setting_does_not_initialise_a_device_at_import():
    # Importing torch with the detector on must not start a device: a
    # program that forks workers, or picks its device later, relies on it.
    out = subprocess.run(
        [sys.executable, "-c", "import torch, json; "
         "print(json.dumps([torch.phantom.race_detector.is_enabled(), "
         "torch.phantom.is_initialized()]))"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PHANTOM_RACE_DETECTOR": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]


@pytest.mark.requires_kernel_view(
    "without a kernel view the op runs at the call on host copies, so its error is raised there, not by a later sync, and no stream is replaced")
def test_a_stream_replaced_after_a_device_error_is_still_the_same_stream():
    # After side's error is reported the runtime replaces its driver stream
    # (a new handle, the same stream id). Memory allocated on side before
    # and used on it after is used on one stream: freeing it is safe.
    result = run(CATCH + """
from torch_phantom.testing import faults
before = side.native_handle
with torch.phantom.stream(side):
    w = torch.ones(4, device="phantom")
    faults.fail_kernel(1)
    bad = w * 2                             # fails on the device
try:
    side.synchronize()
except torch.AcceleratorError:
    pass
faults.reset()
def reuse():
    global w, bad
    with torch.phantom.stream(side):
        w.mul_(3)                           # on the replacement
    del w, bad
    torch.ones(2, device="phantom") + 1     # where a free is reported
print(json.dumps({"replaced": side.native_handle != before, "report": attempt(reuse)}))
""")
    assert result == {"replaced": True, "report": None}
