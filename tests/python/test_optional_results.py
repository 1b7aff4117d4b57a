"""Ops with a `Tensor?` result on the generic path (ops/AsyncFallback.cpp).

Whether such a result is None is decided by the arguments (fbgemm's
permute_2D_sparse_data returns None for the weights when it is given none),
so the host knows it ahead, as it knows a tensor result's shape: the call is
queued, not waited for. Each op here is defined with torch.library (a CPU
kernel and a Meta kernel) and compared with its own CPU answer."""
import pytest
import torch

import torch_phantom

pytestmark = pytest.mark.requires_kernel_view(
    "checks that generic ops are queued, which needs the kernel view")


def _paths(op):
    """(queued, waited) generic-path calls of `op` since the last reset."""
    rows = [r for r in torch_phantom.ops_report() if r["op"] == op]
    return (sum(r["async"] for r in rows), sum(r["sync"] for r in rows))


def _scale_and_shift_op():
    """`phantom_test_optional::scale(x, shift) -> (x * 2, shift + 1 or None)`."""
    lib = torch.library.Library("phantom_test_optional", "DEF")
    lib.define("scale(Tensor x, Tensor? shift) -> (Tensor, Tensor?)")

    def cpu(x, shift):
        return x * 2, (None if shift is None else shift + 1)

    def meta(x, shift):
        return torch.empty_like(x), (None if shift is None else torch.empty_like(shift))

    lib.impl("scale", cpu, "CPU")
    lib.impl("scale", meta, "Meta")
    return lib, torch.ops.phantom_test_optional.scale


def test_a_none_or_tensor_result_is_queued_and_matches_the_cpu():
    lib, scale = _scale_and_shift_op()
    x = torch.arange(6.0).reshape(2, 3)
    shift = torch.tensor([0.5, -1.5])
    torch_phantom.reset_ops_report()
    for _ in range(3):  # the first call of each signature, then remembered ones
        doubled, none = scale(x.to("phantom"), None)
        assert none is None
        assert torch.equal(doubled.cpu(), x * 2)
        doubled, shifted = scale(x.to("phantom"), shift.to("phantom"))
        assert shifted.device.type == "phantom"
        assert torch.equal(doubled.cpu(), x * 2)
        assert torch.equal(shifted.cpu(), shift + 1)
    assert _paths("phantom_test_optional::scale") == (6, 0)
    del lib


def test_a_none_result_keeps_the_later_results_in_place():
    # The None result sits between two tensors: the queued work must write
    # the CPU's third result into the third output, not the second.
    lib = torch.library.Library("phantom_test_optional_middle", "DEF")
    lib.define("split(Tensor x) -> (Tensor, Tensor?, Tensor)")
    lib.impl("split", lambda x: (x + 1, None, x * 10), "CPU")
    lib.impl("split", lambda x: (torch.empty_like(x), None, torch.empty_like(x)), "Meta")
    x = torch.tensor([1.0, 2.0, 3.0])
    torch_phantom.reset_ops_report()
    for _ in range(2):
        first, none, last = torch.ops.phantom_test_optional_middle.split(x.to("phantom"))
        assert none is None
        assert torch.equal(first.cpu(), x + 1)
        assert torch.equal(last.cpu(), x * 10)
    assert _paths("phantom_test_optional_middle::split") == (2, 0)
    del lib
