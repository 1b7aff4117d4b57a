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
