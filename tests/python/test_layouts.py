"""Layouts and dtypes beyond dense strided tensors (docs/conformance.md,
"Layouts and dtypes").

- Jagged nested tensors (`layout=torch.jagged`) work: they are a Python
  subclass over dense tensors.
- Strided nested tensors work through ATen's device-generic nested
  kernels (test_nested_strided.py).
- Quantized tensors are not supported on phantom in torch 2.13: they need
  kernels registered for their own dispatch key (QuantizedPrivateUse1),
  and ATen registers its implementations for the CPU and CUDA keys only
  (the generic path's boxed fallback is for the PrivateUse1 key). The
  tests pin the exact error a user sees, at the call, and that the
  process goes on; what to do instead is in the docs.
- float8 (e4m3fn, e5m2 and the fnuz variants): casts, copies and the ops
  the CPU computes in float8 work; the ops the CPU refuses in float8 are
  refused at the call with the CPU's error (the native kernels decline
  float8, and the generic path's trial run raises the CPU kernel's dtype
  error), not later as a device error.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_phantom  # noqa: F401

P = torch.phantom
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def _components():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, generator=g), torch.randn(4, 3, generator=g)]


def test_jagged_nested_tensor_matches_the_cpu():
    cpu = torch.nested.nested_tensor(_components(), layout=torch.jagged)
    ph = torch.nested.nested_tensor(_components(), layout=torch.jagged, device="phantom")
    got = (ph + ph).sin()
    expected = (cpu + cpu).sin()
    assert got.device.type == "phantom"
    for g, e in zip(got.unbind(), expected.unbind()):
        torch.testing.assert_close(g.cpu(), e)


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the prototype-API warning of strided nested tensors
        yield


def test_quantized_tensors_are_refused_at_the_call():
    with pytest.raises(NotImplementedError,
                       match="Could not run 'aten::empty_strided' with arguments from the "
                             "'Quantizedphantom' backend"):
        torch.quantize_per_tensor(torch.randn(4, device="phantom"), 0.1, 0, torch.quint8)
    with pytest.raises(NotImplementedError,
                       match="Could not run 'aten::_empty_affine_quantized' with arguments "
                             "from the 'Quantizedphantom' backend"):
        torch._empty_affine_quantized([4], scale=0.1, zero_point=0, dtype=torch.quint8,
                                      device="phantom")
    with pytest.raises(NotImplementedError, match="'Quantizedphantom' backend"):
        torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8).to("phantom")
    P.synchronize()
    assert torch.ones(2, device="phantom").sum().item() == 2.0


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_casts_and_copies_match_the_cpu(dtype):
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1)) * 8
    ph = x.to("phantom").to(dtype)
    cpu = x.to(dtype)
    assert ph.dtype == dtype and ph.device.type == "phantom"
    torch.testing.assert_close(ph.cpu().float(), cpu.float(), rtol=0, atol=0)
    torch.testing.assert_close(ph.float().cpu(), cpu.float(), rtol=0, atol=0)
    torch.testing.assert_close(ph.t().contiguous().cpu().float(), cpu.t().contiguous().float(),
                               rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([ph, ph]).cpu().float(), torch.cat([cpu, cpu]).float(),
                               rtol=0, atol=0)


REFUSED_IN_FLOAT8 = {
    "add": lambda a: a + a,
    "sub": lambda a: a - a,
    "div": lambda a: a / a,
    "add_": lambda a: a.add_(a),
    "add out=": lambda a: torch.add(a, a, out=torch.empty_like(a)),
    "sum": torch.sum,
    "mean": torch.mean,
    "softmax": lambda a: torch.softmax(a, 0),
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
    "relu": torch.relu,
}


@pytest.mark.parametrize("name", sorted(REFUSED_IN_FLOAT8))
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_ops_the_cpu_refuses_are_refused_at_the_call(dtype, name):
    fn = REFUSED_IN_FLOAT8[name]
    x = torch.randn(3, 3).to(dtype)
    with pytest.raises(NotImplementedError) as cpu:
        fn(x.clone())
    message = str(cpu.value).split("\n")[0]
    with pytest.raises(NotImplementedError, match=message.replace('"', '.').replace("'", ".")):
        fn(x.to("phantom"))
    P.synchronize()  # nothing queued that fails later
