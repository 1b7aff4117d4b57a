"""The misuse corpus: what a user can get wrong, and what they get back.

Each row of CASES is one misuse: an id, the misuse as a small function, the
exception type it must raise and a regex the message must match. The regex
checks that the message says what was wrong and, where the message can,
what to do. After every case the process must still be usable: on every
device a fresh op gives the CPU's answer, nothing is left queued with an
error, and ``memory_allocated()`` is back where it was before the case (a
failed call must not leak device memory). No case may surface a C++
backtrace ("Exception raised from ...") to the user.

Misuses that need a fresh process are tables of their own, run through
conftest's subprocess helper: invalid PHANTOM_* settings (read once per
process; a malformed one fails the import) in CONFIG_CASES, and use of
phantom in a child forked after the parent initialised it (FORK_CASES),
next to the patterns that must keep working (fork before first use, 'spawn', DataLoader workers).

docs/reliability.md lists what the corpus covers; add a row here for every
new misuse a user reports.
"""

import gc
import io
import json
import os
import re
import time
from typing import Callable, NamedTuple, Optional, Type

import pytest
import torch
import torch_phantom

from conftest import DEVICE_COUNT, run_python

P = torch.phantom
BAD = DEVICE_COUNT + 5  # a device index that does not exist
OUT_OF_RANGE = (rf"phantom device index {BAD} is out of range: .*valid indices "
                rf"0\.\.{DEVICE_COUNT - 1}\)")
OOM_ADVICE = r"Free tensors you no longer need.*PHANTOM_DEVICE_MEMORY"
STICKY = r"work 'aten::index' failed on phantom device {}: index 7 is out of bounds"
MiB = 1 << 20


class Case(NamedTuple):
    id: str
    misuse: Callable[[], object]
    raises: Type[BaseException]
    match: str
    devices: int = 1  # devices the case needs
    cleanup: Optional[Callable[[], None]] = None
    # Why the case needs the driver's kernel view ("" when it does not).
    kernel_view: str = ""


# A failed kernel reported by a later call: without a kernel view the op
# runs at the call on host copies, and its error is raised there.
LATER = ("without a kernel view the failing op runs at the call on host copies, "
         "so its error is raised there, not by a later call")


# --------------------------------------------------------------------------
# Helpers the misuses use
# --------------------------------------------------------------------------


def ones(device="phantom", n=3):
    return torch.ones(n, device=device)


def sleep_on(stream, ms):
    """Keeps ``stream`` busy for ``ms`` ms (test-only hook, see docs/streams.md)."""
    torch_phantom._C._sleep_on_stream(stream.device_index, stream.stream_id, ms)


def recorded_event(device, timing=False):
    event = P.Event(enable_timing=timing)
    event.record(P.Stream(device))
    return event


def elapsed_before_completion():
    stream = P.Stream()
    start, end = P.Event(enable_timing=True), P.Event(enable_timing=True)
    start.record(stream)
    sleep_on(stream, 500)
    end.record(stream)
    start.elapsed_time(end)


def elapsed_across_devices():
    start, end = recorded_event(0, timing=True), recorded_event(1, timing=True)
    end.synchronize()
    start.elapsed_time(end)


def elapsed_without_record_of_end():
    start, end = P.Event(enable_timing=True), P.Event(enable_timing=True)
    start.record()
    start.elapsed_time(end)


def elapsed_untimed():
    start, end = recorded_event(0), recorded_event(0)
    end.synchronize()
    start.elapsed_time(end)


def load_onto_missing_device():
    buffer = io.BytesIO()
    torch.save(ones(), buffer)
    buffer.seek(0)
    torch.load(buffer, map_location=f"phantom:{BAD}")


def accumulate_beyond_capacity():
    capacity = P.mem_get_info()[1]
    chunks = []
    for _ in range(capacity // (256 * MiB) + 2):
        chunks.append(torch.empty(256 * MiB, dtype=torch.uint8, device="phantom"))


def failed_kernel(device="phantom:0", behind_ms=0):
    """Queues an op that fails on the device (an index out of bounds found
    by the CPU kernel on the stream's worker), behind ``behind_ms`` ms of
    work; returns at once."""
    x = torch.randn(5, device=device)
    index = torch.tensor([7], device=device)
    if behind_ms:
        sleep_on(P.current_stream(device), behind_ms)
    x[index]
    return x


def failed_kernel_behind_busy_stream():
    """A failing op queued behind 300 ms of work, so that ops queued right
    after it are accepted (and then discarded) rather than refused at
    launch: the failure is reported by the next copy to the host."""
    return failed_kernel(behind_ms=300)


def op_on_a_view_past_its_shrunk_storage():
    a = ones(n=16)
    view = a[:]
    a.untyped_storage().resize_(0)
    (view + 1).cpu()


def item_after_failed_kernel():
    x = failed_kernel_behind_busy_stream()
    x.sum().item()


def copy_to_host_after_failed_kernel():
    x = failed_kernel_behind_busy_stream()
    (x * 2).cpu()


def failures_reported_once():
    index = torch.tensor([9], device="phantom")
    x = failed_kernel(behind_ms=300)
    for _ in range(2):  # queued behind the failure, so discarded
        x[index]
    P.synchronize()  # raises once; the usability check syncs again, cleanly


_side = {}


def side_stream_with_failure():
    stream = _side["stream"] = P.Stream()
    with P.stream(stream):
        failed_kernel()
    return stream


def query_after_failed_kernel():
    stream = side_stream_with_failure()
    deadline = time.monotonic() + 30  # a bound, not a timing assertion
    while not stream.query() and time.monotonic() < deadline:
        time.sleep(0.001)


def event_synchronize_after_failed_kernel():
    stream = side_stream_with_failure()
    stream.record_event().synchronize()


def drain_side_stream():
    # An event reports the failure of the work it follows; the stream keeps
    # its sticky error until its own query/synchronize reports it.
    try:
        _side.pop("stream").synchronize()
    except torch.AcceleratorError:
        pass


def sync_all():
    for index in range(P.device_count()):
        P.synchronize(index)


# --------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------

CASES = [
    # -- device indices --------------------------------------------------
    Case("factory_on_missing_device", lambda: torch.empty(2, device=f"phantom:{BAD}"),
         RuntimeError, OUT_OF_RANGE),
    Case("to_missing_device", lambda: torch.ones(2).to(f"phantom:{BAD}"),
         RuntimeError, OUT_OF_RANGE),
    Case("tensor_phantom_method_missing_device", lambda: torch.ones(2).phantom(BAD),
         RuntimeError, OUT_OF_RANGE),
    Case("module_phantom_missing_device", lambda: torch.nn.Linear(2, 2).phantom(BAD),
         RuntimeError, OUT_OF_RANGE),
    Case("set_device_missing", lambda: P.set_device(BAD), RuntimeError, OUT_OF_RANGE),
    Case("device_context_missing", lambda: P.device(BAD).__enter__(),
         RuntimeError, OUT_OF_RANGE),
    Case("synchronize_missing_device", lambda: P.synchronize(BAD),
         RuntimeError, OUT_OF_RANGE),
    Case("accelerator_set_device_missing", lambda: torch.accelerator.set_device_index(BAD),
         RuntimeError, OUT_OF_RANGE),
    Case("memory_allocated_missing_device", lambda: P.memory_allocated(BAD),
         RuntimeError, OUT_OF_RANGE),
    Case("mem_get_info_missing_device", lambda: P.mem_get_info(BAD),
         RuntimeError, OUT_OF_RANGE),
    Case("rng_state_missing_device", lambda: P.get_rng_state(BAD),
         RuntimeError, OUT_OF_RANGE),
    Case("generator_on_missing_device", lambda: torch.Generator(device=f"phantom:{BAD}"),
         RuntimeError, OUT_OF_RANGE),
    Case("storage_on_missing_device",
         lambda: torch.UntypedStorage(8, device=f"phantom:{BAD}"),
         RuntimeError, OUT_OF_RANGE),
    Case("load_onto_missing_device", load_onto_missing_device, RuntimeError,
         rf"PHANTOM device {BAD} but torch.phantom.device_count\(\) is "
         rf"{DEVICE_COUNT}.*use torch.load with map_location"),
    Case("negative_index_in_device_string", lambda: torch.device("phantom:-1"),
         RuntimeError, r"Invalid device string: 'phantom:-1'"),
    Case("negative_device_index", lambda: torch.device("phantom", -2),
         RuntimeError, r"Device index must not be negative"),
    Case("device_of_wrong_type", lambda: P.set_device(1.5), TypeError,
         r"expected a phantom device as an int, str or torch.device, got float"),
    Case("cpu_device_given_to_torch_phantom", lambda: P.synchronize("cpu"),
         ValueError, r"expected a phantom device, got 'cpu'"),
    # -- tensors of two devices in one op ----------------------------------
    Case("two_phantom_devices_in_one_op", lambda: ones("phantom:0") + ones("phantom:1"),
         RuntimeError, r"same device.*phantom:0 and phantom:1", devices=2),
    Case("out_on_another_phantom_device",
         lambda: torch.add(ones(), ones(), out=ones("phantom:1")), RuntimeError,
         r"same device.*phantom:0 and phantom:1.*Move them to one device first",
         devices=2),
    Case("cat_across_phantom_devices", lambda: torch.cat([ones("phantom:0"), ones("phantom:1")]),
         RuntimeError, r"same device.*phantom:0.*phantom:1", devices=2),
    Case("phantom_and_cpu_tensor_in_one_op", lambda: ones() + torch.ones(3),
         RuntimeError, r"same device.*phantom:0 and cpu"),
    Case("cpu_out_for_phantom_inputs", lambda: torch.add(ones(), ones(), out=torch.empty(3)),
         RuntimeError, r"same device.*phantom:0 and cpu.*Move them to one device first"),
    Case("cpu_storage_set_into_phantom_tensor",
         lambda: torch.empty(0, device="phantom").set_(torch.ones(3).untyped_storage()),
         RuntimeError, r"storage of a tensor on device \"phantom:0\" to a storage on "
                       r"different device \"cpu\".*devices must match"),
    # -- a phantom tensor where a CPU one is needed --------------------------
    Case("numpy_of_phantom_tensor", lambda: ones().numpy(), TypeError,
         r"can't convert phantom:0 device type tensor to numpy\. Use Tensor\.cpu\(\)"),
    Case("np_asarray_of_phantom_tensor", lambda: __import__("numpy").asarray(ones()),
         TypeError, r"can't convert phantom:0 .*Use Tensor\.cpu\(\)"),
    Case("pin_memory_of_phantom_tensor", lambda: ones().pin_memory(), RuntimeError,
         r"cannot pin .*only dense CPU tensors can be pinned"),
    Case("pin_memory_factory_on_phantom",
         lambda: torch.empty(3, device="phantom", pin_memory=True), RuntimeError,
         r"pin_memory=True applies only to CPU tensors; create the tensor on the "
         r"CPU and call \.pin_memory\(\)"),
    Case("record_stream_with_cpu_tensor", lambda: torch.ones(3).record_stream(P.Stream()),
         NotImplementedError, r"Could not run 'aten::record_stream' with arguments "
                              r"from the 'CPU' backend"),
    Case("record_stream_with_cpu_stream", lambda: ones().record_stream(torch.Stream("cpu")),
         RuntimeError, r"record_stream needs a phantom stream, got a stream of cpu"),
    Case("record_stream_of_another_device", lambda: ones().record_stream(P.Stream(1)),
         RuntimeError, r"record_stream: the stream is on phantom:1 but the tensor's "
                       r"memory is on phantom:0", devices=2),
    # -- streams and events ------------------------------------------------
    Case("event_recorded_on_another_device",
         lambda: recorded_event(0).record(P.Stream(1)), RuntimeError,
         r"event of phantom:0 cannot be recorded on a stream of phantom:1; record "
         r"it on a stream of its own device", devices=2),
    Case("elapsed_time_without_timing", elapsed_untimed, RuntimeError,
         r"this event was created without timing; create both events with "
         r"torch\.phantom\.Event\(enable_timing=True\)"),
    Case("elapsed_time_before_record",
         lambda: P.Event(enable_timing=True).elapsed_time(P.Event(enable_timing=True)),
         RuntimeError, r"this event has not been recorded; call record\(\) on both"),
    Case("elapsed_time_end_not_recorded", elapsed_without_record_of_end, RuntimeError,
         r"end_event has not been recorded; call record\(\) on both"),
    Case("elapsed_time_before_completion", elapsed_before_completion, RuntimeError,
         r"recorded but its work has not completed yet; call synchronize\(\)",
         cleanup=sync_all),
    Case("elapsed_time_across_devices", elapsed_across_devices, RuntimeError,
         r"recorded on different devices \(phantom:0 and phantom:1\); record both "
         r"on streams of the same device", devices=2),
    Case("elapsed_time_of_a_stream", lambda: recorded_event(0, True).elapsed_time(P.Stream()),
         TypeError, r"expected end_event to be a torch.Event, got Stream"),
    Case("interprocess_event_with_timing",
         lambda: P.Event(enable_timing=True, interprocess=True), ValueError,
         r"interprocess phantom event cannot measure time: create it with enable_timing=False"),
    Case("event_ipc_handle", lambda: P.Event().ipc_handle(), RuntimeError,
         r"cannot be shared with another process: create it with "
         r"torch.phantom.Event\(interprocess=True\)"),
    Case("wait_event_on_non_event", lambda: P.Stream().wait_event(3), TypeError,
         r"expected a torch.Event, got int"),
    Case("wait_stream_on_non_stream", lambda: P.Stream().wait_stream("phantom"), TypeError,
         r"expected a phantom stream \(torch.phantom.Stream or torch.Stream\), got str"),
    Case("stream_context_with_cpu_stream", lambda: P.stream(torch.Stream("cpu")),
         ValueError, r"expected a stream of a phantom device, got a stream of 'cpu'"),
    Case("set_stream_cpu_stream", lambda: P.set_stream(torch.Stream("cpu")),
         ValueError, r"expected a stream of a phantom device, got a stream of 'cpu'"),
    Case("stream_on_cpu_device", lambda: P.Stream("cpu"), ValueError,
         r"expected a phantom device, got 'cpu'"),
    Case("stream_on_missing_device", lambda: P.Stream(BAD), RuntimeError, OUT_OF_RANGE),
    Case("stream_of_missing_device_in_stream_context",
         lambda: P.stream(P.Stream(stream_id=1, device_index=BAD, device_type=20)).__enter__(),
         RuntimeError, OUT_OF_RANGE),
    Case("stream_with_forged_id",
         lambda: P.set_stream(P.Stream(stream_id=999, device_index=0, device_type=20)),
         RuntimeError, r"invalid phantom stream id 999 \(valid ids are 0\.\.\d+\); make "
                       r"streams with torch\.phantom\.Stream\(\)"),
    # -- sizes and capacity --------------------------------------------------
    Case("negative_size", lambda: torch.empty(-1, device="phantom"), RuntimeError,
         r"Trying to create tensor with negative dimension -1"),
    Case("overflowing_size", lambda: torch.empty(2**62, device="phantom"), RuntimeError,
         r"Storage size calculation overflowed with sizes=\[4611686018427387904\]"),
    Case("overflowing_numel", lambda: torch.empty(2**40, 2**40, device="phantom"),
         RuntimeError, r"Storage size calculation overflowed"),
    Case("resize_to_negative_size", lambda: ones().resize_(2, -3), RuntimeError,
         r"cannot resize a phantom tensor to size \[2, -3\]: dimension -3 is "
         r"negative; every size must be >= 0"),
    Case("storage_resize_to_negative_size", lambda: ones().untyped_storage().resize_(-1),
         RuntimeError, r"cannot resize a phantom storage to -1 bytes: the size must "
                       r"be between 0 and"),
    Case("allocation_beyond_capacity", lambda: torch.empty(2**31, device="phantom"),
         torch.OutOfMemoryError,
         r"tried to allocate 8\.00 GiB .* on phantom:0\. Device capacity .*" + OOM_ADVICE),
    Case("allocations_accumulating_beyond_capacity", accumulate_beyond_capacity,
         torch.OutOfMemoryError, r"phantom out of memory: tried to allocate 256\.00 MiB.*"
                                 + OOM_ADVICE),
    Case("allocation_beyond_capacity_on_device_1",
         lambda: torch.ones(2**31, device="phantom:1"), torch.OutOfMemoryError,
         r"on phantom:1\..*" + OOM_ADVICE, devices=2),
    Case("resize_beyond_capacity", lambda: ones().resize_(2**40), torch.OutOfMemoryError,
         r"tried to allocate 4096\.00 GiB.*" + OOM_ADVICE),
    Case("storage_beyond_capacity", lambda: torch.UntypedStorage(2**40, device="phantom"),
         torch.OutOfMemoryError, r"tried to allocate 1024\.00 GiB.*" + OOM_ADVICE),
    Case("as_strided_past_the_storage", lambda: ones().as_strided((10,), (1,)),
         RuntimeError, r"requiring a storage size of 40 are out of bounds for "
                       r"storage of size 12"),
    Case("op_on_a_view_past_its_shrunk_storage", op_on_a_view_past_its_shrunk_storage,
         RuntimeError, r"needs bytes \[0, 64\) of its storage .*but its storage has 0 bytes; "
                       r"was the storage resized under a view"),
    Case("view_of_incompatible_shape", lambda: ones().view(2, 2), RuntimeError,
         r"shape '\[2, 2\]' is invalid for input of size 3"),
    Case("item_of_many_elements", lambda: ones().item(), RuntimeError,
         r"a Tensor with 3 elements cannot be converted to Scalar"),
    # -- calls after a device (sticky) error ---------------------------------
    Case("synchronize_after_failed_kernel", lambda: (failed_kernel(), P.synchronize()),
         torch.AcceleratorError, STICKY.format(0), kernel_view=LATER),
    Case("item_after_failed_kernel", item_after_failed_kernel, torch.AcceleratorError,
         STICKY.format(0), kernel_view=LATER),
    Case("copy_to_host_after_failed_kernel", copy_to_host_after_failed_kernel,
         torch.AcceleratorError, STICKY.format(0), kernel_view=LATER),
    Case("several_failures_reported_once", failures_reported_once,
         torch.AcceleratorError, STICKY.format(0), kernel_view=LATER),
    Case("stream_query_after_failed_kernel", query_after_failed_kernel,
         torch.AcceleratorError, STICKY.format(0), kernel_view=LATER),
    Case("event_synchronize_after_failed_kernel", event_synchronize_after_failed_kernel,
         torch.AcceleratorError, STICKY.format(0), cleanup=drain_side_stream, kernel_view=LATER),
    Case("failed_kernel_on_device_1",
         lambda: (failed_kernel("phantom:1"), P.synchronize(0), P.synchronize(1)),
         torch.AcceleratorError, STICKY.format(1), devices=2, kernel_view=LATER),
]


def _outcome(misuse):
    """Runs ``misuse``; returns (exception type, message) or (None, result
    type). The exception object is dropped here, with its traceback, so
    tensors held by the misuse's frames are freed before memory is checked."""
    try:
        result = misuse()
    except BaseException as error:  # noqa: B902 (KeyboardInterrupt excepted below)
        if isinstance(error, KeyboardInterrupt):
            raise
        return type(error), str(error)
    return None, type(result).__name__


def assert_process_usable(allocated_before):
    sync_all()  # raises if a device error is still pending
    for index in range(P.device_count()):
        device = f"phantom:{index}"
        x = torch.arange(6.0, device=device).reshape(2, 3)
        torch.testing.assert_close((x @ x.T + 1).cpu(), torch.arange(6.0).reshape(2, 3)
                                   @ torch.arange(6.0).reshape(2, 3).T + 1)
        del x
        assert P.memory_allocated(index) == allocated_before[index], (
            f"{device}: memory_allocated went from {allocated_before[index]} to "
            f"{P.memory_allocated(index)} bytes: the failed call leaked")


def test_the_corpus_is_large_enough():
    ids = [case.id for case in CASES]
    assert len(set(ids)) == len(ids), "duplicate case ids"
    assert len(ids) + len(CONFIG_CASES) + len(FORK_CASES) >= 40


@pytest.mark.parametrize("case", [
    pytest.param(case, id=case.id, marks=[pytest.mark.requires_kernel_view(case.kernel_view)]
                 if case.kernel_view else [])
    for case in CASES])
def test_misuse(case):
    if P.device_count() < case.devices:
        pytest.skip(f"needs PHANTOM_DEVICE_COUNT >= {case.devices}")
    # Garbage an earlier test left in reference cycles would otherwise be
    # freed whenever the collector next runs, perhaps inside this case,
    # and read as the case giving memory back it never took.
    gc.collect()
    sync_all()
    allocated = [P.memory_allocated(i) for i in range(P.device_count())]
    raised, message = _outcome(case.misuse)
    try:
        assert raised is not None, f"{case.id}: no error (returned a {message})"
        assert issubclass(raised, case.raises), (
            f"{case.id}: raised {raised.__name__}, expected {case.raises.__name__}: {message}")
        assert re.search(case.match, message, re.S), (
            f"{case.id}: message does not match {case.match!r}:\n{message}")
        assert "Exception raised from" not in message, (
            f"{case.id}: the message carries a C++ backtrace:\n{message}")
    finally:
        if case.cleanup is not None:
            case.cleanup()
    assert_process_usable(allocated)


def test_storage_of_negative_size():
    raised, message = _outcome(lambda: torch.UntypedStorage(-1, device="phantom"))
    assert raised is not None and issubclass(raised, RuntimeError), message
    assert "size" in message


@pytest.mark.requires_kernel_view(
    "without a kernel view the op runs at the call on host copies, so its error is raised there, not by a later sync")
def test_a_failure_refused_at_launch_is_reported_once():
    x = torch.randn(5, device="phantom")
    failed_kernel()
    done = P.current_stream().record_event()
    # Wait for the failure to have happened without reporting it: an event
    # recorded after it carries it, and does not reset the stream.
    raised, message = _outcome(done.synchronize)
    assert raised is torch.AcceleratorError and "aten::index" in message, message
    raised, message = _outcome(lambda: x + 1)  # refused: the stream is sticky
    assert raised is torch.AcceleratorError and "aten::index" in message, message
    raised, message = _outcome(P.synchronize)
    assert raised is None, f"the failure was reported twice: {message}"


# --------------------------------------------------------------------------
# Invalid settings: each needs a process of its own (read once per process)
# --------------------------------------------------------------------------

CONFIG_CASES = [
    # (id, environment, where it fails: "use" or "import", exception type, regex)
    # A malformed value is refused by the settings parser before anything
    # loads (test_settings.py tries every setting); a few spellings here.
    ("device_count_not_a_number", {"PHANTOM_DEVICE_COUNT": "abc"}, "import", "SettingError",
     r"^PHANTOM_DEVICE_COUNT='abc' is not a whole number; accepted: a whole number from 0 "
     r"to 64; unset it for the default 2$"),
    ("device_count_negative", {"PHANTOM_DEVICE_COUNT": "-1"}, "import", "SettingError",
     r"^PHANTOM_DEVICE_COUNT='-1' is not a whole number;"),
    ("device_count_too_large", {"PHANTOM_DEVICE_COUNT": "1000"}, "import", "SettingError",
     r"^PHANTOM_DEVICE_COUNT='1000' is not in range: larger than 64;"),
    ("device_count_zero", {"PHANTOM_DEVICE_COUNT": "0"}, "use", "RuntimeError",
     r"no phantom device is available: the driver \(lib\w+\.so\) reports 0 devices"),
    ("device_memory_malformed", {"PHANTOM_DEVICE_MEMORY": "lots"}, "import", "SettingError",
     r"^PHANTOM_DEVICE_MEMORY='lots' is not a size; accepted: a size from 1MiB to 1TiB.*; "
     r"unset it for the default 8GiB$"),
    ("device_memory_zero", {"PHANTOM_DEVICE_MEMORY": "0"}, "import", "SettingError",
     r"^PHANTOM_DEVICE_MEMORY='0' is not in range: smaller than 1MiB;"),
    ("device_memory_overflowing", {"PHANTOM_DEVICE_MEMORY": "99999999999TiB"}, "import",
     "SettingError", r"^PHANTOM_DEVICE_MEMORY='99999999999TiB' is not in range: larger "
                     r"than 1TiB;"),
    ("alloc_conf_unknown_option", {"PHANTOM_ALLOC_CONF": "foo:1"}, "import", "SettingError",
     r"^PHANTOM_ALLOC_CONF='foo:1' is not a list of known options: 'foo' is not an option; "
     r"accepted: comma-separated key:value options, each at most once: max_split_size_mb "
     r"\(.*\), garbage_collection_threshold \(.*\); unset it for the default \(no options\)$"),
    ("alloc_conf_bad_threshold", {"PHANTOM_ALLOC_CONF": "garbage_collection_threshold:2"},
     "import", "SettingError", r"garbage_collection_threshold='2' is not in range: not below 1;"),
    ("alloc_conf_bad_max_split", {"PHANTOM_ALLOC_CONF": "max_split_size_mb:-1"},
     "import", "SettingError", r"max_split_size_mb='-1' is not a whole number;"),
    ("sync_generic_not_a_switch", {"PHANTOM_SYNC_GENERIC": "yes"}, "import", "SettingError",
     r"^PHANTOM_SYNC_GENERIC='yes' is not 0 or 1; accepted: 1 \(on\) or 0 \(off\); unset it "
     r"for the default 0 \(off\)$"),
    ("ops_report_not_a_switch", {"PHANTOM_OPS_REPORT": "true"}, "import", "SettingError",
     r"^PHANTOM_OPS_REPORT='true' is not 0 or 1;"),
    ("debug_memo_not_a_switch", {"PHANTOM_DEBUG_MEMO": "on"}, "import", "SettingError",
     r"^PHANTOM_DEBUG_MEMO='on' is not 0 or 1;"),
    ("no_lending_not_a_switch", {"PHANTOM_NO_LENDING": "yes"}, "import", "SettingError",
     r"^PHANTOM_NO_LENDING='yes' is not 0 or 1;"),
]

_CONFIG_SCRIPT = """
import json, torch
def outcome(fn):
    try:
        fn()
    except Exception as error:
        return [type(error).__name__, str(error)]
    return [None, "no error"]
result = {"import": outcome(lambda: __import__("torch_phantom"))}
if result["import"][0] is None:
    result["available"] = torch.phantom.is_available()
    result["use"] = outcome(lambda: torch.ones(2, device="phantom"))
    result["use_module"] = outcome(lambda: torch.phantom.current_device())
result["cpu_works"] = torch.ones(3).sum().item() == 3
print("RESULT" + json.dumps(result))
"""


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_invalid_setting(case):
    name, env, stage, error_type, pattern = case
    env = dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    done = run_python(_CONFIG_SCRIPT, env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert result["cpu_works"]
    outcomes = [result[stage]] + ([result["use_module"]] if stage == "use" else [])
    for raised, message in outcomes:
        assert raised == error_type, (name, raised, message)
        assert re.search(pattern, message), (name, message)
    if stage == "use":
        assert result["available"] is False  # the driver refused to start
    else:
        assert "available" not in result  # nothing was loaded to ask


# --------------------------------------------------------------------------
# Fork: a child forked after the parent used phantom gets a clear error
# --------------------------------------------------------------------------

FORK_CASES = {
    # id: code run in the child; `x` is a phantom tensor made by the parent
    "fork_child_uses_parent_tensor": "(x + 1).cpu()",
    "fork_child_creates_tensor": "torch.ones(2, device='phantom')",
    "fork_child_synchronizes": "torch.phantom.synchronize()",
    "fork_child_makes_stream": "torch.phantom.Stream()",
    "fork_child_copies_to_host": "x.cpu()",
    "fork_child_memory_stats": "torch.phantom.memory_allocated()",
}

_FORK_SCRIPT = """
import json, os, sys, torch, torch_phantom
cases = json.loads(sys.argv[1])
x = torch.arange(3.0, device="phantom")  # the parent initialises phantom
assert not torch.phantom._is_in_bad_fork()
results = {}
for name, code in cases.items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(code)
            out = [None, "no error", torch.phantom._is_in_bad_fork()]
        except BaseException as error:
            out = [type(error).__name__, str(error), torch.phantom._is_in_bad_fork()]
        out.append(torch.phantom.device_count())
        out.append(torch.ones(2).sum().item() == 2)  # the CPU works in the child
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    results[name] = json.loads(data)
results["parent_after"] = ((x * 2).cpu().tolist(), torch.phantom._is_in_bad_fork())
print("RESULT" + json.dumps(results))
"""

_FORK_MESSAGE = (r"cannot use the phantom device in a forked child process: the parent "
                 r"had initialised it.*Use the 'spawn' or 'forkserver' start method")


def test_fork_after_initialisation_gives_a_clear_error_in_the_child():
    done = run_python(
        "import sys; sys.argv[1:] = [" + repr(json.dumps(FORK_CASES)) + "]\n" + _FORK_SCRIPT,
        timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULT", 1)[1])
    for name in FORK_CASES:
        raised, message, bad_fork, count, cpu_works = results[name]
        assert raised == "RuntimeError", (name, raised, message)
        assert re.search(_FORK_MESSAGE, message, re.S), (name, message)
        assert "Exception raised from" not in message
        assert bad_fork is True and cpu_works, name
        assert count == DEVICE_COUNT  # device_count() still answers, as for CUDA
    assert results["parent_after"] == [[0.0, 2.0, 4.0], False]


def test_fork_before_first_use_works_in_the_child():
    code = """
import os, torch, torch_phantom
print(torch.phantom.device_count())  # does not initialise the device
pid = os.fork()
if pid == 0:
    ok = torch.phantom._is_in_bad_fork() is False and \\
        (torch.arange(3.0, device="phantom") * 2).cpu().tolist() == [0.0, 2.0, 4.0]
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert (torch.ones(2, device="phantom") + 1).cpu().tolist() == [2.0, 2.0]
print("ok")
"""
    done = run_python(code)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def _spawned_worker(rank, queue):
    x = torch.arange(4.0, device=f"phantom:{rank % torch.phantom.device_count()}")
    queue.put((rank, (x * (rank + 1)).cpu().tolist(), torch.phantom._is_in_bad_fork()))


def test_spawn_works_after_initialisation():
    import torch.multiprocessing as mp

    ones().sum().item()  # this process has initialised phantom
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_spawned_worker, args=(queue,), nprocs=2, start_method="spawn")
    results = sorted(queue.get() for _ in range(2))
    assert results == [(0, [0.0, 1.0, 2.0, 3.0], False), (1, [0.0, 2.0, 4.0, 6.0], False)]


class _PhantomInWorker(torch.utils.data.Dataset):
    """The misuse: a dataset that makes phantom tensors in forked workers."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i), device="phantom")


def test_dataloader_fork_workers_work_and_phantom_in_a_worker_is_a_clear_error():
    ones().sum().item()  # this process has initialised phantom
    data = torch.utils.data.TensorDataset(torch.arange(32.0).reshape(16, 2))
    # Pinned in the main process here: DataLoader(pin_memory=True) is covered
    # by test_pinned.py, and after its pinning thread (which calls
    # torch.set_num_threads(1)) has run, test_models.py's bit-for-bit
    # comparisons with the CPU fail when run later in the same process.
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2,
                                         multiprocessing_context="fork")
    moved = [batch.pin_memory().to("phantom", non_blocking=True) for (batch,) in loader]
    P.synchronize()
    assert torch.equal(torch.cat(moved).cpu(), torch.arange(32.0).reshape(16, 2))

    bad = torch.utils.data.DataLoader(_PhantomInWorker(), batch_size=2, num_workers=1,
                                      multiprocessing_context="fork")
    with pytest.raises(RuntimeError, match=_FORK_MESSAGE) as info:
        list(bad)
    assert "DataLoader worker process 0" in str(info.value)
    del info
    assert_process_usable([P.memory_allocated(i) for i in range(P.device_count())])
