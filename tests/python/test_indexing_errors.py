"""Indexing errors arrive at the call, as on the CPU and CUDA.

Shape, broadcast and dtype checks of `index`, `index_put_`, masked
assignment and their relatives run on the host at the call
(ops/HostChecks.cpp): the call raises the CPU's exception with the CPU's
message, nothing is left queued that fails later, and the next operation
runs. Only checks that need the data (an index out of range, a source too
small for the mask's count) may surface at the next sync, as device-side
errors do on CUDA; then the error names the op and is reported once."""
import re

import pytest
import torch

import torch_phantom

P = torch.phantom
# Cases with uint8 masks warn (deprecated) on both devices, as they should.
pytestmark = pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8:UserWarning")


def _make(device):
    def f(*shape, dtype=torch.float32):
        g = torch.Generator().manual_seed(sum(shape) + 7)
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    def mask(*shape, dtype=torch.bool):
        n = torch.Size(shape).numel()
        return (torch.arange(n).reshape(shape) % 2 == 0).to(dtype).to(device)

    def long(*values):
        return torch.tensor(values).to(device)

    return f, mask, long


def _setitem(x, index, value):
    x[index] = value
    return x


# name -> call(f, mask, long); each raises on the CPU at the call without
# looking at index values.
REFUSED = {
    "setitem: mask count vs value shape":
        lambda f, m, L: _setitem(f(6), m(6), f(2)),
    "setitem: value dtype":
        lambda f, m, L: _setitem(f(6), m(6), f(3, dtype=torch.float64)),
    "setitem: long index vs value shape":
        lambda f, m, L: _setitem(f(5, 3), L(0, 1), f(3, 3)),
    "index_put_: mask":
        lambda f, m, L: f(6).index_put_((m(6),), f(4)),
    "index_put_: mask, accumulate":
        lambda f, m, L: f(6).index_put_((m(6),), f(4), accumulate=True),
    "index_put: mask (functional)":
        lambda f, m, L: torch.index_put(f(6), (m(6),), f(4)),
    "index_put_: uint8 mask":
        lambda f, m, L: f(6).index_put_((m(6, dtype=torch.uint8),), f(4)),
    "index_put_: long index vs value shape":
        lambda f, m, L: f(5, 3).index_put_((L(0, 1),), f(3, 3)),
    "index_put_: long index vs value shape, accumulate":
        lambda f, m, L: f(5, 3).index_put_((L(0, 1),), f(3, 3), accumulate=True),
    "index_put_: value dtype":
        lambda f, m, L: f(5).index_put_((L(0, 1),), f(2, dtype=torch.float64)),
    "index_put_: indices that do not broadcast":
        lambda f, m, L: f(5, 5).index_put_((L(0, 1), L(0, 1, 2)), f(2)),
    "index_put_: too many indices":
        lambda f, m, L: f(5).index_put_((L(0), L(0)), f(1)),
    "index_put_: float index":
        lambda f, m, L: f(5).index_put_((L(0.5),), f(1)),
    "index_put_: mask shape":
        lambda f, m, L: f(5, 3).index_put_((m(4),), f(1)),
    "getitem: mask shape":
        lambda f, m, L: f(5, 3)[m(4)],
    "masked_fill_: mask shape":
        lambda f, m, L: f(5).masked_fill_(m(4), 1.0),
    "masked_scatter_: source dtype":
        lambda f, m, L: f(5).masked_scatter_(m(5), f(5, dtype=torch.float64)),
    "put_: index and source sizes":
        lambda f, m, L: f(5).put_(L(0, 1), f(3)),
    "index_copy_: source shape":
        lambda f, m, L: f(5, 3).index_copy_(0, L(0, 1), f(3, 3)),
}


def _raise(call, device):
    with pytest.raises(Exception) as info:
        call(*_make(device))
    return info.value


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_at_the_call_with_the_cpus_error(name):
    call = REFUSED[name]
    expected = _raise(call, "cpu")
    got = _raise(call, "phantom")
    assert type(got) is type(expected), f"phantom raised {got!r}, the CPU {expected!r}"
    assert str(got).split("\n")[0] == str(expected).split("\n")[0]
    # Nothing was queued that fails later, and the next operation runs.
    P.synchronize()
    assert torch.ones(2, device="phantom").sum().item() == 2.0


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_again_after_a_good_call_with_the_same_shapes(name):
    """A remembered call signature must not let a later bad call through:
    the same call with a good value first, then the bad one."""
    f, m, L = _make("phantom")
    if name.startswith(("setitem: mask count", "index_put_: mask", "index_put: mask")):
        x = f(6)
        x[m(6)] = f(3)  # 3 True of 6: fits
        P.synchronize()
    with pytest.raises(Exception, match=re.escape(str(_raise(REFUSED[name], "cpu")).split("\n")[0])):
        REFUSED[name](f, m, L)
    P.synchronize()


def test_mask_count_is_checked_at_every_call():
    """The value fits the first mask and not the second one of the same
    shape: the check is about the data, so no call is remembered as safe."""
    x = torch.zeros(6, device="phantom")
    first = torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool, device="phantom")
    second = torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bool, device="phantom")
    value = torch.tensor([5.0, 6.0], device="phantom")
    for _ in range(3):
        x[first] = value
    with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[2\] "
                                           r"cannot be broadcast to indexing result of shape \[3\]"):
        x[second] = value
    P.synchronize()
    assert x.tolist() == [5.0, 6.0, 0.0, 0.0, 0.0, 0.0]


def test_the_issue_example_raises_at_the_call_and_the_next_op_runs():
    b = torch.randn(5, device="phantom")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        b[b > -100] = torch.tensor([1.0, 2.0, 3.0], device="phantom")
    P.synchronize()
    assert torch.arange(4.0, device="phantom").sum().item() == 6.0


GOOD = {
    "setitem: mask, tensor value": lambda f, m, L: _setitem(f(6), m(6), f(3)),
    "setitem: mask, scalar": lambda f, m, L: _setitem(f(6), m(6), 2.5),
    "setitem: 2-d mask of a 3-d tensor": lambda f, m, L: _setitem(f(2, 3, 4), m(2, 3), f(3, 4)),
    "setitem: long index": lambda f, m, L: _setitem(f(5, 3), L(4, 0), f(2, 3)),
    "index_put_: accumulate, repeated index":
        lambda f, m, L: f(5).index_put_((L(1, 1, 3),), f(3), accumulate=True),
    "index_put_: mask, accumulate": lambda f, m, L: f(6).index_put_((m(6),), f(3), accumulate=True),
    "index_put: functional": lambda f, m, L: torch.index_put(f(5, 2), (L(0, 4),), f(2)),
    "getitem: mask": lambda f, m, L: f(5, 3)[m(5)],
    "getitem: mask and long": lambda f, m, L: f(4, 3)[m(4), L(0, 2)],
    "put_": lambda f, m, L: f(5).put_(L(0, 4), f(2)),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_indexing_matches_the_cpu(name):
    expected = GOOD[name](*_make("cpu"))
    got = GOOD[name](*_make("phantom"))
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.requires_kernel_view(
    "checks work left queued on the stream; without a kernel view the op runs at the call")
def test_mask_with_one_value_is_queued_not_waited():
    """`x[mask] = 1.0`: one value fits any count of True, so nothing needs
    the data and the call is queued."""
    x = torch.zeros(6, device="phantom")
    mask = torch.tensor([1, 0, 1, 0, 1, 0], dtype=torch.bool, device="phantom")
    x[mask] = 1.0  # first call: the signature's trial run
    torch_phantom.reset_ops_report()
    x[mask] = 2.0
    rows = {r["op"]: r for r in torch_phantom.ops_report()}
    assert rows["aten::_index_put_impl_"]["async"] == 1
    assert rows["aten::_index_put_impl_"]["sync"] == 0
    assert x.tolist() == [2.0, 0.0, 2.0, 0.0, 2.0, 0.0]


@pytest.mark.requires_kernel_view(
    "counts the waits of queued masked ops; without a kernel view every op waits")
def test_a_mask_with_a_tensor_value_waits_as_cuda_syncs():
    x = torch.zeros(6, device="phantom")
    mask = torch.tensor([1, 0, 1, 0, 1, 0], dtype=torch.bool, device="phantom")
    torch_phantom.reset_ops_report()
    x[mask] = torch.tensor([1.0, 2.0, 3.0], device="phantom")
    rows = {r["op"]: r for r in torch_phantom.ops_report()}
    assert rows["aten::_index_put_impl_"]["sync"] == 1
    assert "boolean mask" in rows["aten::_index_put_impl_"]["sync_reason"]


# Checks that need the index values: late, as a device-side error on CUDA.
DATA_ERRORS = {
    "index out of range": (lambda f, m, L: f(5)[L(7)], "aten::index",
                           "index 7 is out of bounds"),
    "take out of range": (lambda f, m, L: f(5).take(L(9)), "aten::take", "out of range"),
    "masked_scatter_ source smaller than the mask's count":
        (lambda f, m, L: f(5).masked_scatter_(m(5), f(2)), "aten::masked_scatter_",
         "Number of elements of source"),
}


@pytest.mark.parametrize("name", sorted(DATA_ERRORS))
@pytest.mark.requires_kernel_view(
    "without a kernel view the op runs at the call on host copies, so its error is raised there, not by a later sync")
def test_data_dependent_errors_surface_at_the_next_sync_once(name):
    call, op, message = DATA_ERRORS[name]
    with pytest.raises(Exception) as cpu:
        call(*_make("cpu"))
    assert message in str(cpu.value)
    call(*_make("phantom"))
    with pytest.raises(torch.AcceleratorError, match=f"'{op}' failed.*{re.escape(message)}"):
        P.synchronize()
    # Reported once: the stream goes on.
    P.synchronize()
    assert torch.ones(3, device="phantom").sum().item() == 3.0
