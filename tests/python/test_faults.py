"""Fault injection (torch_phantom.testing.faults, docs/fault-injection.md).

What a user relies on:
- the k-th device allocation fails as a real out-of-memory would
  (torch.OutOfMemoryError saying it was injected), allocating nothing;
- the k-th kernel fails as a device error naming the op, reported once;
  afterwards the device works as before;
- latency makes the host run ahead of the device, so a missing
  synchronization shows up as stale or wrong data;
- the same knobs come from PHANTOM_FAULT_* at start-up, and a bad value is a
  clear error at import;
- and the sweep: failing each allocation and each kernel of a training step
  in turn, every run raises, memory returns to where it was, and the next
  step computes the same loss as an undisturbed one.
"""

import gc

import pytest
import torch
import torch_phantom
from torch_phantom.testing import faults

from conftest import run_python

# Long enough that the host cannot possibly finish its next few lines while
# the device still waits (used for ordering, never asserted on as a time).
LATENCY_US = 300_000


@pytest.fixture(autouse=True)
def _faults_off():
    # These tests compare memory_allocated() before and after: garbage an
    # earlier test left (a traceback holding a tensor) must not be freed by
    # the collector in the middle of a measurement.
    gc.collect()
    torch.phantom.synchronize()
    faults.reset()
    yield
    faults.reset()


def assert_device_works(device="phantom"):
    x = torch.arange(4.0, device=device)
    torch.testing.assert_close((x * 2).cpu(), torch.arange(4.0) * 2)


# --------------------------------------------------------------------------
# Python knobs
# --------------------------------------------------------------------------


def test_fault_injection_is_a_testing_tool_not_device_api():
    # The knobs live with the other testing helpers; the device module and
    # the package's top level keep only what a program running on the
    # device uses.
    import torch_phantom.testing

    assert torch_phantom.testing.faults is faults
    assert "faults" in torch_phantom.testing.__all__
    assert not hasattr(torch.phantom, "faults")
    assert not hasattr(torch_phantom, "faults")


def test_the_kth_allocation_is_an_injected_out_of_memory_error():
    keep = torch.ones(10, device="phantom")
    torch.phantom.synchronize()
    before = torch.phantom.memory_allocated()
    faults.fail_allocation(2)
    a = torch.empty(100, device="phantom")
    torch.empty(0, device="phantom")  # zero-size requests are not counted
    assert faults.armed()["allocation"] == 1
    with pytest.raises(torch.OutOfMemoryError, match=r"Injected.*fail_allocation\(2\)"):
        torch.empty(1000, device="phantom")
    del a
    assert torch.phantom.memory_allocated() == before
    assert faults.armed()["allocation"] is None  # one-shot
    torch.empty(1000, device="phantom")
    assert_device_works()
    assert keep.sum().item() == 10


@pytest.mark.requires_kernel_view(
    "counts kernels on the stream, which ops without a kernel view do not launch")
def test_the_kth_kernel_fails_naming_the_op_reported_once():
    x = torch.arange(6.0, device="phantom")
    torch.phantom.synchronize()
    faults.fail_kernel(1)
    with pytest.raises(RuntimeError, match=r"aten::mul.*injected.*fail_kernel\(1\)") as info:
        x * 2  # a queued kernel, reported by the next sync
        torch.phantom.synchronize()
    assert isinstance(info.value, torch.AcceleratorError)
    torch.phantom.synchronize()  # reported once; the stream was reset
    assert faults.armed()["kernel"] is None
    torch.testing.assert_close((x * 2).cpu(), torch.arange(6.0) * 2)


@pytest.mark.requires_kernel_view(
    "counts kernels on the stream, which ops without a kernel view do not launch")
def test_a_failed_kernel_found_by_a_copy_is_reported_once():
    x = torch.arange(6.0, device="phantom")
    torch.phantom.synchronize()
    faults.fail_kernel(1)
    y = x * 2
    with pytest.raises(torch.AcceleratorError, match="aten::mul"):
        y.cpu()
    torch.phantom.synchronize()


@pytest.mark.requires_kernel_view(
    "counts kernels on the stream, which ops without a kernel view do not launch")
def test_counters_count_a_step_from_reset():
    x = torch.ones(4, 4, device="phantom")
    torch.phantom.synchronize()
    faults.reset()
    assert faults.allocation_count() == 0 and faults.kernel_count() == 0
    y = x * 2  # one allocation, one kernel
    assert faults.allocation_count() == 1
    assert faults.kernel_count() == 1
    (y @ y).sum()
    assert faults.allocation_count() >= 3
    assert faults.kernel_count() >= 3
    faults.reset()
    assert faults.allocation_count() == 0 and faults.kernel_count() == 0


def test_inject_context_disarms_what_did_not_fire_and_restores_latency():
    with faults.inject(allocation=1000, kernel=1000, latency_us=5):
        assert faults.armed() == {"allocation": 1000, "kernel": 1000}
        assert faults.latency_us() == 5
    assert faults.armed() == {"allocation": None, "kernel": None}
    assert faults.latency_us() == 0
    with pytest.raises(torch.OutOfMemoryError, match=r"Injected.*fail_allocation\(1\)"):
        with faults.inject(allocation=1):
            torch.empty(10, device="phantom")


@pytest.mark.parametrize("call", [faults.fail_allocation, faults.fail_kernel,
                                  faults.set_latency_us])
def test_bad_knob_values_are_clear_errors(call):
    with pytest.raises(ValueError, match=call.__name__):
        call(-1)
    with pytest.raises(TypeError, match="expected an int"):
        call(1.5)
    with pytest.raises(TypeError, match="bool"):
        call(True)
    assert faults.armed() == {"allocation": None, "kernel": None}


def test_latency_above_the_limit_is_refused():
    with pytest.raises(ValueError, match="set_latency_us"):
        faults.set_latency_us(60_000_000)


# --------------------------------------------------------------------------
# Latency exposes missing synchronization
# --------------------------------------------------------------------------


@pytest.mark.no_race_detector(
    "reads a non_blocking copy's destination before its sync on purpose, which "
    "the detector reports (test_race_detector_copies.py)")
def test_latency_shows_a_missing_sync_before_reading_a_non_blocking_copy():
    x = torch.arange(1000.0, device="phantom")
    torch.phantom.synchronize()
    host = torch.zeros(1000, pin_memory=True)
    faults.set_latency_us(LATENCY_US)
    copy = x.clone()  # a queued kernel
    host.copy_(copy, non_blocking=True)
    # Without a sync the device is still busy and the host sees stale data.
    assert not torch.phantom.current_stream().query()
    assert host.sum().item() == 0
    torch.phantom.current_stream().synchronize()
    torch.testing.assert_close(host, torch.arange(1000.0))


def test_latency_shows_a_pinned_source_reused_before_its_copy_ran():
    src = torch.ones(1000, pin_memory=True)
    faults.set_latency_us(LATENCY_US)
    dst = torch.empty(1000, device="phantom")
    dst.copy_(src, non_blocking=True)
    src.fill_(2.0)  # the bug: reusing the buffer without waiting for the copy
    faults.set_latency_us(0)
    # The transfer ran after the refill: the device got the wrong data.
    torch.testing.assert_close(dst.cpu(), torch.full((1000,), 2.0))

    # With the synchronization the user forgot, it is right.
    src = torch.ones(1000, pin_memory=True)
    faults.set_latency_us(LATENCY_US)
    dst.copy_(src, non_blocking=True)
    torch.phantom.current_stream().synchronize()
    src.fill_(2.0)
    faults.set_latency_us(0)
    torch.testing.assert_close(dst.cpu(), torch.ones(1000))


# --------------------------------------------------------------------------
# Environment knobs (read once at start-up: a fresh interpreter each)
# --------------------------------------------------------------------------

ENV_KNOBS = """
import torch, torch_phantom
from torch_phantom.testing import faults
print("latency:", faults.latency_us())
a = torch.empty(10, device="phantom")  # allocation 1
try:
    torch.empty(10, device="phantom")  # allocation 2: fails
except torch.OutOfMemoryError as e:
    print("OOM:", e)
x = torch.empty(3, device="phantom")   # allocation 3: the knob has fired
x.fill_(1.0)                           # kernel 1: fails on the device
try:
    torch.phantom.synchronize()
except RuntimeError as e:
    print("ERR:", type(e).__name__, e)
x.fill_(3.0)                           # kernel 2: runs, after the latency
print("idle right after launch:", torch.phantom.current_stream().query())
torch.phantom.synchronize()
print("idle after sync:", torch.phantom.current_stream().query())
print("after:", x.sum().item())
"""


@pytest.mark.requires_kernel_view(
    "counts kernels on the stream, which ops without a kernel view do not launch")
def test_env_knobs_are_read_at_start_up():
    result = run_python(ENV_KNOBS, {
        "PHANTOM_FAULT_ALLOC": "2",
        "PHANTOM_FAULT_KERNEL": "1",
        "PHANTOM_FAULT_LATENCY_US": str(LATENCY_US),
    })
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"latency: {LATENCY_US}" in out, out
    assert "OOM:" in out and "PHANTOM_FAULT_ALLOC=2" in out, out
    assert "ERR: AcceleratorError" in out, out
    assert "aten::fill_" in out and "PHANTOM_FAULT_KERNEL=1" in out, out
    assert "idle right after launch: False" in out, out
    assert "idle after sync: True" in out, out
    assert "after: 9.0" in out, out


@pytest.mark.parametrize("variable, value", [
    ("PHANTOM_FAULT_ALLOC", "0"),
    ("PHANTOM_FAULT_KERNEL", "3 kernels"),
    ("PHANTOM_FAULT_LATENCY_US", "99999999999"),
])
def test_a_malformed_env_knob_is_a_clear_error_at_import(variable, value):
    # (The parser's rules are tested in tests/common/settings_test.cc.)
    result = run_python("import torch_phantom",
                        {variable: value, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode != 0
    # SettingError is a ValueError.
    assert f"torch_phantom._settings.SettingError: {variable}='{value}' is not " in \
        result.stderr, result.stderr[-2000:]


# --------------------------------------------------------------------------
# The sweep: every allocation and every kernel of a training step
# --------------------------------------------------------------------------


class TrainingStep:
    """A 2-layer MLP with Adam on phantom. ``run()`` is one step: batch to
    the device, forward, backward, optimizer step, gradients released; it
    returns the loss. ``restore()`` puts parameters and optimizer state back
    to a saved point in place, so every step can start from the same one."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        ).to("phantom")
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.x = torch.randn(4, 8)
        self.y = torch.randn(4, 1)
        self.run()  # creates Adam's state
        self.saved = [t.detach().cpu().clone() for t in self._state()]

    def _state(self):
        tensors = list(self.model.parameters())
        for state in self.opt.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v)]
        return tensors

    def run(self):
        x, y = self.x.to("phantom"), self.y.to("phantom")
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def restore(self):
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for tensor, saved in zip(self._state(), self.saved):
                tensor.copy_(saved)


@pytest.mark.requires_kernel_view(
    "counts kernels on the stream, which ops without a kernel view do not launch")
@pytest.mark.no_race_detector(
    "once torch.compile has run in the same process, the tensors of a step "
    "whose kernel failed are at times still held at the memory check, from "
    "C++ only (no Python referrer, the collector cannot free them), and let "
    "go moments later with nothing more from the test: most likely the "
    "failed step's autograd graph, let go by autograd's device thread, which "
    "under the detector takes the GIL at each op and free. The test has no "
    "deterministic point to wait for that thread")
def test_sweep_every_allocation_and_kernel_of_a_training_step():
    step = TrainingStep()
    step.restore()
    torch.phantom.synchronize()
    baseline = torch.phantom.memory_allocated()
    faults.reset()
    reference = step.run()
    n_alloc, n_kernel = faults.allocation_count(), faults.kernel_count()
    assert n_alloc > 0 and n_kernel > 0
    # The next reference step starts from the same point: same loss.
    step.restore()
    assert step.run() == reference

    failed_ops = set()
    for knob, count in (("allocation", n_alloc), ("kernel", n_kernel)):
        for k in range(1, count + 1):
            step.restore()
            faults.reset()
            if knob == "allocation":
                faults.fail_allocation(k)
            else:
                faults.fail_kernel(k)
            error = None
            try:
                step.run()
            except RuntimeError as e:  # kept as text: a traceback holds tensors
                error = (type(e), str(e))
            where = f"{knob} {k} of {count}"
            assert error is not None, f"{where}: the step did not fail"
            assert faults.armed()[knob] is None, f"{where}: the knob did not fire"
            kind, message = error
            if knob == "allocation":
                assert kind is torch.OutOfMemoryError, f"{where}: {kind.__name__}: {message}"
                assert f"fail_allocation({k})" in message, message
            else:
                assert issubclass(kind, torch.AcceleratorError), f"{where}: {message}"
                assert f"fail_kernel({k})" in message, message
                op = message.split("work '")[1].split("'")[0]
                assert op.startswith("aten::"), message
                failed_ops.add(op)
            # Recover as a user would: wait for the device (nothing more to
            # report), drop the half-made gradients.
            torch.phantom.synchronize()
            step.opt.zero_grad(set_to_none=True)
            # Under the race detector a failed op's tensors can be held by a
            # reference cycle until the collector runs: run it, so what is
            # measured is memory nothing can free.
            gc.collect()
            assert torch.phantom.memory_allocated() == baseline, where
            # The next step, undisturbed, computes what it should.
            step.restore()
            assert step.run() == reference, where
    # Every part of the step was hit: forward, backward and optimizer kernels
    # (Adam's update is one foreach kernel for the whole parameter list).
    assert {"aten::addmm", "aten::mm", "aten::_foreach_addcdiv_"} <= failed_ops, failed_ops
