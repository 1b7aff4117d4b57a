"""The race detector's guard on non_blocking copies into host memory
(docs/race-detector.md, "Host accesses to a non_blocking copy's
destination"): host code that touches the destination of a non_blocking
device-to-host copy before anything showed the host the copy finished is
reported, naming the copy, its stream and the lines of Python that queued
the copy and touched its destination; correct programs (a synchronize, an
event query answering True, a blocking op on the stream) report nothing
and read the right values.

Each program runs in a new process: the detector activates PyTorch's GPU
trace hooks, which stay on for the whole process.
"""
import pathlib

import pytest

from test_race_detector import CATCH, PRELUDE as DETECTOR_PRELUDE, run as run_program

# The guard needs a driver whose copies ignore host page protection
# (PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION): under another driver there is
# nothing to guard. The last test runs the remote driver on its own.
pytestmark = pytest.mark.requires_fake_driver(
    "the copy guard needs a driver that declares "
    "PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION")

PRELUDE = DETECTOR_PRELUDE + "from torch_phantom import _C\n" + CATCH + """
N = 4096  # floats: four pages
src = torch.arange(N, dtype=torch.float32, device="phantom")
expected = torch.arange(N, dtype=torch.float32)
"""

HOST_ACCESS = "host access before copy finished"


def run(body, env=None, enable="rd.enable()\n"):
    return run_program(body, env, enable, prelude=PRELUDE)


def test_reading_the_destination_before_a_sync_raises_naming_the_copy_and_the_read():
    result = run("""
dst = torch.empty(N, pin_memory=True)
with torch.phantom.stream(side):
    dst.copy_(src, non_blocking=True)              # LINE-COPY
guarded = _C._host_guard_active_count()
print(json.dumps({"guarded": guarded,
                  "race": attempt(lambda: dst.sum())}))  # LINE-READ
""")
    assert result["guarded"] == 1
    race = result["race"]
    assert race["kinds"] == [HOST_ACCESS]
    text = race["text"]
    assert "aten.copy_.default writing the destination on stream" in text
    assert "of phantom:0, launched at" in text
    assert "aten.sum.default on the host" in text
    assert "LINE-COPY" in text and "LINE-READ" in text
    assert "synchronize" in text  # says what to do


def test_warn_mode_warns_once_and_the_program_goes_on():
    result = run("""
dst = torch.empty(N, pin_memory=True)
dst.copy_(src, non_blocking=True)                  # LINE-COPY
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = dst[7].item()                          # LINE-READ
    dst.sum()
torch.phantom.synchronize()
print(json.dumps({"texts": [str(w.message) for w in caught
                            if issubclass(w.category, rd.StreamRaceWarning)],
                  "right": torch.equal(dst, expected)}))
""", enable="rd.enable('warn')\n")
    assert len(result["texts"]) == 1  # the pages are open after the first access
    text = result["texts"][0]
    assert "on the default stream of phantom:0" in text
    assert "aten._local_scalar_dense.default on the host" in text
    assert "LINE-COPY" in text and "LINE-READ" in text
    assert result["right"]


def test_a_read_outside_any_op_is_reported_at_the_next_synchronize():
    result = run("""
dst = torch.empty(N, pin_memory=True)
dst.copy_(src, non_blocking=True)                  # LINE-COPY
view = memoryview(dst.numpy())
value = view[3]                                    # LINE-READ (no op: numpy's buffer)
print(json.dumps({"race": attempt(lambda: torch.phantom.synchronize()),  # LINE-SYNC
                  "right": torch.equal(dst, expected)}))
""")
    race = result["race"]
    assert race["kinds"] == [HOST_ACCESS]
    assert "outside any op" in race["text"]
    assert "LINE-SYNC" in race["text"] and "LINE-COPY" in race["text"]
    assert result["right"]


@pytest.mark.parametrize("observe", [
    "e = torch.phantom.Event(); e.record(); e.synchronize()",
    "torch.phantom.current_stream().synchronize()",
    "torch.phantom.synchronize()",
    "e = torch.phantom.Event(); e.record()\nwhile not e.query(): pass",
    "while not torch.phantom.current_stream().query(): pass",
    # torch's own event and stream, which reach phantom through its device guard
    "e = torch.Event(device='phantom'); e.record()\nwhile not e.query(): pass",
    "while not torch.accelerator.current_stream().query(): pass",
    "src.sum().item()  # an op that waits for the stream",
])
def test_the_program_that_waits_for_the_copy_reports_nothing_and_reads_the_copy(observe):
    result = run(f"""
dst = torch.empty(N, pin_memory=True)
dst.copy_(src, non_blocking=True)
{observe}
print(json.dumps({{"guarded": _C._host_guard_active_count(),
                  "race": attempt(lambda: dst.sum()),
                  "right": torch.equal(dst, expected)}}))
""")
    assert result == {"guarded": 0, "race": None, "right": True}


def test_hundreds_of_outstanding_copies_are_all_watched_and_all_released():
    # More destinations protected at once than one chunk of the guard's
    # table holds (256): the last ones are watched as the first are.
    result = run("""
dsts = [torch.empty(N, pin_memory=True) for _ in range(600)]
for dst in dsts:
    dst.copy_(src, non_blocking=True)
guarded = _C._host_guard_active_count()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in (0, 255, 256, 599):
        dsts[i].sum()
torch.phantom.synchronize()
print(json.dumps({"guarded": guarded,
                  "reported": sum(issubclass(w.category, rd.StreamRaceWarning) for w in caught),
                  "left": _C._host_guard_active_count(),
                  "right": all(torch.equal(dst, expected) for dst in dsts)}))
""", enable="rd.enable('warn')\n")
    assert result == {"guarded": 600, "reported": 4, "left": 0, "right": True}


def test_to_cpu_non_blocking_is_guarded_too():
    result = run("""
out = src.to("cpu", non_blocking=True)
pinned = out.is_pinned()
print(json.dumps({"pinned": pinned, "race": attempt(lambda: out.max())}))
""")
    if not result["pinned"]:
        pytest.skip("torch copies to pageable memory here: the copy waits")
    assert result["race"]["kinds"] == [HOST_ACCESS]


def test_with_the_detector_off_nothing_is_protected():
    result = run("""
dst = torch.empty(N, pin_memory=True)
dst.copy_(src, non_blocking=True)
guarded = _C._host_guard_active_count()
total = dst.sum().item()
torch.phantom.synchronize()
print(json.dumps({"guarded": guarded, "right": torch.equal(dst, expected)}))
""", enable="")
    assert result == {"guarded": 0, "right": True}


def test_disable_unprotects_what_was_guarded():
    result = run("""
dst = torch.empty(N, pin_memory=True)
dst.copy_(src, non_blocking=True)
before = _C._host_guard_active_count()
rd.disable()
after = _C._host_guard_active_count()
dst.sum()
torch.phantom.synchronize()
print(json.dumps({"before": before, "after": after}))
""")
    assert result == {"before": 1, "after": 0}


def test_only_pages_the_destination_owns_are_protected():
    result = run("""
page = 4096 // 4                                   # floats per page
buf = torch.zeros(3 * page, pin_memory=True)
# A piece of a storage: only its whole pages are protected.
buf[page - 8:2 * page + 8].copy_(src[:page + 16], non_blocking=True)
edge = attempt(lambda: buf[:page - 8].sum())       # a page shared with the piece
middle = attempt(lambda: buf[page + 3].item())     # a page wholly the piece's
torch.phantom.synchronize()
# Less than a page of a larger storage: nothing to protect.
buf[10:20].copy_(src[:10], non_blocking=True)
small_piece = _C._host_guard_active_count()
# A small tensor owns its pinned block, rounding included: protected.
small = torch.empty(10, pin_memory=True)
small.copy_(src[:10], non_blocking=True)
small_whole = _C._host_guard_active_count()
small_race = attempt(lambda: small.sum())
torch.phantom.synchronize()
print(json.dumps({"edge": edge, "middle": middle and middle["kinds"],
                  "small_piece": small_piece, "small_whole": small_whole,
                  "small_race": small_race and small_race["kinds"],
                  "right": torch.equal(buf[10:20], expected[:10])}))
""")
    assert result == {"edge": None, "middle": [HOST_ACCESS], "small_piece": 0,
                      "small_whole": 1, "small_race": [HOST_ACCESS], "right": True}


def test_a_destination_freed_before_its_sync_leaves_its_block_usable():
    result = run("""
dst = torch.empty(N, pin_memory=True)
dst.copy_(src, non_blocking=True)
address = dst.data_ptr()
del dst                                            # its guard goes with the block
left = _C._host_guard_active_count()
torch.phantom.synchronize()
again = torch.empty(N, pin_memory=True)            # the cached block, reused
again.fill_(1)
print(json.dumps({"left": left, "reused": again.data_ptr() == address,
                  "race": attempt(lambda: again.sum())}))
""")
    assert result["left"] == 0
    assert result["race"] is None


def test_a_driver_without_the_capability_runs_unguarded_with_one_note():
    import torch_phantom
    driver = pathlib.Path(torch_phantom.__file__).resolve().parent / "libphantom_remote.so"
    server = driver.parent / "phantom_remote_server"
    if not (driver.exists() and server.exists()):
        pytest.skip("the remote driver is not installed next to the runtime")
    result = run("""
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        dst = torch.empty(N, pin_memory=True)
        dst.copy_(src, non_blocking=True)
        guarded = _C._host_guard_active_count()
        race = attempt(lambda: dst.sum())
        torch.phantom.synchronize()
print(json.dumps({"guarded": guarded, "race": race,
                  "available": _C._host_guard_available(0),
                  "notes": [str(w.message) for w in caught if "race detector" in str(w.message)],
                  "right": torch.equal(dst, expected)}))
""", env={"PHANTOM_DRIVER": str(driver)})
    assert result["available"] is False
    assert result["guarded"] == 0 and result["race"] is None and result["right"]
    assert len(result["notes"]) == 1
    assert "PH_DEVICE_COPIES_IGNORE_HOST_PROTECTION" in result["notes"][0]
