"""The direct loop of the native add, mul and div (ops/Elementwise.cpp):
float and double operands of one dtype and shape, or a CPU scalar, up to
the CPU kernel's grain size, computed element by element on the worker
without a TensorIterator. Every form the loop takes must give the CPU's
bits: tensor with tensor, tensor with scalar and scalar with tensor,
in-place (the output is an input), out=, scalars of every Python and
0-dim CPU type (each converted once to the op's dtype, as the CPU does),
non-finite values, sizes on both sides of the grain size, and inside a
graph replay, which is where the loop matters most."""
import pytest
import torch

pytestmark = pytest.mark.requires_kernel_view(
    "the direct loop runs over the kernel view")

GRAIN = 32768  # at::internal::GRAIN_SIZE: above it the CPU kernel is used


def _bits_equal(got, want):
    """Bit for bit, NaNs compared by position (a NaN's payload is the
    hardware's, not the op's)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    ints = torch.int32 if want.dtype == torch.float32 else torch.int64
    assert torch.equal(got[~nan].view(ints), want[~nan].view(ints))


def _values(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 1e3
    x[:: 7] = torch.randn(len(x[:: 7]), generator=g, dtype=torch.float64) * 1e-40
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45,
                            3.4e38, -3.4e38], dtype=torch.float64)
    x[: min(n, len(special))] = special[: min(n, len(special))]
    return x.to(dtype)


OPS = {
    "add": lambda a, b: torch.add(a, b),
    "mul": lambda a, b: torch.mul(a, b),
    "div": lambda a, b: torch.div(a, b),
    "operator+": lambda a, b: a + b,
    "operator*": lambda a, b: a * b,
    "operator/": lambda a, b: a / b,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 17, 1000, GRAIN, GRAIN + 1])
@pytest.mark.parametrize("op", sorted(OPS))
def test_tensor_with_tensor_matches_the_cpu_bit_for_bit(op, n, dtype):
    a, b = _values(n, dtype, 1), _values(n, dtype, 2).flip(0)
    want = OPS[op](a, b)
    _bits_equal(OPS[op](a.to("phantom"), b.to("phantom")).cpu(), want)


SCALARS = [0.1, -3.0, 1e300, float("nan"), float("inf"), 7, -2, 2 ** 60 + 1, 2 ** 24 + 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
@pytest.mark.parametrize("op", sorted(OPS))
def test_tensor_with_a_python_scalar_on_either_side_matches_the_cpu(op, scalar, dtype):
    a = _values(1000, dtype, 3)
    d = a.to("phantom")
    _bits_equal(OPS[op](d, scalar).cpu(), OPS[op](a, scalar))
    _bits_equal(OPS[op](scalar, d).cpu(), OPS[op](scalar, a))


@pytest.mark.parametrize("scalar_dtype", [torch.float64, torch.float32, torch.float16,
                                          torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("op", ["add", "mul", "div"])
def test_a_zero_dim_cpu_tensor_operand_matches_the_cpu(op, scalar_dtype):
    a = _values(500, torch.float32, 4)
    s = torch.tensor(3.7 if scalar_dtype.is_floating_point else 3, dtype=scalar_dtype)
    d = a.to("phantom")
    _bits_equal(OPS[op](d, s).cpu(), OPS[op](a, s))
    _bits_equal(OPS[op](s, d).cpu(), OPS[op](s, a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_in_place_and_out_forms_match_the_cpu(dtype):
    a, b = _values(999, dtype, 5), _values(999, dtype, 6)
    da, db = a.to("phantom"), b.to("phantom")
    for name in ("add_", "mul_", "div_"):
        want = getattr(a.clone(), name)(b)
        got = getattr(da.clone(), name)(db)
        _bits_equal(got.cpu(), want)
        _bits_equal(getattr(da.clone(), name)(2.5).cpu(), getattr(a.clone(), name)(2.5))
    # x op= x: the output is both inputs.
    for name in ("add_", "mul_", "div_"):
        x, dx = a.clone(), da.clone()
        _bits_equal(getattr(dx, name)(dx).cpu(), getattr(x, name)(x))
    for fn in (torch.add, torch.mul, torch.div):
        out = torch.empty(999, dtype=dtype, device="phantom")
        assert fn(da, db, out=out) is out
        _bits_equal(out.cpu(), fn(a, b))


def test_an_alpha_other_than_one_and_sub_keep_the_cpus_result():
    a, b = _values(300, torch.float32, 7), _values(300, torch.float32, 8)
    da, db = a.to("phantom"), b.to("phantom")
    _bits_equal(torch.add(da, db, alpha=0.3).cpu(), torch.add(a, b, alpha=0.3))
    _bits_equal(torch.sub(da, db).cpu(), torch.sub(a, b))
    _bits_equal((da - 1.5).cpu(), a - 1.5)


def test_a_chain_replayed_from_a_graph_matches_the_cpu():
    x = _values(1000, torch.float32, 9).abs() + 1

    def chain(y):
        for i in range(50):
            y = y + 1.0
            y = y * 0.5
            y = y / 1.25
        return y

    want = chain(x)
    dx = x.to("phantom")
    g = torch.phantom.Graph()
    chain(dx)  # warm-up outside the capture
    torch.phantom.synchronize()
    with torch.phantom.graph(g):
        out = chain(dx)
    for _ in range(3):
        g.replay()
        _bits_equal(out.cpu(), want)
