"""Op semantics that phantom's generic path must keep exactly as the CPU has
them: errors the CPU raises, the kernel the CPU runs, and tensor metadata a
kernel changes. Each test is the regression test of a conformance bug once
listed in tests/conformance/expected_failures.json (the BUG-* ids are in
docs/conformance.md); the CPU, run on the same inputs, is the oracle.
"""

import pytest
import torch

from conftest import run_python


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=gen(seed)).to(dtype)


def raised(fn, *args):
    """The exception ``fn(*args)`` raises (None if it returns), after the
    device has run everything that was queued, so a deferred error counts."""
    try:
        fn(*args)
        torch.phantom.synchronize()
    except Exception as error:  # noqa: BLE001 - compared with the CPU's
        return error
    return None


# --------------------------------------------------------------------------
# BUG-B: an in-place op whose result broadcasts to a larger shape raises the
# CPU's error and leaves self untouched (it used to resize self silently).
# --------------------------------------------------------------------------

BROADCASTING_INPLACE = {
    "logical_and_": (lambda a, b: a.logical_and_(b), [(3,), (2, 3)]),
    "logical_or_": (lambda a, b: a.logical_or_(b), [(3,), (2, 3)]),
    "logical_xor_": (lambda a, b: a.logical_xor_(b), [(3,), (2, 3)]),
    "ldexp_": (lambda a, b: a.ldexp_(b), [(3,), (2, 3)]),
    "addr_0d_self": (lambda a, b, c: a.addr_(b, c), [(), (2,), (3,)]),
    "addr_1d_self": (lambda a, b, c: a.addr_(b, c, beta=2, alpha=3), [(3,), (2,), (3,)]),
}


@pytest.mark.parametrize("name", sorted(BROADCASTING_INPLACE))
def test_inplace_op_does_not_resize_self(name):
    fn, shapes = BROADCASTING_INPLACE[name]
    cpu_args = [randn(*shape, seed=i) for i, shape in enumerate(shapes)]
    expected = raised(fn, *[a.clone() for a in cpu_args])
    assert expected is not None, "the CPU accepts this call; the test is void"

    args = [a.to("phantom") for a in cpu_args]
    actual = raised(fn, *args)
    assert actual is not None, (
        f"phantom accepted {name} and made self {tuple(args[0].shape)}; "
        f"the CPU raises: {expected}"
    )
    assert type(actual) is type(expected)
    assert str(actual).splitlines()[0] == str(expected).splitlines()[0]
    # self is untouched: same shape, same values.
    assert args[0].shape == cpu_args[0].shape
    torch.testing.assert_close(args[0].cpu(), cpu_args[0], rtol=0, atol=0)


# --------------------------------------------------------------------------
# BUG-F: addr runs the CPU's fused kernel, not the decomposition ATen
# registers for other backends (1 ulp off on float16/bfloat16).
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["functional", "out", "inplace"])
def test_addr_half_types_match_cpu_bitwise(dtype, form):
    s, v1, v2 = randn(16, 16, dtype=dtype), randn(16, seed=1, dtype=dtype), randn(16, seed=2, dtype=dtype)
    beta, alpha = 0.3, 1.7
    expected = torch.addr(s, v1, v2, beta=beta, alpha=alpha)
    stepwise = beta * s + alpha * torch.outer(v1, v2)  # ATen's math_addr
    assert not torch.equal(expected, stepwise), "inputs do not tell the two apart"

    ps, pv1, pv2 = s.to("phantom"), v1.to("phantom"), v2.to("phantom")
    if form == "functional":
        actual = torch.addr(ps, pv1, pv2, beta=beta, alpha=alpha)
    elif form == "out":
        out = torch.empty(0, dtype=dtype, device="phantom")
        actual = torch.addr(ps, pv1, pv2, beta=beta, alpha=alpha, out=out)
        assert actual is out
    else:
        actual = ps.addr_(pv1, pv2, beta=beta, alpha=alpha)
        assert actual is ps
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


# --------------------------------------------------------------------------
# BUG-E: mode(out=) works (its only kernel refused every device but
# CPU/CUDA/XPU).
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_mode_out(dtype):
    x = torch.randint(0, 3, (5, 7), generator=gen(0)).to(dtype)
    cpu_values, cpu_indices = torch.mode(x, 1)
    values = torch.empty(0, dtype=dtype, device="phantom")
    indices = torch.empty(0, dtype=torch.long, device="phantom")
    result = torch.mode(x.to("phantom"), 1, out=(values, indices))
    assert result.values is values and result.indices is indices
    torch.testing.assert_close(values.cpu(), cpu_values, rtol=0, atol=0)
    torch.testing.assert_close(indices.cpu(), cpu_indices, rtol=0, atol=0)


# --------------------------------------------------------------------------
# BUG-D: complex conj_physical_ and svd(out=) ("DispatchStub: missing kernel
# for phantom").
# --------------------------------------------------------------------------


def complex_matrix(*shape, seed=0):
    return torch.complex(randn(*shape, seed=seed), randn(*shape, seed=seed + 1))


def test_conj_physical_inplace_complex():
    z = complex_matrix(4, 5)
    pz = z.to("phantom")
    result = pz.conj_physical_()
    assert result is pz
    assert not pz.is_conj()
    torch.testing.assert_close(pz.cpu(), z.conj_physical(), rtol=0, atol=0)


def test_svd_out_complex():
    z = complex_matrix(4, 3)
    expected = torch.svd(z)
    outs = tuple(
        torch.empty(0, dtype=dtype, device="phantom")
        for dtype in (torch.complex64, torch.float32, torch.complex64)
    )
    result = torch.svd(z.to("phantom"), out=outs)
    for got, out in zip(result, outs):
        assert got is out
    for got, want in zip(outs, expected):
        torch.testing.assert_close(got.cpu(), want)


# --------------------------------------------------------------------------
# BUG-G: linalg.lu_solve with left=False on complex leaves its result lazily
# conjugated; phantom lost that bit and returned the conjugate answer.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve_right_side_complex(adjoint):
    a, b = complex_matrix(3, 3), complex_matrix(2, 3, seed=5)
    lu, pivots = torch.linalg.lu_factor(a)
    expected = torch.linalg.lu_solve(lu, pivots, b, left=False, adjoint=adjoint)
    assert not torch.allclose(expected, expected.conj()), "answer is real"
    args = (lu.to("phantom"), pivots.to("phantom"), b.to("phantom"))

    actual = torch.linalg.lu_solve(*args, left=False, adjoint=adjoint)
    torch.testing.assert_close(actual.cpu(), expected)

    cpu_out = torch.empty(0, dtype=torch.complex64)
    torch.linalg.lu_solve(lu, pivots, b, left=False, adjoint=adjoint, out=cpu_out)
    out = torch.empty(0, dtype=torch.complex64, device="phantom")
    result = torch.linalg.lu_solve(*args, left=False, adjoint=adjoint, out=out)
    assert result is out
    assert out.is_conj() == cpu_out.is_conj()
    torch.testing.assert_close(out.cpu(), expected)

    # An out= of the right shape is not resized, so the call signature
    # repeats: its later calls must not be queued without the conj bit.
    for _ in range(3):
        out = torch.empty(2, 3, dtype=torch.complex64, device="phantom")
        torch.linalg.lu_solve(*args, left=False, adjoint=adjoint, out=out)
        assert out.is_conj() == cpu_out.is_conj()
        torch.testing.assert_close(out.cpu(), expected)


# --------------------------------------------------------------------------
# A reduced mse_loss or smooth_l1_loss warned on phantom ("An output with one
# or more elements was resized") at every call, on the host and then from
# the worker; on the CPU it never does. Its composite called the .out op.
# --------------------------------------------------------------------------


def test_reduced_losses_warn_no_more_than_on_the_cpu():
    # In a child: the worker's warnings go to stderr, not to Python.
    code = """
import warnings, torch, torch_phantom
import torch.nn.functional as F
warnings.simplefilter("error")  # a warning at the call fails the child
x = torch.rand(8, 2, generator=torch.Generator().manual_seed(0))
y = torch.rand(8, 2, generator=torch.Generator().manual_seed(1))
for loss in (F.mse_loss, F.smooth_l1_loss):
    for reduction in ("mean", "sum"):
        expected = loss(x, y, reduction=reduction)
        for _ in range(4):  # the first calls and the remembered ones
            got = loss(x.to("phantom"), y.to("phantom"), reduction=reduction)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
torch.phantom.synchronize()
print("ok")
"""
    result = run_python(code)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
    assert "was resized" not in result.stderr, result.stderr


def test_fixes_hold_on_the_synchronous_path():
    # PHANTOM_SYNC_GENERIC=1 sends every generic op down the waiting half.
    code = """
import torch, torch_phantom
a = torch.ones(3, dtype=torch.bool, device="phantom")
b = torch.ones(2, 3, dtype=torch.bool, device="phantom")
try:
    a.logical_and_(b)
except RuntimeError as e:
    assert "doesn't match the broadcast shape" in str(e), e
else:
    raise AssertionError("logical_and_ resized self to %s" % (tuple(a.shape),))
assert a.shape == (3,)
x = torch.tensor([[1.0, 2.0, 2.0]], device="phantom")
v, i = torch.empty(0, device="phantom"), torch.empty(0, dtype=torch.long, device="phantom")
torch.mode(x, 1, out=(v, i))
assert v.cpu().tolist() == [2.0], v
print("ok")
"""
    result = run_python(code, extra_env={"PHANTOM_SYNC_GENERIC": "1"})
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
