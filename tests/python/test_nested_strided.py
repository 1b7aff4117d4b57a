"""Strided nested tensors (`torch.nested.nested_tensor`, the default
layout) on phantom: made, moved, computed on and differentiated as on
the CPU (docs/conformance.md, "Layouts and dtypes").

Their ops run by ATen's device-generic nested kernels over the phantom
buffer (ops/NestedTensors.cpp), so the buffer work is queued on the
stream like any op; the few ops whose only kernel reads the data on the
host are refused at the call, saying what to use instead."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_phantom  # noqa: F401

P = torch.phantom


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the prototype-API warning of strided nested tensors
        yield


def _components(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, generator=g, dtype=dtype),
            torch.randn(4, 3, generator=g, dtype=dtype),
            torch.randn(1, 3, generator=g, dtype=dtype)]


def _pair(**kwargs):
    cpu = torch.nested.nested_tensor(_components(), **kwargs)
    ph = torch.nested.nested_tensor(_components(), device="phantom", **kwargs)
    return cpu, ph


def _assert_same(ph, cpu):
    assert ph.is_nested and ph.device.type == "phantom"
    got = ph.cpu()
    assert got.is_nested
    assert len(got.unbind()) == len(cpu.unbind())
    for g, e in zip(got.unbind(), cpu.unbind()):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_made_on_and_moved_to_and_from_phantom():
    cpu = torch.nested.nested_tensor(_components())
    moved = cpu.to("phantom")
    _assert_same(moved, cpu)
    _assert_same(torch.nested.nested_tensor(_components(), device="phantom"), cpu)
    assert moved.unbind()[1].device.type == "phantom"
    assert moved.unbind()[1].shape == (4, 3)
    _assert_same(moved.clone(), cpu)


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
    "sqrt of abs": lambda t: t.abs().sqrt(),
    "softmax": lambda t: t.softmax(-1),
    "layer_norm": lambda t: F.layer_norm(t, (3,), torch.full((3,), 1.5, device=t.device),
                                         torch.full((3,), 0.25, device=t.device)),
    "masked_fill": lambda t: t.masked_fill(t > 0, 0.5),
    "transpose": lambda t: t.transpose(1, 2).contiguous(),
    "unsqueeze": lambda t: t.unsqueeze(-1),
    "to_padded_tensor": lambda t: torch.nested.to_padded_tensor(t, -1.0),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_match_the_cpu(name):
    cpu, ph = _pair()
    fn = UNARY[name]
    expected, got = fn(cpu), fn(ph)
    if expected.is_nested:
        _assert_same(got, expected)
    else:
        assert got.device.type == "phantom"
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_binary_ops_and_scalars_match_the_cpu():
    cpu, ph = _pair()
    _assert_same((ph + ph) * 2 - ph / 3, (cpu + cpu) * 2 - cpu / 3)
    _assert_same(ph * ph, cpu * cpu)
    _assert_same(torch.matmul(ph, ph.transpose(1, 2)), torch.matmul(cpu, cpu.transpose(1, 2)))


def test_in_place_ops_change_the_phantom_buffer():
    cpu, ph = _pair()
    ph.mul_(3).add_(ph)
    cpu.mul_(3).add_(cpu)
    _assert_same(ph, cpu)
    ph.zero_()
    assert all(c.abs().sum().item() == 0 for c in ph.cpu().unbind())


def test_linear_layer_and_gradients_match_the_cpu():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 5)
    layer_ph = torch.nn.Linear(3, 5).to("phantom")
    layer_ph.load_state_dict(layer.state_dict())
    cpu = torch.nested.nested_tensor(_components(), requires_grad=True)
    ph = torch.nested.nested_tensor(_components(), device="phantom", requires_grad=True)
    loss_cpu = torch.nested.to_padded_tensor(F.gelu(layer(cpu)).softmax(-1), 0.0).pow(2).sum()
    loss_ph = torch.nested.to_padded_tensor(F.gelu(layer_ph(ph)).softmax(-1), 0.0).pow(2).sum()
    loss_cpu.backward()
    loss_ph.backward()
    torch.testing.assert_close(loss_ph.cpu(), loss_cpu, rtol=0, atol=0)
    _assert_same(ph.grad, cpu.grad)
    torch.testing.assert_close(layer_ph.weight.grad.cpu(), layer.weight.grad, rtol=0, atol=0)


def test_layer_norm_and_its_gradients_match_the_cpu():
    norm = torch.nn.LayerNorm(3)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    norm_ph = torch.nn.LayerNorm(3).to("phantom")
    norm_ph.load_state_dict(norm.state_dict())
    cpu = torch.nested.nested_tensor(_components(), requires_grad=True)
    ph = torch.nested.nested_tensor(_components(), device="phantom", requires_grad=True)
    out_cpu, out_ph = norm(cpu), norm_ph(ph)
    _assert_same(out_ph.detach(), out_cpu.detach())
    torch.nested.to_padded_tensor(out_cpu, 0.0).pow(3).sum().backward()
    torch.nested.to_padded_tensor(out_ph, 0.0).pow(3).sum().backward()
    _assert_same(ph.grad, cpu.grad)
    torch.testing.assert_close(norm_ph.weight.grad.cpu(), norm.weight.grad, rtol=0, atol=0)
    torch.testing.assert_close(norm_ph.bias.grad.cpu(), norm.bias.grad, rtol=0, atol=0)
    with pytest.raises(ValueError, match="NestedTensor layer_norm requires weight and bias"):
        F.layer_norm(ph, (3,))


def test_nested_tensor_from_a_padding_mask():
    padded = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    expected = torch._nested_tensor_from_mask(padded, mask)
    got = torch._nested_tensor_from_mask(padded.to("phantom"), mask.to("phantom"))
    _assert_same(got, expected)


@pytest.mark.requires_kernel_view("without one, every op runs on host copies and waits")
def test_ops_do_not_wait_for_the_device():
    """The buffer work is queued, not run on the host: under the sync
    debug mode "error" a chain of nested ops raises nothing."""
    _, ph = _pair()
    P.set_sync_debug_mode("error")
    try:
        out = torch.nested.to_padded_tensor((ph + ph).relu().softmax(-1), 0.0)
    finally:
        P.set_sync_debug_mode(0)
    assert out.device.type == "phantom" and out.shape == (3, 4, 3)


def test_ops_whose_kernel_reads_the_host_are_refused_at_the_call():
    _, ph = _pair()
    with pytest.raises(NotImplementedError,
                       match=r"aten::bmm is not supported on strided nested tensors on "
                             r"phantom: .* Use torch.matmul"):
        torch.bmm(ph, ph.transpose(1, 2))
    with pytest.raises(NotImplementedError,
                       match=r"aten::sum.dim_IntList is not supported .* to_padded_tensor"):
        ph.sum(-1)
    # The process goes on, and the tensor is intact.
    torch.testing.assert_close(ph.unbind()[1].cpu(), _components()[1], rtol=0, atol=0)


def test_a_nested_tensor_of_another_device_is_refused_at_the_call():
    cpu, ph = _pair()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        ph + cpu
    _assert_same(ph + ph, cpu + cpu)
