"""The race detector and pccl's collectives.

A collective runs on pccl's communication stream, ordered after the work
already queued on the stream that launched it; ``Work.wait()`` makes the
current stream wait for it, and the collective's ``Future`` (``then``,
``wait``) orders its users through events recorded on the communication
stream. The runtime traces all of it (phantom/GpuTrace.h: the collective's
work stream, its end event's record, waits, synchronizes and queries), so
the detector files the collective's accesses on the stream where they
happen: an ordered use reports nothing, and a use of the output on any
stream before the collective is waited for is a race. The functional
collectives' wait (wait_tensor) and autograd wrapper touch no data.

Each program runs in a new process (a one-rank pccl group), from a file,
as in test_race_detector.py.
"""
import pytest

from test_race_detector import CATCH, run

pytestmark = pytest.mark.no_race_detector(
    "plants races on purpose and switches the detector on in its own processes")

GROUP = CATCH + """
import torch.distributed as dist
dist.init_process_group("phantom:pccl", store=dist.HashStore(), rank=0, world_size=1)
t = torch.full((64,), 3.0, device="phantom")
"""


def test_a_future_then_callback_reading_the_output_reports_nothing():
    # The callback runs on a pool stream that c10's Future makes wait for
    # the events it recorded on the communication stream.
    result = run(GROUP + """
fut = dist.all_reduce(t, async_op=True).get_future()
def chained():
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    assert doubled.cpu().tolist() == [6.0] * 64
    assert fut.wait()[0].cpu().tolist() == [3.0] * 64
print(json.dumps(attempt(chained)))
""")
    assert result is None


@pytest.mark.parametrize("order", [
    "work.wait()",
    "work.wait(); side.wait_stream(default)",
    "work.get_future().wait()",
    "work.wait(timeout=__import__('datetime').timedelta(seconds=30))",
    "torch.phantom.synchronize()",
])
def test_a_use_after_the_collective_is_waited_for_reports_nothing(order):
    result = run(GROUP + f"""
work = dist.all_reduce(t, async_op=True)
{order}
def use():
    with torch.phantom.stream(side if "side" in {order!r} else default):
        t.add_(1)
print(json.dumps(attempt(use)))
""")
    assert result is None


def test_a_read_on_an_unrelated_stream_before_any_wait_is_reported():
    # side waited for the default stream, which launched the collective;
    # the collective runs on the communication stream, which nobody waited
    # for.
    result = run(GROUP + """
work = dist.all_reduce(t, async_op=True)   # LINE-COLLECTIVE
side.wait_stream(default)
def read():
    with torch.phantom.stream(side):
        y = t * 2                          # LINE-READ
print(json.dumps(attempt(read)))
""")
    assert result["kinds"] == ["unordered access"]
    text = result["text"]
    assert "aten.mul.Tensor reading argument 'self' on stream" in text
    assert "c10d.allreduce_.default writing argument 'tensors'" in text
    assert "LINE-COLLECTIVE" in text and "LINE-READ" in text
    assert "Wait for the collective" in text and "work.wait()" in text  # what to do


def test_a_write_on_the_launching_stream_before_the_wait_is_reported():
    # The launching stream does not wait for the collective until
    # work.wait(): writing its tensor before that races with it.
    result = run(GROUP + """
work = dist.all_reduce(t, async_op=True)   # LINE-COLLECTIVE
print(json.dumps(attempt(lambda: t.add_(1))))
work.wait()
""")
    assert result["kinds"] == ["unordered access"]
    assert "aten.add_.Tensor writing argument 'self'" in result["text"]
    assert "on the default stream" in result["text"]
    assert "LINE-COLLECTIVE" in result["text"]


def test_the_collectives_input_freed_before_the_wait_is_held_back_for_it():
    # pccl keeps the tensors of a collective for the communication stream
    # (as record_stream): their reuse after the free is no race.
    result = run(GROUP + """
x = torch.ones(1 << 20, device="phantom")
work = dist.all_reduce(x, async_op=True)
del x
def reuse():
    z = torch.empty(1 << 20, device="phantom")
    z.fill_(1)
print(json.dumps(attempt(reuse)))
work.wait()
""")
    assert result is None


def test_a_functional_collective_used_through_autograd_reports_nothing():
    # funcol's wait (wait_tensor) and its autograd wrapper hand back the
    # collective's output without touching it: not uses of it.
    result = run(GROUP + """
import torch.distributed._functional_collectives as funcol
x = torch.full((64,), 3.0, device="phantom", requires_grad=True)
def train():
    out = funcol.all_reduce(x, "sum", dist.group.WORLD)
    (out * 2).sum().backward()
    assert x.grad.cpu().tolist() == [2.0] * 64
print(json.dumps(attempt(train)))
""")
    assert result is None


def test_a_functional_collectives_output_read_before_its_wait_is_reported():
    result = run(GROUP + """
name = dist.group.WORLD.group_name
out = torch.ops._c10d_functional.all_reduce(t, "sum", name)   # LINE-COLLECTIVE
side.wait_stream(default)
def read():
    with torch.phantom.stream(side):
        y = out * 2                                           # LINE-READ
early = attempt(read)
waited = attempt(lambda: torch.ops._c10d_functional.wait_tensor(out))
print(json.dumps([early, waited, attempt(lambda: out * 2)]))
""")
    early, waited, after = result
    assert early["kinds"] == ["unordered access"]
    assert "_c10d_functional.all_reduce.default writing the output" in early["text"]
    assert "LINE-COLLECTIVE" in early["text"] and "LINE-READ" in early["text"]
    assert waited is None and after is None


def test_a_functional_all_reduces_input_written_before_the_wait_is_no_race():
    # The functional all_reduce clones its input on the launching stream and
    # reduces the clone: the input is free again on that stream; the output
    # is the collective's until its wait.
    result = run(GROUP + """
name = dist.group.WORLD.group_name
out = torch.ops._c10d_functional.all_reduce(t, "sum", name)
rewritten = attempt(lambda: t.add_(1))
early = attempt(lambda: out.add_(1))                          # LINE-EARLY
torch.ops._c10d_functional.wait_tensor(out)
print(json.dumps([rewritten, early]))
""")
    rewritten, early = result
    assert rewritten is None
    assert early["kinds"] == ["unordered access"] and "LINE-EARLY" in early["text"]
