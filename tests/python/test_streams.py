"""Streams and events of torch.phantom: semantics, not just calls.

Long device work is simulated with ``_C._sleep_on_stream`` (a test-only
binding that queues a task sleeping on a stream's worker), so "a stream is
busy" is a fact the test controls rather than a guess about how long a
kernel takes. Time is only ever used as a lower bound (a sleep of N ms
lasts at least N ms) or as a wide margin between a short and a long
sleep, never as a performance assertion.
"""

import threading
import time

import pytest
import torch

from torch_phantom import _C

P = torch.phantom

SHORT_MS = 300  # work the test waits for
LONG_MS = 2000  # work the test must *not* wait for


def sleep_on(stream, ms):
    """Queues ``ms`` milliseconds of work on ``stream``; returns at once."""
    _C._sleep_on_stream(stream.device_index, stream.stream_id, ms)


@pytest.fixture(autouse=True)
def _default_streams():
    """Every test starts and ends with the default stream current on every
    device (for this thread), so a failing test cannot leak its stream."""

    def reset():
        device = P.current_device()
        for index in range(P.device_count()):
            P.set_stream(P.default_stream(index))  # also sets the device
        P.set_device(device)

    reset()
    yield
    reset()


def zeros_ready(*shape, device="phantom"):
    """A zero tensor whose initialisation has finished, so that work on any
    stream may use it without a further sync."""
    t = torch.zeros(*shape, device=device)
    P.synchronize(t.device)
    return t


# --- the objects ------------------------------------------------------------


def test_stream_defaults_to_current_device_and_is_a_torch_stream(two_devices):
    s = P.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, P.Stream)
    assert s.device == torch.device("phantom", 0)
    with P.device(1):
        assert P.Stream().device == torch.device("phantom", 1)
    assert P.Stream("phantom:1").device_index == 1
    assert P.Stream(torch.device("phantom", 1)).device_index == 1
    assert P.Stream(1).device_index == 1
    with P.device(1):
        assert P.Stream(-1).device_index == 1
        assert P.Stream("phantom").device_index == 1
        assert P.current_stream(-1) == P.current_stream(1)
    assert s != P.default_stream() and s.stream_id != 0
    assert "torch.phantom.Stream" in repr(s) and "phantom:0" in repr(s)


def test_priority_range_and_priorities():
    low, high = P.Stream.priority_range()
    assert (low, high) == (0, -1)
    assert P.Stream().priority == low
    assert P.Stream(priority=-1).priority == high
    # Out of range is clamped, as CUDA does.
    assert P.Stream(priority=-5).priority == high
    assert P.Stream(priority=3).priority == low
    assert P.default_stream().priority == low


def test_equality_and_hash_agree_with_torch_stream():
    s = P.Stream()
    same = torch.Stream(
        stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type
    )
    assert s == same and same == s and hash(s) == hash(same)
    assert len({s, same, P.Stream(stream_id=s.stream_id, device_index=0)}) == 1
    assert s != P.default_stream()
    assert s != "not a stream"
    assert P.default_stream() == P.default_stream(0)


def test_record_event_returns_phantom_event():
    s = P.Stream()
    e = s.record_event()
    assert isinstance(e, P.Event) and isinstance(e, torch.Event)
    e.synchronize()
    assert e.query() and e.device == s.device
    plain = torch.Event("phantom")
    assert s.record_event(plain) is plain
    plain.synchronize()
    assert plain.query()


def test_unrecorded_event_is_complete_and_imposes_no_wait():
    e = P.Event()
    assert e.query()
    e.synchronize()
    s = P.Stream()
    s.wait_event(e)
    s.synchronize()
    assert s.query() and "unrecorded" in repr(e)


# --- (1) asynchrony ---------------------------------------------------------


def test_work_on_a_stream_is_asynchronous_to_the_host():
    s = P.Stream()
    start = time.monotonic()
    sleep_on(s, SHORT_MS)
    assert s.query() is False  # queued, not done: the host did not wait
    s.synchronize()
    assert time.monotonic() - start >= SHORT_MS / 1000
    assert s.query() is True


@pytest.mark.requires_kernel_view(
    "checks work left queued on the stream; without a kernel view the op runs at the call")
def test_ops_in_a_stream_context_are_queued_on_that_stream():
    s = P.Stream()
    x = zeros_ready(1000)
    sleep_on(s, SHORT_MS)
    with P.stream(s):
        x.fill_(3.0)  # a native kernel: queued behind the sleep
        assert P.current_stream() == s
    assert not s.query()
    assert P.default_stream().query()  # nothing went to the default stream
    s.synchronize()
    torch.testing.assert_close(x.cpu(), torch.full((1000,), 3.0))


def test_compute_on_a_side_stream_matches_cpu():
    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(64, 32), torch.randn(32, 16)
    s = P.Stream()
    a, b = a_cpu.to("phantom"), b_cpu.to("phantom")
    s.wait_stream(P.current_stream())  # the uploads ran on the default stream
    with s:
        out = torch.relu(a @ b) * 2 + 1
        out.add_(a.sum())
    s.synchronize()
    expected = torch.relu(a_cpu @ b_cpu) * 2 + 1 + a_cpu.sum()
    torch.testing.assert_close(out.cpu(), expected)


# --- (2) independence -------------------------------------------------------


def test_streams_are_independent():
    a, b = P.Stream(), P.Stream()
    assert a != b
    x = zeros_ready(16)
    sleep_on(a, LONG_MS)
    with b:
        x.fill_(2.0)
    b.synchronize()  # must not wait for A
    assert b.query() is True
    assert a.query() is False  # A is still busy
    torch.testing.assert_close(x.cpu(), torch.full((16,), 2.0))


# --- (3) ordering by wait_stream and wait_event -----------------------------


def _producer_consumer(order):
    """A: sleep, then x.fill_(7). B: y.copy_(x). ``order(a, b)`` orders B
    after A or not; returns y as B saw x."""
    a, b = P.Stream(), P.Stream()
    x, y = zeros_ready(256), zeros_ready(256)
    sleep_on(a, SHORT_MS)
    with a:
        x.fill_(7.0)
    order(a, b)
    with b:
        y.copy_(x)
    b.synchronize()
    result = y.cpu()
    a.synchronize()
    return result


@pytest.mark.requires_kernel_view(
    "needs the reader to run while the writer's work is still queued; without a kernel view each op runs at the call")
@pytest.mark.no_race_detector(
    "reads on one stream what another writes, unordered, on purpose, which "
    "the detector reports (test_race_detector.py)")
def test_without_ordering_b_reads_stale_data():
    # The control: streams are not implicitly ordered, so a missing sync
    # shows up as a wrong answer, as on hardware.
    y = _producer_consumer(lambda a, b: None)
    torch.testing.assert_close(y, torch.zeros(256))


def test_wait_stream_orders_b_after_a():
    y = _producer_consumer(lambda a, b: b.wait_stream(a))
    torch.testing.assert_close(y, torch.full((256,), 7.0))


def test_wait_event_orders_b_after_a():
    y = _producer_consumer(lambda a, b: b.wait_event(a.record_event()))
    torch.testing.assert_close(y, torch.full((256,), 7.0))


def test_event_wait_method_orders_b_after_a():
    def order(a, b):
        e = P.Event()
        e.record(a)
        e.wait(b)

    y = _producer_consumer(order)
    torch.testing.assert_close(y, torch.full((256,), 7.0))


def test_wait_does_not_block_the_host():
    a, b = P.Stream(), P.Stream()
    start = time.monotonic()
    sleep_on(a, SHORT_MS)
    b.wait_stream(a)  # returns at once ...
    assert not a.query()
    marker = b.record_event()
    assert not marker.query()  # ... but B's later work waits for A
    marker.synchronize()
    assert time.monotonic() - start >= SHORT_MS / 1000


def test_event_record_and_wait_default_to_current_stream():
    a, b = P.Stream(), P.Stream()
    e = P.Event()
    sleep_on(a, SHORT_MS)
    with a:
        e.record()  # on A
    assert not e.query()
    with b:
        e.wait()  # B waits
        after = P.Event()
        after.record()
    assert not after.query()
    after.synchronize()
    assert e.query()


def test_cross_device_event_wait(two_devices):
    a1, b0 = P.Stream(1), P.Stream(0)
    start = time.monotonic()
    sleep_on(a1, SHORT_MS)
    e = a1.record_event()
    assert e.device == torch.device("phantom", 1)
    b0.wait_event(e)
    marker = b0.record_event()
    assert not marker.query()
    marker.synchronize()
    assert e.query()
    assert time.monotonic() - start >= SHORT_MS / 1000


# --- (4) a wait refers to the record made before it -------------------------


def test_wait_observes_the_record_at_call_time_not_a_later_one():
    a, b, c = P.Stream(), P.Stream(), P.Stream()
    x, y = zeros_ready(64), zeros_ready(64)
    e = P.Event()
    sleep_on(a, SHORT_MS)
    with a:
        x.fill_(5.0)
    e.record(a)  # t1: after A's fill
    b.wait_event(e)  # B waits for t1
    sleep_on(c, LONG_MS)
    e.record(c)  # t2: on blocked C; must not affect B's wait
    with b:
        y.copy_(x)
    b.synchronize()
    assert c.query() is False  # B finished while C is still blocked
    torch.testing.assert_close(y.cpu(), torch.full((64,), 5.0))  # and saw t1
    assert e.query() is False  # the event now refers to t2


# --- (5) query while the last task runs --------------------------------------


def test_query_is_false_while_the_last_task_is_running():
    s = P.Stream()
    sleep_on(s, 50)
    started = s.record_event()
    sleep_on(s, 800)  # the last task
    started.synchronize()  # the first sleep is done: the last task is next
    time.sleep(0.2)  # it is running now, the queue is empty
    assert s.query() is False
    s.synchronize()
    assert s.query() is True


def test_stream_is_idle_once_its_last_event_completed():
    # On CUDA, once the last thing queued on a stream (an event record) has
    # completed, the stream has no work left: query() must agree.
    s = P.Stream()
    for _ in range(2000):
        e = s.record_event()
        e.synchronize()
        assert s.query(), "event complete but its stream still busy"


# --- (6) timing ---------------------------------------------------------------


def test_elapsed_time_grows_with_queued_work():
    s = P.Stream()
    e0, e1, e2 = (P.Event(enable_timing=True) for _ in range(3))
    e0.record(s)
    sleep_on(s, 50)
    e1.record(s)
    sleep_on(s, 250)
    e2.record(s)
    e2.synchronize()
    first, total = e0.elapsed_time(e1), e0.elapsed_time(e2)
    assert first >= 45  # lower bounds only: a sleep lasts at least its time
    assert total >= first + 240
    assert e1.elapsed_time(e2) >= 240
    # Interop with a plain torch.Event as the end event.
    end = torch.Event("phantom", enable_timing=True)
    end.record(s)
    end.synchronize()
    assert e0.elapsed_time(end) >= total


# --- (7) errors -----------------------------------------------------------------


def test_elapsed_time_errors():
    plain_a, plain_b = P.Event(), P.Event()
    plain_a.record()
    plain_b.record()
    plain_b.synchronize()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        plain_a.elapsed_time(plain_b)

    start, end = P.Event(enable_timing=True), P.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="not been recorded"):
        start.elapsed_time(end)
    start.record()
    with pytest.raises(RuntimeError, match="not been recorded"):
        start.elapsed_time(end)

    s = P.Stream()
    start.record(s)
    sleep_on(s, SHORT_MS)
    end.record(s)
    with pytest.raises(RuntimeError, match="not completed"):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) >= SHORT_MS * 0.9

    untimed = torch.Event("phantom")
    untimed.record()
    untimed.synchronize()
    with pytest.raises(RuntimeError, match="enable_timing"):
        start.elapsed_time(untimed)
    with pytest.raises(TypeError, match="expected end_event to be a torch.Event, got Stream"):
        start.elapsed_time(s)


NEEDS_IPC = pytest.mark.requires_fake_driver(
    "interprocess events are the driver's interprocess section (ph_ipc_*), "
    "which the remote driver does not offer")


@NEEDS_IPC
def test_interprocess_event_orders_work_in_its_own_process_too():
    # Across processes: tests/python/test_ipc.py.
    event = P.Event(interprocess=True)
    stream = P.Stream()
    sleep_on(stream, 300)
    event.record(stream)
    assert not event.query()
    event.synchronize()
    assert event.query()
    with pytest.raises(ValueError, match="cannot measure time"):
        P.Event(enable_timing=True, interprocess=True)
    with pytest.raises(RuntimeError, match=r"create it with torch.phantom.Event\(interprocess=True\)"):
        P.Event().ipc_handle()


@NEEDS_IPC
def test_interprocess_event_is_recorded_only_on_its_device(two_devices):
    event = P.Event(interprocess=True)  # on the current device, 0
    with pytest.raises(RuntimeError, match="does not match recording stream's device phantom:1"):
        event.record(P.Stream(device=1))


def test_cpu_streams_and_devices_are_rejected():
    cpu_stream = torch.Stream("cpu")
    with pytest.raises(ValueError, match="phantom"):
        P.Stream("cpu")
    with pytest.raises(ValueError, match="stream of a phantom device"):
        P.stream(cpu_stream)
    with pytest.raises(ValueError, match="stream of a phantom device"):
        P.set_stream(cpu_stream)
    with pytest.raises(ValueError, match="stream of a phantom device"):
        P.Stream().wait_stream(cpu_stream)
    with pytest.raises(ValueError, match="stream of a phantom device"):
        P.Event().record(cpu_stream)
    with pytest.raises(ValueError, match="phantom"):
        P.current_stream("cpu")
    with pytest.raises(TypeError, match="expected a phantom stream .*, got str"):
        P.stream("phantom:0")


def test_invalid_device_index_is_rejected():
    with pytest.raises(Exception, match="device"):
        P.Stream(P.device_count())
    with pytest.raises(Exception, match="device"):
        P.current_stream(P.device_count())


def test_event_cannot_be_recorded_on_another_device(two_devices):
    e = P.Event()
    e.record(P.Stream(0))
    with pytest.raises(RuntimeError, match="phantom:0"):
        e.record(P.Stream(1))
    # ... but streams of any device can wait on it.
    s1 = P.Stream(1)
    s1.wait_event(e)
    s1.synchronize()


def test_stream_context_on_another_device_switches_device(two_devices):
    s1 = P.Stream(1)
    prev1, prev0 = P.current_stream(1), P.current_stream(0)
    assert P.current_device() == 0
    with P.stream(s1) as entered:
        assert entered == s1
        assert P.current_device() == 1
        assert P.current_stream() == s1 and P.current_stream(1) == s1
        assert P.current_stream(0) == prev0
        t = torch.empty(4, device="phantom")
        assert t.device == torch.device("phantom", 1)
    assert P.current_device() == 0
    assert P.current_stream(1) == prev1 and P.current_stream(0) == prev0


def test_stream_context_restores_on_exception(two_devices):
    s1 = P.Stream(1)
    with pytest.raises(KeyError, match="boom"):
        with s1:
            assert P.current_device() == 1
            raise KeyError("boom")
    assert P.current_device() == 0
    assert P.current_stream(1) == P.default_stream(1)


def test_stream_context_none_is_a_noop(two_devices):
    P.set_device(1)
    before = P.current_stream()
    with P.stream(None) as entered:
        assert entered is None
        assert P.current_device() == 1 and P.current_stream() == before
    assert P.current_device() == 1 and P.current_stream() == before


def test_stream_contexts_nest_and_reenter():
    a, b = P.Stream(), P.Stream()
    default = P.current_stream()
    with a:
        with b:
            assert P.current_stream() == b
            with a:
                assert P.current_stream() == a
            assert P.current_stream() == b
        assert P.current_stream() == a
        ctx = P.stream(b)
        with ctx:
            with ctx:
                assert P.current_stream() == b
            assert P.current_stream() == b
        assert P.current_stream() == a
    assert P.current_stream() == default


# --- interop with torch.accelerator and torch.Stream ---------------------------


def test_set_stream_interoperates_with_torch_accelerator(two_devices):
    s = P.Stream()
    P.set_stream(s)
    assert torch.accelerator.current_stream() == s
    t = P.Stream(1)
    torch.accelerator.set_stream(t)  # also makes phantom:1 current
    assert P.current_device() == 1
    got = P.current_stream()
    assert isinstance(got, P.Stream) and got == t
    assert P.current_stream(0) == s
    P.set_stream(None)  # no-op
    assert P.current_stream() == t


def test_torch_stream_context_is_seen_by_torch_phantom():
    s = torch.Stream("phantom")
    with s:
        assert P.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert P.current_stream() == P.default_stream()


def test_torch_accelerator_synchronize_waits_for_side_streams():
    a, b = P.Stream(), P.Stream()
    sleep_on(a, SHORT_MS)
    sleep_on(b, SHORT_MS)
    torch.accelerator.synchronize()
    assert a.query() and b.query()
    sleep_on(a, SHORT_MS)
    P.synchronize()
    assert a.query()


# --- (8) the current stream is per thread ------------------------------------


def test_current_stream_is_thread_local():
    s = P.Stream()
    P.set_stream(s)
    seen = {}
    done = threading.Event()

    def other():
        seen["initial"] = P.current_stream()
        mine = P.Stream()
        P.set_stream(mine)
        seen["mine"] = mine
        seen["after"] = P.current_stream()
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert done.is_set()
    assert seen["initial"] == P.default_stream()
    assert seen["after"] == seen["mine"]
    assert P.current_stream() == s  # untouched by the other thread


def test_synchronize_releases_the_gil():
    # Another Python thread keeps running while the host waits for a stream.
    s = P.Stream()
    sleep_on(s, SHORT_MS)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(None)
            time.sleep(0.005)

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        s.synchronize()
    finally:
        stop.set()
        thread.join()
    assert len(ticks) > 5
