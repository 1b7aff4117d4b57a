"""A warning a kernel raises appears once, at the call, in the caller's
thread, whichever path the op took on phantom (device/hostexec/KernelWarnings.cpp):

- the asynchronous half, first call of a call signature (the trial run's
  warnings) and later, remembered calls (queued without a trial);
- the asynchronous half with a C++ Meta kernel (the Meta kernel's);
- the synchronous half, the kernel run on the calling thread or, when the
  stream is busy, on the stream's worker;
- a native kernel.

The OpInfo conformance suite compares every sample's warnings with the
CPU's (tests/conformance, docs/conformance.md); these tests pin each path.
TORCH_WARN_ONCE warnings are turned into per-call ones here
(`torch.set_warn_always`) so that counts do not depend on test order."""
import os
import warnings

import pytest
import torch

import torch_phantom
from conftest import run_python, slow_kernel_on

P = torch.phantom
HERE = os.path.abspath(__file__)


@pytest.fixture(autouse=True)
def _warn_always():
    previous = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    yield
    torch.set_warn_always(previous)


def _warnings_of(fn, device, calls=3):
    """[(messages of call 1), (messages of call 2), ...] for `fn(device)`,
    each recorded at the call (phantom synchronized after each call, so a
    warning delivered late would land in the next call's list)."""
    per_call = []
    for _ in range(calls):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(device)
        if device == "phantom":
            P.synchronize()
        per_call.append([str(w.message).split(" (Triggered internally")[0] for w in caught])
    return per_call


def _mask(device, dtype=torch.uint8):
    return torch.tensor([1, 0, 1, 0], dtype=dtype, device=device)


def _setitem(x, index, value):
    x[index] = value
    return x


CASES = {
    # synchronous half: the mask is counted on the device
    "x[uint8 mask]": lambda d: torch.arange(4.0, device=d)[_mask(d)],
    "x[uint8 mask] = tensor": lambda d: _setitem(torch.zeros(4, device=d), _mask(d),
                                                 torch.ones(2, device=d)),
    # asynchronous half, trial run then remembered calls
    "std, no degrees of freedom": lambda d: torch.ones(1, 3, device=d).std(0),
    "cumsum into a wrongly sized out=": lambda d: torch.cumsum(
        torch.ones(3, device=d), 0, out=torch.empty(2, device=d)),
    "sort into wrongly sized out=": lambda d: torch.sort(
        torch.ones(3, device=d),
        out=(torch.empty(2, device=d), torch.empty(2, dtype=torch.long, device=d))),
    "index_put_ into an expanded tensor": lambda d: torch.zeros(1, device=d).expand(4).index_put_(
        (torch.tensor([0], device=d),), torch.ones(1, device=d)),
    "index_reduce (warns in the kernel's body)": lambda d: torch.zeros(3, device=d).index_reduce(
        0, torch.tensor([0, 1], device=d), torch.ones(2, device=d), "prod"),
    # asynchronous half, C++ Meta kernel
    "scatter(reduce=) into out=": lambda d: torch.scatter(
        torch.zeros(3, device=d), 0, torch.tensor([0, 1], device=d), torch.ones(2, device=d),
        reduce="add", out=torch.zeros(3, device=d)),
    # composite ops that run the meta function on phantom tensors
    "scatter(reduce=)": lambda d: torch.zeros(3, device=d).scatter(
        0, torch.tensor([0, 1], device=d), torch.ones(2, device=d), reduce="add"),
    "cholesky (deprecated)": lambda d: torch.cholesky(torch.eye(2, device=d)),
    # native kernel
    "add into a wrongly sized out=": lambda d: torch.add(
        torch.ones(3, device=d), 1, out=torch.empty(2, device=d)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_warns_once_per_call_like_the_cpu(name):
    cpu = _warnings_of(CASES[name], "cpu")
    assert all(cpu), f"the case must warn on the CPU: {cpu}"
    phantom = _warnings_of(CASES[name], "phantom")
    assert phantom == cpu


@pytest.mark.parametrize("name", sorted(CASES))
def test_warning_points_at_the_callers_line(name):
    """Raised on the calling thread while the call returns: Python
    attributes it to the line that made the call, as on the CPU."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CASES[name]("phantom")
    assert caught
    for w in caught:
        assert (w.filename, w.lineno) != ("", 0)
        assert os.path.abspath(w.filename) == HERE


@pytest.mark.requires_kernel_view(
    "checks work left queued on the stream; without a kernel view the op runs at the call")
def test_remembered_call_is_queued_and_still_warns():
    x = torch.ones(1, 3, device="phantom")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x.std(0)  # the signature's trial run
    torch_phantom.reset_ops_report()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x.std(0)
    rows = {r["op"]: r for r in torch_phantom.ops_report()}
    assert rows["aten::std"]["async"] == 1 and rows["aten::std"]["sync"] == 0
    assert [str(w.message).startswith("std(): degrees of freedom is <= 0") for w in caught] == [True]


def test_waited_call_on_a_busy_stream_warns_at_the_call():
    """With work pending, the synchronous half's kernel runs on the
    stream's worker thread: its warning still comes back to the caller."""
    values = torch.arange(4.0, device="phantom")
    mask = _mask("phantom")
    slow_kernel_on(P.current_stream(), microseconds=50000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values[mask]
    assert len(caught) == 1
    assert "indexing with dtype torch.uint8 is now deprecated" in str(caught[0].message)


def test_once_warning_is_not_repeated_at_remembered_calls():
    """TORCH_WARN_ONCE raises once per process: the trial run spends it,
    and the signature's later calls must not raise it again."""
    code = """
import warnings, torch, torch_phantom
def call(device):
    torch.zeros(3, device=device).index_reduce(
        0, torch.tensor([0, 1], device=device), torch.ones(2, device=device), "amax")
counts = []
for _ in range(3):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call("phantom")
    counts.append(len(caught))
for _ in range(2):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call("cpu")
    counts.append(len(caught))
print(counts)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    # Once in the process, on phantom's first call; the CPU's calls after it
    # do not warn either: one process, one warning.
    assert result.stdout.strip() == "[1, 0, 0, 0, 0]"


def test_no_warning_is_printed_by_a_worker_thread():
    """Queued kernels raise their warnings on the stream's worker, whose
    handler prints them to stderr: they were delivered at the call, so
    nothing is printed there."""
    code = """
import warnings, torch, torch_phantom
warnings.simplefilter("ignore")
torch.set_warn_always(True)
for _ in range(3):
    torch.ones(1, 3, device="phantom").std(0)
    torch.zeros(1, device="phantom").expand(4).index_put_(
        (torch.tensor([0], device="phantom"),), torch.ones(1, device="phantom"))
    torch.zeros(3, device="phantom").index_reduce(
        0, torch.tensor([0, 1], device="phantom"), torch.ones(2, device="phantom"), "prod")
    torch.scatter(torch.zeros(3, device="phantom"), 0, torch.tensor([0, 1], device="phantom"),
                  torch.ones(2, device="phantom"), reduce="add", out=torch.zeros(3, device="phantom"))
torch.phantom.synchronize()
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "Warning:" not in result.stderr, result.stderr
