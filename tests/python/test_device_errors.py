"""A device error reaches everything that depends on the failed work, and
nothing else (docs/streams.md, "Device errors").

Stream A fails on the device (an index out of bounds); work queued behind
it on A is discarded. Whatever was ordered after that failure -- through an
event wait, a stream wait, a cross-device copy -- must fail with the
original error, naming the op and the stream it was queued on, and never
complete over memory the failed work did not write. After an error has
been reported the process goes on: the streams are reset and new work on
them runs correctly. Work that does not depend on the failure succeeds.

The property test at the end builds random graphs of streams, events,
waits and copies, injects a fault at a random kernel
(torch_phantom.testing.faults) and checks every consumer against a model.
"""

import os
import random
import re

import pytest
import torch
from torch_phantom.testing import faults

from test_streams import sleep_on

# The failures here are kernels failing on a stream (an index out of bounds
# found by the kernel); without a kernel view ops run on the host and raise
# at the call instead.
pytestmark = pytest.mark.requires_kernel_view("device errors of kernels failing on a stream")

P = torch.phantom
SHORT_MS = 200
ORIGINAL = r"work 'aten::index' failed on phantom device {}: index 7 is out of bounds"


@pytest.fixture(autouse=True)
def _clean_streams():
    """Faults off, the default stream current everywhere; after the test,
    every stream of the test has reported what it had."""
    faults.reset()
    yield
    faults.reset()
    for index in range(P.device_count()):
        P.set_stream(P.default_stream(index))
    P.set_device(0)


def ready(values, device="phantom:0"):
    t = torch.as_tensor(values, dtype=torch.float32).to(device)
    P.synchronize(t.device)
    return t


def where(stream):
    """How a failed op's message names the stream it was queued on."""
    return re.escape(f"(queued on {stream.device} stream_id={stream.stream_id})")


def fail_on(stream, behind_ms=SHORT_MS):
    """Queues on ``stream``, behind ``behind_ms`` of work, an op that fails
    on the device and (when something is ahead of it) one computed from it;
    returns the last (never computed: its memory is whatever the allocator
    held)."""
    x = ready(torch.arange(5.0), stream.device)
    bad = torch.tensor([7], device=stream.device)
    P.synchronize(stream.device)
    if behind_ms:
        sleep_on(stream, behind_ms)
    with P.stream(stream):
        y = x[bad]  # aten::index: queued; fails on the worker
        # x and bad were made on the device's current stream and are freed
        # when this returns, while `stream` may still read them.
        x.record_stream(stream)
        bad.record_stream(stream)
        if not behind_ms:
            # With nothing ahead the op may fail before another launch on
            # the stream, which would then raise at the call.
            return y
        return y * 2 + 1  # discarded


def inherited(stream, device=0):
    """The message of a failure that ``stream`` (where aten::index failed)
    passed on through an event: how it was inherited, then the original."""
    return r"inherited.*" + ORIGINAL.format(device) + r".*" + where(stream)


def report_once(stream):
    """``stream`` reports the failure once, if it still has it; then it is
    clean."""
    try:
        stream.synchronize()
    except torch.AcceleratorError as error:
        assert "aten::index" in str(error), error
    stream.synchronize()


def assert_works(*streams):
    """New work on each stream gives the CPU's answer."""
    for stream in streams:
        with P.stream(stream):
            x = torch.arange(6.0, device=stream.device)
            torch.testing.assert_close(((x + 1) * 3).cpu(), (torch.arange(6.0) + 1) * 3)
        stream.synchronize()


# --- the case of the issue ----------------------------------------------------


@pytest.mark.parametrize("consumer", ["copy_to_host_on_b", "synchronize_b",
                                      "default_stream_waits_for_b", "device_synchronize"])
def test_work_after_a_wait_on_a_failed_stream_raises_the_original_error(consumer):
    a, b = P.Stream(), P.Stream()
    y = fail_on(a)
    b.wait_event(a.record_event())  # recorded after the failing op
    with P.stream(b):
        z = y + 100  # computed from A's output on B: must not be a result
    # A device synchronize reports the first failed stream's error: A's own,
    # or B's, inherited; either gives the original.
    expected = (ORIGINAL.format(0) + ".*" + where(a) if consumer == "device_synchronize"
                else inherited(a))
    with pytest.raises(torch.AcceleratorError, match=expected):
        if consumer == "copy_to_host_on_b":
            with P.stream(b):
                z.cpu()
        elif consumer == "synchronize_b":
            b.synchronize()
        elif consumer == "default_stream_waits_for_b":
            P.current_stream().wait_stream(b)
            z.cpu()
        else:
            P.synchronize()
    if consumer != "device_synchronize":  # that one reported every stream's
        # A reports its own failure, in the original words.
        with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0) + ".*" + where(a)):
            a.synchronize()
    for stream in (b, P.current_stream()):
        report_once(stream)
    assert_works(a, b, P.current_stream())


def test_stream_wait_stream_carries_the_failure_too():
    a, b = P.Stream(), P.Stream()
    y = fail_on(a)
    b.wait_stream(a)
    with P.stream(b):
        z = y.sum()
        with pytest.raises(torch.AcceleratorError, match=inherited(a)):
            z.item()
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        a.synchronize()
    assert_works(a, b)


def test_an_event_after_the_failure_reports_it_until_recorded_again():
    a = P.Stream()
    fail_on(a, behind_ms=0)
    event = a.record_event()
    with pytest.raises(torch.AcceleratorError, match=r"event was recorded.*" + ORIGINAL.format(0)):
        event.synchronize()
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        event.query()
    # The stream still reports its failure (an event does not reset it) ...
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        a.synchronize()
    # ... and the event still marks a point after failed work: a stream that
    # waits on it now inherits the failure, even though A was reset.
    late = P.Stream()
    late.wait_event(event)
    with pytest.raises(torch.AcceleratorError, match=inherited(a)):
        late.synchronize()
    event.record(a)  # a point after good work
    event.synchronize()
    assert event.query()
    late.wait_event(event)
    assert_works(a, late)


def test_an_event_recorded_before_the_failure_reports_nothing():
    a, b = P.Stream(), P.Stream()
    x = ready([1.0, 2.0, 3.0])
    sleep_on(a, SHORT_MS)
    with P.stream(a):
        good = x * 10
    before = a.record_event()
    fail_on(a, behind_ms=0)
    b.wait_event(before)
    with P.stream(b):
        torch.testing.assert_close((good + 1).cpu(), torch.tensor([11.0, 21.0, 31.0]))
    before.synchronize()
    assert before.query()
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        a.synchronize()


def test_independent_streams_and_work_before_the_wait_are_unaffected():
    a, b, c = P.Stream(), P.Stream(), P.Stream()
    x = ready([1.0, 2.0])
    y = fail_on(a)
    with P.stream(b):
        before_wait = x * 3  # queued on B before the wait: runs
    b.wait_event(a.record_event())
    with P.stream(c):
        independent = x + 5
        torch.testing.assert_close(independent.cpu(), torch.tensor([6.0, 7.0]))
    c.synchronize()
    with pytest.raises(torch.AcceleratorError, match=inherited(a)):
        b.synchronize()
    with P.stream(b):
        torch.testing.assert_close(before_wait.cpu(), torch.tensor([3.0, 6.0]))
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        a.synchronize()
    del y


def test_random_ops_elsewhere_go_on_after_the_failure_was_reported():
    # The generator orders random ops across streams with an event; once
    # the failed stream has reported, that event must not pass its failure
    # on to random ops on other streams.
    a, b = P.Stream(), P.Stream()
    torch.randn(4, device="phantom")  # the first call of a signature waits
    fail_on(a)
    with P.stream(a):
        torch.randn(4, device="phantom")  # a draw queued behind the failure
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        a.synchronize()
    with P.stream(b):
        drawn = torch.rand(1000, device="phantom").cpu()
    assert ((drawn >= 0) & (drawn < 1)).all() and drawn.unique().numel() > 900


# --- chains across streams and devices ----------------------------------------


def test_a_chain_of_three_streams_fails_at_its_end():
    a, b, c = P.Stream(), P.Stream(), P.Stream()
    y = fail_on(a)
    b.wait_event(a.record_event())
    with P.stream(b):
        w = y * 3
    c.wait_event(b.record_event())
    with P.stream(c):
        with pytest.raises(torch.AcceleratorError, match=inherited(a)) as info:
            (w - 1).cpu()
    message = str(info.value)
    del info  # its traceback holds this frame: no cycle left for the collector
    assert message.count("inherited") == 1 and message.count("aten::index") == 1, message
    for stream in (b, a):
        with pytest.raises(torch.AcceleratorError, match="aten::index"):
            stream.synchronize()
    assert_works(a, b, c)


def test_a_chain_across_two_devices_fails_at_its_end(two_devices):
    a0, b1, c0 = P.Stream(0), P.Stream(1), P.Stream(0)
    y = fail_on(a0)
    on1 = ready([1.0, 2.0], "phantom:1")
    b1.wait_event(a0.record_event())
    with P.stream(b1):
        w = on1 * 2  # on device 1, ordered after A's failure
    c0.wait_event(b1.record_event())
    with pytest.raises(torch.AcceleratorError, match=inherited(a0)):
        P.synchronize(1)  # device 1 reports what it inherited
    with P.stream(c0):
        with pytest.raises(torch.AcceleratorError, match=inherited(a0)):
            (y + 1).cpu()
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        a0.synchronize()
    assert_works(a0, b1, c0)
    del w


def test_a_cross_device_copy_of_failed_work_raises_the_original_error(two_devices):
    a = P.Stream(0)
    y = fail_on(a)
    target = P.Stream(1)
    with P.stream(a), P.stream(target):
        with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0) + ".*" + where(a)):
            y.to("phantom:1")
    a.synchronize()  # reported by the copy
    assert_works(a, target)


def test_a_copy_to_another_device_after_an_inheriting_wait_raises(two_devices):
    a, b = P.Stream(0), P.Stream(0)
    y = fail_on(a)
    b.wait_event(a.record_event())
    with P.stream(b), P.stream(P.Stream(1)):
        with pytest.raises(torch.AcceleratorError, match=inherited(a)):
            (y * 2).to("phantom:1")
    with pytest.raises(torch.AcceleratorError, match=ORIGINAL.format(0)):
        a.synchronize()


# --- the property: random graphs with a fault at a random kernel ---------------
#
# A graph is a random program over a few streams on up to two devices: queued
# kernels (native ones, so every kernel is queued, none waited for), event
# records, event waits, stream waits, copies on a device and blocking copies
# between devices, then checks. It is a correct program (a stream only uses
# a tensor made on a stream it is ordered after), and a model tracks which
# streams, events and tensors depend on the kernel the fault hit:
#   - a kernel's output depends on the failure iff its stream does then;
#   - a record carries the failure iff its stream has it then; a wait on it
#     passes the failure to the waiting stream;
#   - a blocking copy between devices raises iff the source's or the
#     target's current stream has a failure (the first of the two that has
#     one reports it and is reset);
#   - a launch on a stream with a failure may raise (then the stream has
#     reported it and is reset) or be accepted and discarded: which one
#     depends on whether the failure has happened yet on the device;
#   - once a stream has reported its failure, the program drops the tensors
#     that depend on it (they hold garbage, as after an error on any GPU).
# Then every event, every failed tensor still held and every stream is a
# consumer: each must raise, naming the injected fault and the stream it
# was queued on, iff the model says it depends on the failure; every other
# tensor must equal the CPU's value; and every stream must run new work.


class Graph:
    def __init__(self, rng, devices):
        self.rng = rng
        self.devices = devices
        self.streams = [P.Stream(d % devices) for d in range(rng.randint(3, 4))]
        self.failed = {s: False for s in self.streams}  # a failure not reported yet
        # What each stream may use: ids of tensors made on streams it is
        # ordered after, on its device.
        self.usable = {s: set() for s in self.streams}
        self.tensors = {}  # id -> (device tensor, CPU value, failed, stream)
        self.next_key = 0
        self.events = []   # (event, failed, usable ids)
        self.fault = None  # (stream, kernel number) where the fault fired
        self.log = []

    def add_tensor(self, stream, dev, ref, failed):
        key = self.next_key
        self.next_key += 1
        self.tensors[key] = (dev, ref, failed, stream)
        self.usable[stream].add(key)
        return key

    def seed_tensors(self):
        for stream in self.streams:
            for _ in range(2):
                ref = torch.randn(6, 6, generator=torch.Generator().manual_seed(
                    self.rng.randrange(2**31)))
                with P.stream(stream):
                    dev = ref.to(stream.device)
                self.add_tensor(stream, dev, ref, False)
        for stream in self.streams:
            stream.synchronize()

    def report(self, stream):
        """``stream`` reported its failure and was reset: it no longer uses
        what depends on the failure, and once no stream is left to report
        it, nothing does (those tensors hold garbage)."""
        self.failed[stream] = False
        for key, (_, _, failed, maker) in list(self.tensors.items()):
            if not failed:
                continue
            self.usable[stream].discard(key)
            if not self.failed[maker]:
                del self.tensors[key]
                for usable in self.usable.values():
                    usable.discard(key)

    def refused(self, stream, error):
        """A launch on ``stream`` raised: only a stream with a failure may
        refuse work, and it has then reported it."""
        self.log.append("  refused")
        assert self.failed[stream], f"a launch on a good stream raised: {error}"
        self.assert_names_the_fault(str(error))
        self.report(stream)

    def queued(self, stream, armed_before):
        """After queueing work on ``stream``: if the armed fault fired, it
        hit this stream."""
        if armed_before and faults.armed()["kernel"] is None:
            self.fault = stream
            self.failed[stream] = True

    def kernel(self, stream):
        keys = sorted(self.usable[stream] & self.tensors.keys())
        a, b = (self.tensors[self.rng.choice(keys)] for _ in range(2))
        kind = self.rng.choice(["add", "mul", "mm", "relu", "sub"])
        self.log.append(f"{kind} on {stream.stream_id}@{stream.device_index}")
        armed_before = faults.armed()["kernel"] is not None
        with P.stream(stream):
            try:
                if kind == "add":
                    dev, ref = a[0] + b[0], a[1] + b[1]
                elif kind == "mul":
                    dev, ref = a[0] * 0.5, a[1] * 0.5
                elif kind == "mm":
                    dev, ref = (a[0] @ b[0]) * 0.25, (a[1] @ b[1]) * 0.25
                elif kind == "relu":
                    dev, ref = torch.relu(a[0]), torch.relu(a[1])
                else:
                    dev, ref = a[0] - b[0], a[1] - b[1]
            except torch.AcceleratorError as error:
                # Refused, perhaps by the failure of this op's own first
                # kernel (mm then a multiplication).
                self.queued(stream, armed_before)
                self.refused(stream, error)
                return
        self.queued(stream, armed_before)
        # The inputs were made on this stream or on one it waited for, so
        # if they depend on the failure, so does the stream.
        self.add_tensor(stream, dev, ref, self.failed[stream])

    def record_and_wait(self, stream, waiter, how):
        if how == "event":
            event = stream.record_event()
            self.events.append((event, self.failed[stream], set(self.usable[stream])))
            waiter.wait_event(event)
        else:
            waiter.wait_stream(stream)
        self.log.append(f"{waiter.stream_id}@{waiter.device_index} waits "
                        f"{stream.stream_id}@{stream.device_index} ({how})")
        self.failed[waiter] = self.failed[waiter] or self.failed[stream]
        if waiter.device == stream.device:
            self.usable[waiter] |= self.usable[stream]

    def copy_on_device(self, stream):
        key = self.rng.choice(sorted(self.usable[stream] & self.tensors.keys()))
        dev, ref, _, _ = self.tensors[key]
        self.log.append(f"copy on {stream.stream_id}@{stream.device_index}")
        armed_before = faults.armed()["kernel"] is not None
        with P.stream(stream):
            out = torch.empty_like(dev)
            try:
                out.copy_(dev)
            except torch.AcceleratorError as error:
                self.queued(stream, armed_before)
                self.refused(stream, error)
                return
        self.queued(stream, armed_before)
        self.add_tensor(stream, out, ref.clone(), self.failed[stream])

    def copy_across(self, stream, target):
        key = self.rng.choice(sorted(self.usable[stream] & self.tensors.keys()))
        dev, ref, failed, _ = self.tensors[key]
        self.log.append(f"copy {stream.stream_id}@{stream.device_index} -> "
                        f"{target.stream_id}@{target.device_index}")
        expect = stream if self.failed[stream] else target if self.failed[target] else None
        with P.stream(stream), P.stream(target):
            try:
                out = dev.to(target.device)
            except torch.AcceleratorError as error:
                assert expect is not None, f"a copy of good work raised: {error}"
                self.assert_names_the_fault(str(error))
                self.report(expect)
                return
        assert expect is None and not failed, (
            "a blocking copy of work that depends on the failed kernel succeeded")
        self.add_tensor(target, out, ref.clone(), False)

    def assert_names_the_fault(self, message):
        assert "injected device fault" in message, message
        assert f"(queued on {self.fault.device} stream_id={self.fault.stream_id})" in message, (
            f"the message does not name the stream the fault hit: {message}")

    def consume(self, what, call, failed):
        try:
            call()
        except torch.AcceleratorError as error:
            assert failed, f"{what} raised, but depends on nothing that failed: {error}"
            self.assert_names_the_fault(str(error))
            return True
        assert not failed, f"{what} depends on the failed kernel but reported success"
        return False

    def check(self):
        for event, failed, _ in self.events:
            self.consume("an event's synchronize", event.synchronize, failed)
        for key, (dev, _, failed, stream) in list(self.tensors.items()):
            if failed and self.failed[stream] and key in self.tensors:
                with P.stream(stream):
                    self.consume("a copy to the host of failed work", dev.cpu, True)
                self.report(stream)
        for stream in self.streams:
            self.consume("a stream's synchronize", stream.synchronize, self.failed[stream])
            self.report(stream)
        for index in range(self.devices):
            P.synchronize(index)  # nothing left to report
        for key, (dev, ref, failed, stream) in self.tensors.items():
            if not failed:
                torch.testing.assert_close(dev.cpu(), ref, rtol=1e-4, atol=1e-4)
        assert_works(*self.streams)


def run_graph(graph):
    rng = graph.rng
    graph.seed_tensors()
    faults.reset()
    faults.fail_kernel(rng.randint(1, 14))
    for _ in range(rng.randint(10, 30)):
        stream = rng.choice(graph.streams)
        others = [s for s in graph.streams if s != stream]
        step = rng.random()
        if step < 0.5:
            graph.kernel(stream)
        elif step < 0.75:
            graph.record_and_wait(stream, rng.choice(others), rng.choice(["event", "stream"]))
        elif step < 0.87:
            graph.copy_on_device(stream)
        else:
            across = [s for s in others if s.device != stream.device]
            if across:
                graph.copy_across(stream, rng.choice(across))
    faults.fail_kernel(0)  # whatever did not fire
    graph.check()


def test_random_graphs_with_a_fault_at_a_random_kernel():
    seed = int(os.environ.get("PHANTOM_GRAPH_SEED", random.SystemRandom().randrange(2**31)))
    graphs = int(os.environ.get("PHANTOM_GRAPHS", "40"))
    print(f"\nrandom graphs: seed={seed} (replay: PHANTOM_GRAPH_SEED={seed})", flush=True)
    devices = min(2, P.device_count())
    fired = 0
    for number in range(graphs):
        graph = Graph(random.Random(seed * 1000 + number), devices)
        try:
            run_graph(graph)
        except Exception as error:
            raise AssertionError(
                f"graph {number} of seed {seed} (replay: PHANTOM_GRAPH_SEED={seed}): {error}\n"
                f"steps: {graph.log}") from error
        fired += graph.fault is not None
    assert fired > 0, f"the fault never fired in {graphs} graphs (seed {seed})"
