"""Phantom tensors and events across processes (docs/multiprocessing.md):
through torch.multiprocessing queues, pipes and spawn arguments, and from
DataLoader workers, as CUDA tensors go; the sender keeps the memory alive
until the receiver is done; a driver that cannot share memory is refused at
the call, with a sentence saying to send .cpu() instead.

Each scenario is a script run in a fresh interpreter (spawned children must
import its functions, so it is a file, not ``python -c``). Nothing can
hang: every get, join and DataLoader has a timeout inside the script, and
the script itself is killed after ``SCRIPT_TIMEOUT`` seconds.
"""

import os
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch_phantom
from torch_phantom import reductions

SCRIPT_TIMEOUT = 240

# Sharing itself needs the driver's interprocess section (ph_ipc_*); the
# refusal of a driver without it is checked on any driver.
NEEDS_IPC = pytest.mark.requires_fake_driver(
    "shares device memory between processes (ph_ipc_*), which the remote "
    "driver does not offer")

# What every script starts with: a bounded queue get and a check.
_PRELUDE = """
import os, sys, time, queue
import torch, torch_phantom
import torch.multiprocessing as mp

WAIT = 60  # seconds: any get or join longer than this is a hang

def get(q):
    return q.get(timeout=WAIT)

def ipc_collect():
    return torch.phantom.ipc_collect()
"""


def run_script(tmp_path, body, extra_env=None):
    """Runs ``_PRELUDE + body`` as a script; returns its stdout after
    asserting it exited cleanly."""
    script = tmp_path / "scenario.py"
    script.write_text(_PRELUDE + textwrap.dedent(body))
    env = dict(os.environ)
    env.update(extra_env or {})
    try:
        result = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=tmp_path,
            capture_output=True, text=True, timeout=SCRIPT_TIMEOUT,
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the scenario hung for {SCRIPT_TIMEOUT} s:\n{error.stderr}")
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout}\n"
        f"--- stderr ---\n{result.stderr[-6000:]}"
    )
    return result.stdout


# ---------------------------------------------------------------- in process


def test_the_storage_reducer_is_phantoms_and_cpu_storages_still_go_to_torch():
    assert ForkingPickler._extra_reducers[torch.UntypedStorage] is (
        reductions._reduce_untyped_storage
    )
    cpu = torch.arange(6.0)
    back = ForkingPickler.loads(ForkingPickler.dumps(cpu))
    assert torch.equal(back, cpu)
    assert back.untyped_storage().is_shared()  # torch's own CPU sharing


@NEEDS_IPC
def test_a_process_that_unpickles_its_own_message_gets_its_storage_back():
    x = torch.arange(12.0, device="phantom")
    view = x[2:8]
    back = ForkingPickler.loads(ForkingPickler.dumps(view))
    assert back.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert back.storage_offset() == 2
    assert torch.equal(back.cpu(), view.cpu())
    del back, view, x
    torch.phantom.ipc_collect()


@NEEDS_IPC
def test_an_empty_phantom_tensor_round_trips():
    empty = torch.empty(0, 3, device="phantom")
    back = ForkingPickler.loads(ForkingPickler.dumps(empty))
    assert back.device == empty.device and back.shape == (0, 3)


@NEEDS_IPC
def test_record_stream_still_protects_a_tensor_after_it_was_sent():
    stream = torch.phantom.Stream()
    x = torch.ones(1 << 18, device="phantom")
    stream.wait_stream(torch.phantom.current_stream())  # x is written on the default stream
    ForkingPickler.loads(ForkingPickler.dumps(x))  # sent (to this process)
    address = x.data_ptr()
    torch_phantom._C._sleep_on_stream(stream.device_index, stream.stream_id, 300.0)
    with torch.phantom.stream(stream):
        (x * 2).sum()  # x is in use on the side stream
    x.record_stream(stream)
    del x
    y = torch.empty(1 << 18, device="phantom")
    assert y.data_ptr() != address, "the block was reused while the side stream used it"
    stream.synchronize()


@NEEDS_IPC
def test_memory_kept_for_a_receiver_that_let_go_is_collected_before_out_of_memory():
    capacity = torch.phantom.mem_get_info()[1]
    if capacity > (1 << 30):
        pytest.skip("needs the 1 GiB devices of conftest")
    torch.phantom.empty_cache()
    x = torch.empty(600 << 20, dtype=torch.uint8, device="phantom")
    _, shared = reductions._reduce_phantom_storage(x.untyped_storage())
    del x  # the receiver still holds it: kept in limbo
    assert torch_phantom._C._ipc_blocks_in_limbo() == 1
    torch_phantom._C._release_ipc_counter(shared[4], shared[5])  # it let go
    y = torch.empty(600 << 20, dtype=torch.uint8, device="phantom")
    assert torch_phantom._C._ipc_blocks_in_limbo() == 0
    del y
    torch.phantom.empty_cache()


@NEEDS_IPC
def test_an_interprocess_event_needs_no_timing_and_a_plain_one_cannot_be_shared():
    with pytest.raises(ValueError, match="interprocess phantom event cannot measure time"):
        torch.phantom.Event(enable_timing=True, interprocess=True)
    with pytest.raises(RuntimeError, match=r"Event\(interprocess=True\)"):
        torch.phantom.Event().ipc_handle()
    with pytest.raises(RuntimeError, match=r"Event\(interprocess=True\)"):
        ForkingPickler.dumps(torch.phantom.Event())
    event = torch.phantom.Event(interprocess=True)
    assert event.interprocess and event.device == torch.device("phantom", 0)
    assert len(event.ipc_handle()) == 64
    assert event.query()  # never recorded
    event.record()
    event.synchronize()
    assert event.query()
    with pytest.raises(RuntimeError, match="interprocess event, which does not measure time"):
        event.elapsed_time(event)
    with pytest.raises(TypeError, match="expected the bytes Event.ipc_handle"):
        torch.phantom.Event.from_ipc_handle(0, "not bytes")


# ------------------------------------------------------------ across processes


@NEEDS_IPC
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_dataloader_workers_yield_phantom_tensors(tmp_path, method):
    out = run_script(tmp_path, f"""
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 24
        def __getitem__(self, i):
            return torch.full((3,), float(i * i), device="phantom"), i

    if __name__ == "__main__":
        loader = DataLoader(Squares(), batch_size=4, num_workers=2,
                            multiprocessing_context="{method}", timeout=WAIT)
        seen = []
        for batch, index in loader:
            assert batch.device == torch.device("phantom", 0), batch.device
            expected = (index.float() ** 2)[:, None].expand(-1, 3)
            assert torch.equal(batch.cpu(), expected), (batch.cpu(), index)
            assert torch.equal((batch * 2).cpu(), expected * 2)
            seen += index.tolist()
        assert sorted(seen) == list(range(24)), seen
        print("ok")
    """)
    assert out.strip() == "ok"


@NEEDS_IPC
def test_producer_and_consumer_over_a_queue(tmp_path):
    out = run_script(tmp_path, """
    def tensors(device="cpu"):
        torch.manual_seed(0)
        base = torch.arange(40.0).reshape(5, 8).to(device)
        return {
            "float": torch.randn(100).to(device),
            "int64": torch.arange(-50, 50).to(device),
            "half": torch.linspace(0, 1, 33).half().to(device),
            "view": base[1:4, ::2],  # strided, storage offset 8
            "big": torch.rand(3 << 20).to(device),  # 12 MiB: a segment of its own
        }

    def producer(q, back, acks):
        sent = tensors("phantom")
        # Two views of one storage in one message stay one storage.
        whole = torch.arange(16.0, device="phantom")
        sent["halves"] = (whole[:8], whole[8:])
        param = torch.nn.Parameter(torch.ones(3, device="phantom"))
        sent["param"] = param
        sent["storage"] = torch.full((5,), 7.0, device="phantom").untyped_storage()
        q.put(sent)
        get(acks)  # the consumer wrote into "float"
        torch.phantom.synchronize()
        back.put(sent["float"].cpu())
        get(acks)  # keep the memory alive until the consumer is done

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q, back, acks = ctx.Queue(), ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=producer, args=(q, back, acks))
        p.start()
        got = get(q)
        for name, expected in tensors().items():
            assert got[name].device.type == "phantom", name
            assert got[name].dtype == expected.dtype, name
            assert got[name].stride() == expected.stride(), name
            assert got[name].storage_offset() == expected.storage_offset(), name
            assert torch.equal(got[name].cpu(), expected), name
        first, second = got["halves"]
        assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
        assert torch.equal(torch.cat([first, second]).cpu(), torch.arange(16.0))
        assert isinstance(got["param"], torch.nn.Parameter) and got["param"].requires_grad
        as_floats = torch.empty(0, device="phantom").set_(got["storage"], 0, (5,), (1,))
        assert torch.equal(as_floats.cpu(), torch.full((5,), 7.0))
        # A received storage is not resizable (it is a piece of the sender's).
        try:
            got["float"].resize_(1000)
            raise AssertionError("resize of received memory was accepted")
        except RuntimeError as error:
            assert "not resizable" in str(error), error
        # Received memory is the sender's: a write here is seen there.
        got["float"].add_(1)
        torch.phantom.synchronize()
        acks.put("wrote")
        assert torch.equal(get(back), tensors()["float"] + 1)
        # Sending what was received again is refused, at the call.
        try:
            mp.get_context("spawn").SimpleQueue().put(got["int64"])
            raise AssertionError("re-sending a received tensor was accepted")
        except RuntimeError as error:
            assert "send a clone() of it instead" in str(error), error
        del got, first, second, as_floats
        acks.put("done")
        p.join(WAIT)
        assert p.exitcode == 0, p.exitcode
        print("ok")
    """)
    assert out.strip() == "ok"


def _shared_memory_files():
    return {name for name in os.listdir("/dev/shm") if "phantom" in name}


@NEEDS_IPC
def test_the_sender_frees_before_the_receiver_is_done(tmp_path):
    files_before = _shared_memory_files()
    out = run_script(tmp_path, """
    def producer(q, acks, report):
        x = torch.arange(1 << 18, dtype=torch.float32, device="phantom")
        q.put(x)
        del x  # the sender lets go at once
        assert get(acks) == "got"
        # Memory freed here would be reused now, and overwritten.
        torch.phantom.empty_cache()
        junk = [torch.full((1 << 18,), -1.0, device="phantom") for _ in range(8)]
        torch.phantom.synchronize()
        report.put(torch_phantom._C._ipc_blocks_in_limbo())
        assert get(acks) == "released"
        deadline = time.time() + WAIT
        while torch_phantom._C._ipc_blocks_in_limbo() and time.time() < deadline:
            ipc_collect()
            time.sleep(0.01)
        report.put(torch_phantom._C._ipc_blocks_in_limbo())

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q, acks, report = ctx.Queue(), ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=producer, args=(q, acks, report))
        p.start()
        x = get(q)
        acks.put("got")
        assert get(report) == 1, "the sender keeps the sent block in limbo"
        expected = torch.arange(1 << 18, dtype=torch.float32)
        assert torch.equal(x.cpu(), expected), "the sender reused memory still in use"
        del x
        acks.put("released")
        assert get(report) == 0, "released memory goes back to the sender"
        p.join(WAIT)
        assert p.exitcode == 0
        print("ok")
    """)
    assert out.strip() == "ok"
    assert _shared_memory_files() == files_before, "the processes left files in /dev/shm"


@NEEDS_IPC
def test_spawn_arguments_and_pipes_carry_phantom_tensors(tmp_path):
    out = run_script(tmp_path, """
    def child(x, conn):
        y = conn.recv()
        conn.send((x + y).cpu())
        conn.recv()  # the parent has read the answer

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        parent_end, child_end = ctx.Pipe()
        x = torch.arange(5.0, device="phantom")
        p = ctx.Process(target=child, args=(x, child_end))
        p.start()
        parent_end.send(torch.full((5,), 10.0, device="phantom"))
        assert parent_end.poll(WAIT)
        assert torch.equal(parent_end.recv(), torch.arange(5.0) + 10)
        parent_end.send("bye")
        p.join(WAIT)
        assert p.exitcode == 0
        print("ok")
    """)
    assert out.strip() == "ok"


@NEEDS_IPC
@pytest.mark.requires_kernel_view(
    "needs the parent's work still queued when its event is recorded; without a kernel view the op runs at the call")
@pytest.mark.no_race_detector(
    "the parent's read is ordered after its own side stream's write only through "
    "the child: an interprocess event the child records after waiting on the "
    "parent's, which the detector in the parent does not see")
def test_interprocess_events_order_work_across_processes(tmp_path):
    out = run_script(tmp_path, """
    def child(inbox, outbox):
        outbox.put("ready")
        x, filled, back = get(inbox)
        # The parent's fill is behind a 2 s kernel on its side stream.
        assert not filled.query(), "the parent's record cannot be reached yet"
        stream = torch.phantom.Stream()
        with torch.phantom.stream(stream):
            filled.wait()
            seen = x.clone()
        stream.synchronize()
        assert torch.equal(seen.cpu(), torch.ones(8)), seen.cpu()
        # Now this side writes, behind its own slow kernel, and records.
        with torch.phantom.stream(stream):
            torch_phantom._C._sleep_on_stream(stream.device_index, stream.stream_id, 300.0)
            x.fill_(2.0)
            back.record()
        outbox.put("recorded")
        get(inbox)  # the parent has checked
        stream.synchronize()

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        inbox, outbox = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=child, args=(inbox, outbox))
        p.start()
        assert get(outbox) == "ready"
        x = torch.zeros(8, device="phantom")
        torch.phantom.synchronize()
        filled = torch.phantom.Event(interprocess=True)
        back = torch.phantom.Event(interprocess=True)  # the child records it
        side = torch.phantom.Stream()
        with torch.phantom.stream(side):
            torch_phantom._C._sleep_on_stream(side.device_index, side.stream_id, 2000.0)
            x.fill_(1.0)
            filled.record()
        inbox.put((x, filled, back))
        assert get(outbox) == "recorded"
        back.synchronize()  # the child's record, made in the child
        assert torch.equal(x.cpu(), torch.full((8,), 2.0)), x.cpu()
        inbox.put("checked")
        p.join(WAIT)
        assert p.exitcode == 0
        print("ok")
    """)
    assert out.strip() == "ok"


_NO_IPC = {"PHANTOM_FAKE_NO_IPC": "1"}
_SEND_CPU = r"Send tensor\.cpu\(\) instead"


def test_a_driver_that_cannot_share_refuses_in_the_sender_at_the_call(tmp_path):
    out = run_script(tmp_path, r"""
    import re, warnings

    def child(x):
        pass

    def expect_refusal(action, what):
        try:
            action()
        except NotImplementedError as error:
            assert re.search(r"cannot share device memory between processes", str(error)), error
            assert re.search(r"Send tensor\.cpu\(\) instead", str(error)), error
            print("refused:", what)
            return
        raise AssertionError(f"{what}: nothing was raised")

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        x = torch.arange(4.0, device="phantom")
        a, b = ctx.Pipe()
        expect_refusal(lambda: a.send(x), "pipe")
        expect_refusal(lambda: ctx.SimpleQueue().put(x), "simple queue")
        p = ctx.Process(target=child, args=(x,))
        expect_refusal(p.start, "spawn arguments")
        try:
            torch.phantom.Event(interprocess=True)
            raise AssertionError("an interprocess event was made")
        except NotImplementedError as error:
            assert "cannot share device memory or events" in str(error), error
            print("refused: event")
        # A Queue pickles in its feeder thread: the error reaches the
        # receiver's get() (and the sender warns), instead of a hang.
        q = ctx.Queue()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            q.put(x)
            try:
                get(q)
                raise AssertionError("the queue delivered a tensor")
            except NotImplementedError as error:
                assert "the sending process could not send a phantom tensor or event" in str(error)
                assert re.search(r"Send tensor\.cpu\(\) instead", str(error)), error
                print("refused: queue, in the receiver")
        assert any("cannot be sent" in str(w.message) for w in caught), caught
        assert torch.equal(x.cpu(), torch.arange(4.0))  # still usable here
        print("ok")
    """, _NO_IPC)
    assert out.splitlines() == [
        "refused: pipe", "refused: simple queue", "refused: spawn arguments",
        "refused: event", "refused: queue, in the receiver", "ok"]


def test_a_dataloader_over_a_driver_that_cannot_share_raises_instead_of_hanging(tmp_path):
    out = run_script(tmp_path, r"""
    from torch.utils.data import DataLoader, Dataset

    class OnDevice(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            return torch.full((2,), float(i), device="phantom")

    if __name__ == "__main__":
        loader = DataLoader(OnDevice(), batch_size=2, num_workers=2,
                            multiprocessing_context="spawn", timeout=WAIT)
        start = time.time()
        try:
            next(iter(loader))
            raise AssertionError("a batch arrived")
        except NotImplementedError as error:
            assert "Send tensor.cpu() instead" in str(error), error
            assert time.time() - start < WAIT, "the error came from the timeout"
        print("ok")
    """, _NO_IPC)
    assert out.strip() == "ok"
