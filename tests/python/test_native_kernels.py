"""Native kernels for structured ops (ops/Structured.cpp): matrix products,
reductions, softmax and activations. Each is checked to take the native
path (it only queues), to give the CPU's answer bit for bit, forward and
backward, and to raise the CPU's error at the call for bad arguments."""
import pytest
import torch
import torch.nn.functional as F

import torch_phantom
from torch_phantom.testing import faults
from conftest import run_python, slow_kernel_on

pytestmark = pytest.mark.requires_kernel_view(
    "checks that ops take the native kernels, which run over the kernel view")

P = torch.phantom


def _native(op):
    return sum(r["native"] for r in torch_phantom.ops_report() if r["op"] == op)


def _calls(op):
    """Calls of `op` on any path: native, or generic (queued or waited)."""
    return sum(r["native"] + r["async"] + r["sync"]
               for r in torch_phantom.ops_report() if r["op"] == op)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


def _refused_at_the_call_like_the_cpu(call, x, *others):
    """`call(x, *others)` raises on the CPU; on phantom it must raise the
    same error at the call (not queue work that fails at the next sync) and
    leave `x` as it was."""
    with pytest.raises(RuntimeError) as cpu_error:
        call(x.clone(), *others)
    dx = x.to("phantom")
    with pytest.raises(RuntimeError) as error:
        call(dx, *(o.to("phantom") for o in others))
    assert str(error.value) == str(cpu_error.value)
    torch.phantom.synchronize()
    assert torch.equal(dx.cpu(), x)
    # The tracebacks hold this frame, and so dx, in a reference cycle: break
    # it, so the device memory is freed now rather than at a later collection.
    del error, cpu_error


CASES = [
    ("aten::mm", lambda a, b, c: a @ b.t(), ((6, 5), (4, 5), (4,))),
    ("aten::bmm", lambda a, b, c: torch.bmm(a, b), ((3, 4, 5), (3, 5, 2), (2,))),
    ("aten::addmm", lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
     ((6, 5), (5, 3), (3,))),
    ("aten::addmm", lambda a, b, c: F.linear(a, b, c), ((6, 5), (3, 5), (3,))),
    ("aten::sum", lambda a, b, c: a.sum(), ((6, 5), (1,), (1,))),
    ("aten::sum", lambda a, b, c: a.sum(dim=(0, 2), keepdim=True), ((3, 4, 5), (1,), (1,))),
    ("aten::mean", lambda a, b, c: a.mean(dim=1), ((6, 5), (1,), (1,))),
    ("aten::cumsum", lambda a, b, c: a.cumsum(1), ((6, 5), (1,), (1,))),
    ("aten::cumsum", lambda a, b, c: a.t().cumsum(0, dtype=torch.float64), ((6, 5), (1,), (1,))),
    ("aten::index_add", lambda a, b, c: a.index_add(
        0, torch.tensor([4, 0, 4], device=a.device), b, alpha=2), ((6, 5), (3, 5), (1,))),
    ("aten::index_add", lambda a, b, c: a.index_add(
        1, torch.tensor([1, 1], dtype=torch.int32, device=a.device), b.t()), ((6, 5), (2, 6), (1,))),
    ("aten::_softmax", lambda a, b, c: a.softmax(-1), ((6, 5), (1,), (1,))),
    ("aten::_log_softmax", lambda a, b, c: F.log_softmax(a, dim=0), ((6, 5), (1,), (1,))),
    ("aten::sigmoid", lambda a, b, c: torch.sigmoid(a), ((6, 5), (1,), (1,))),
    ("aten::tanh", lambda a, b, c: torch.tanh(a), ((6, 5), (1,), (1,))),
    ("aten::gelu", lambda a, b, c: F.gelu(a, approximate="tanh"), ((6, 5), (1,), (1,))),
    ("aten::neg", lambda a, b, c: -a.t(), ((6, 5), (1,), (1,))),
    ("aten::reciprocal", lambda a, b, c: a.reciprocal(), ((6, 5), (1,), (1,))),
    ("aten::pow", lambda a, b, c: a ** 2, ((6, 5), (1,), (1,))),
    ("aten::pow", lambda a, b, c: (a * a).t() ** -0.5, ((6, 5), (1,), (1,))),
    ("aten::gt", lambda a, b, c: a > b, ((6, 5), (5,), (1,))),
    ("aten::le", lambda a, b, c: a.t() <= b, ((6, 5), (6,), (1,))),
    ("aten::lt", lambda a, b, c: a < 0.25, ((6, 5), (1,), (1,))),
    ("aten::ge", lambda a, b, c: a >= b, ((6, 5), (6, 5), (1,))),
    ("aten::eq", lambda a, b, c: a == a.t().t(), ((6, 5), (1,), (1,))),
    ("aten::ne", lambda a, b, c: a != 0.5, ((6, 5), (1,), (1,))),
    ("aten::dot", lambda a, b, c: a[:, 1].dot(b), ((6, 5), (6,), (1,))),
    ("aten::max", lambda a, b, c: a.t().max(), ((6, 5), (1,), (1,))),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0][6:]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_structured_ops_are_native_and_match_cpu(case, dtype):
    op, fn, shapes = case
    cpu = [_rand(*s, dtype=dtype) for s in shapes]
    expected = fn(*cpu)
    before = _native(op)
    got = fn(*[t.to("phantom") for t in cpu])
    assert _native(op) > before, f"{op} did not take the native kernel"
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("op,fn", [
    ("aten::_softmax_backward_data", lambda x: x.softmax(-1)),
    ("aten::_log_softmax_backward_data", lambda x: x.log_softmax(0)),
    ("aten::threshold_backward", torch.relu),
    ("aten::sigmoid_backward", torch.sigmoid),
    ("aten::tanh_backward", torch.tanh),
    ("aten::gelu_backward", F.gelu),
])
def test_structured_backwards_are_native_and_match_cpu(op, fn):
    x_cpu = _rand(7, 6).requires_grad_()
    w = _rand(7, 6)
    (fn(x_cpu) * w).sum().backward()
    x = x_cpu.detach().to("phantom").requires_grad_()
    before = _native(op)
    (fn(x) * w.to("phantom")).sum().backward()
    assert _native(op) > before, f"{op} did not take the native kernel"
    assert torch.equal(x.grad.cpu(), x_cpu.grad)


def test_structured_ops_only_queue_their_kernel():
    a = torch.randn(64, 64, device="phantom")
    P.synchronize()
    stream = P.Stream()
    with P.stream(stream):
        faults.set_latency_us(20000)  # every kernel now takes >= 20 ms
        try:
            out = a @ a
            pending = not stream.query()
        finally:
            faults.set_latency_us(0)
    assert pending, "mm waited for its kernel instead of queueing it"
    stream.synchronize()
    assert torch.equal(out.cpu(), a.cpu() @ a.cpu())


def test_structured_ops_raise_the_cpus_error_at_the_call():
    a, b = torch.randn(3, 4), torch.randn(5, 6)
    with pytest.raises(RuntimeError) as cpu_error:
        a @ b
    with pytest.raises(RuntimeError) as phantom_error:
        a.to("phantom") @ b.to("phantom")
    assert str(phantom_error.value) == str(cpu_error.value)
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.randn(3, device="phantom").softmax(5)
    # gelu's meta function leaves `approximate` to the kernel.
    with pytest.raises(RuntimeError, match="approximate argument must be either none or tanh"):
        F.gelu(torch.randn(3, device="phantom"), approximate="bad")
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(3, 3, device="phantom") @ torch.randn(3, 3)
    if P.device_count() > 1:
        with pytest.raises(RuntimeError, match="same device"):
            torch.randn(3, 3, device="phantom:0") @ torch.randn(3, 3, device="phantom:1")
    # Nothing was queued that fails later: the device is still clean.
    P.synchronize()
    x = torch.randn(4, 4)
    assert torch.equal((x.to("phantom") @ x.to("phantom")).cpu(), x @ x)


def test_comparisons_pow_dot_and_max_raise_the_cpus_error_at_the_call():
    i = torch.arange(6)
    with pytest.raises(RuntimeError) as cpu_error:
        i ** -2
    with pytest.raises(RuntimeError) as phantom_error:
        i.to("phantom") ** -2
    assert str(phantom_error.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.randn(3, 4) > torch.randn(5)
    with pytest.raises(RuntimeError) as phantom_error:
        torch.randn(3, 4, device="phantom") > torch.randn(5, device="phantom")
    assert str(phantom_error.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError, match="Negation, the `-` operator, on a bool tensor"):
        -torch.ones(3, dtype=torch.bool, device="phantom")
    for a, b in (((3,), (4,)), ((2, 2), (4,))):
        with pytest.raises(RuntimeError) as cpu_error:
            torch.ones(a).dot(torch.ones(b))
        with pytest.raises(RuntimeError) as phantom_error:
            torch.ones(a, device="phantom").dot(torch.ones(b, device="phantom"))
        assert str(phantom_error.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError, match="expected both vectors to have same dtype"):
        torch.ones(3, device="phantom").dot(torch.ones(3, dtype=torch.float64, device="phantom"))
    with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
        torch.ones(0, device="phantom").max()
    # A 0-dim CPU tensor compared with a phantom tensor is read at the call,
    # as CUDA reads it.
    x = _rand(4)
    assert torch.equal((x.to("phantom") > torch.tensor(0.5)).cpu(), x > 0.5)
    P.synchronize()


def test_structured_ops_on_integer_and_strided_inputs_match_cpu():
    i = torch.arange(12).reshape(3, 4)
    assert torch.equal(i.to("phantom").sum(0).cpu(), i.sum(0))
    assert i.to("phantom").sum().dtype == torch.int64
    t = _rand(5, 7)
    got = t.to("phantom").t().softmax(0)
    expected = t.t().softmax(0)
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)
    assert torch.equal((t.to("phantom").t() @ t.to("phantom")).cpu(), t.t() @ t)


def test_dropout_backward_is_queued_and_matches_cpu():
    x_cpu = _rand(8, 16).requires_grad_()
    torch.manual_seed(3)
    F.dropout(x_cpu, p=0.3).pow(2).sum().backward()
    x = x_cpu.detach().to("phantom").requires_grad_()
    torch.manual_seed(3)
    torch_phantom.reset_ops_report()
    F.dropout(x, p=0.3).pow(2).sum().backward()
    rows = {r["op"]: r for r in torch_phantom.ops_report()}
    assert "aten::native_dropout_backward" not in rows, "took the generic path"
    assert torch.equal(x.grad.cpu(), x_cpu.grad)


def _bits(t):
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype]
    return t.contiguous().view(ints)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 41), (200, 200), "strided"])
def test_dropout_products_are_one_queued_loop_with_the_cpus_bits(dtype, shape):
    # Forward (input * mask * scale) and backward (grad * mask * scale) are
    # each one direct loop for a small contiguous float or double tensor,
    # no `aten::mul`; a larger or strided one keeps the two products. Both
    # give the CPU's bits: NaN payloads, signed zeros and infinities go
    # through the same two multiplications.
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"),
                            1e-310, 3.0, -7.5], dtype=dtype)
    x = _rand(*((41, 10) if shape == "strided" else shape), dtype=dtype)
    x.view(-1)[:8] = special
    if shape == "strided":
        x = x.t()
    grad = _rand(*x.shape, dtype=dtype) * 3
    torch.manual_seed(11)
    out_cpu, mask_cpu = torch.native_dropout(x, 0.3, True)
    grad_in_cpu = torch.ops.aten.native_dropout_backward(grad, mask_cpu, 1 / 0.7)

    torch.manual_seed(11)
    torch_phantom.reset_ops_report()
    out, mask = torch.native_dropout(x.to("phantom"), 0.3, True)
    grad_in = torch.ops.aten.native_dropout_backward(grad.to("phantom"), mask, 1 / 0.7)
    direct = shape == (5, 41)
    assert (_calls("aten::mul") == 0) == direct, torch_phantom.ops_report()
    assert torch.equal(mask.cpu(), mask_cpu)
    assert torch.equal(_bits(out.cpu()), _bits(out_cpu))
    assert torch.equal(_bits(grad_in.cpu()), _bits(grad_in_cpu))


def test_dropout_backward_of_a_non_bool_mask_keeps_the_cpus_promotion():
    # The direct loop reads a bool mask; a float mask (or a half gradient)
    # takes the two products, with the CPU's type promotion.
    grad = _rand(4, 6)
    mask = (_rand(4, 6) > 0).to(torch.float64)
    want = torch.ops.aten.native_dropout_backward(grad, mask, 2.0)
    got = torch.ops.aten.native_dropout_backward(grad.to("phantom"), mask.to("phantom"), 2.0)
    assert got.dtype == want.dtype == torch.float64
    assert torch.equal(got.cpu(), want)
    half = grad.half()
    got = torch.ops.aten.native_dropout_backward(half.to("phantom"), (mask > 0).to("phantom"), 2.0)
    assert torch.equal(got.cpu(), torch.ops.aten.native_dropout_backward(half, mask > 0, 2.0))


def test_fused_rnn_cells_refuse_integer_gates_at_the_call():
    # ATen sends LSTM/GRU cells on accelerators to the fused kernels, which
    # take floating and complex gates (CUDA's: floating only); integer gates
    # would give float results from formulas meant for floats.
    gates = torch.ones(2, 16, dtype=torch.int64, device="phantom")
    state = torch.ones(2, 4, dtype=torch.int64, device="phantom")
    with pytest.raises(NotImplementedError,
                       match="\"_thnn_fused_lstm_cell\" not implemented for 'Long'"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, state)
    with pytest.raises(NotImplementedError,
                       match="\"_thnn_fused_gru_cell\" not implemented for 'Long'"):
        torch.ops.aten._thnn_fused_gru_cell(gates[:, :12], gates[:, :12], state)
    P.synchronize()


@pytest.mark.parametrize("dtype", [torch.float16, torch.complex64])
def test_dropout_returns_the_cpus_boolean_mask(dtype):
    # The CPU's native_dropout draws a bool mask (complex inputs included:
    # bernoulli_ has no complex kernel, a bool mask does not need one).
    x = _rand(4, 5).to(dtype)
    torch.manual_seed(5)
    out_cpu, mask_cpu = torch.native_dropout(x, 0.4, True)
    torch.manual_seed(5)
    out, mask = torch.native_dropout(x.to("phantom"), 0.4, True)
    assert mask.dtype == mask_cpu.dtype == torch.bool
    assert torch.equal(mask.cpu(), mask_cpu)
    assert torch.equal(out.cpu(), out_cpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_forward_and_backward_are_queued_and_match_cpu(dtype, affine):
    x_cpu = _rand(4, 3, 8, dtype=dtype).requires_grad_()
    ln_cpu = torch.nn.LayerNorm(8, elementwise_affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            ln_cpu.weight.copy_(_rand(8, dtype=dtype))
            ln_cpu.bias.copy_(_rand(8, dtype=dtype) * 0.1)
    ln = torch.nn.LayerNorm(8, elementwise_affine=affine, dtype=dtype, device="phantom")
    ln.load_state_dict(ln_cpu.state_dict())
    grad = _rand(4, 3, 8, dtype=dtype)
    y_cpu = ln_cpu(x_cpu)
    y_cpu.backward(grad)
    x = x_cpu.detach().to("phantom").requires_grad_()
    before = (_native("aten::native_layer_norm"), _native("aten::native_layer_norm_backward"))
    y = ln(x)
    y.backward(grad.to("phantom"))
    after = (_native("aten::native_layer_norm"), _native("aten::native_layer_norm_backward"))
    assert after[0] > before[0] and after[1] > before[1], "layer norm waited for the device"
    assert torch.equal(y.detach().cpu(), y_cpu.detach())
    assert torch.equal(x.grad.cpu(), x_cpu.grad)
    if affine:
        assert torch.equal(ln.weight.grad.cpu(), ln_cpu.weight.grad)
        assert torch.equal(ln.bias.grad.cpu(), ln_cpu.bias.grad)
    # The statistics have the CPU's shapes, strides and values.
    got = torch.native_layer_norm(x.detach(), (8,), None, None, 1e-5)
    expected = torch.native_layer_norm(x_cpu.detach(), (8,), None, None, 1e-5)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.stride() == e.stride() and g.dtype == e.dtype
        assert torch.equal(g.cpu(), e)


def test_layer_norm_refuses_what_the_cpu_refuses_at_the_call():
    x = torch.randn(4, 6)
    for args in (((5,), None, None), ((6,), torch.randn(5), None)):
        with pytest.raises(RuntimeError) as cpu_error:
            torch.native_layer_norm(x, *args, 1e-5)
        moved = [a.to("phantom") if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(RuntimeError) as phantom_error:
            torch.native_layer_norm(x.to("phantom"), *moved, 1e-5)
        assert str(phantom_error.value) == str(cpu_error.value)
    P.synchronize()


def test_cat_is_native_and_matches_cpu_with_promotion_and_empties():
    a, b = _rand(2, 3), _rand(4, 3, dtype=torch.float64)
    empty = torch.empty(0)
    for parts, dim in (((a, a), 0), ((a, b), 0), ((a, empty, a), 0), ((a.t(), a.t()), 1)):
        expected = torch.cat(parts, dim)
        before = _native("aten::cat")
        got = torch.cat([p.to("phantom") for p in parts], dim)
        assert _native("aten::cat") > before
        assert got.dtype == expected.dtype and got.stride() == expected.stride()
        assert torch.equal(got.cpu(), expected)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.cat([a, _rand(2, 4)], 0)
    with pytest.raises(RuntimeError) as phantom_error:
        torch.cat([a.to("phantom"), _rand(2, 4).to("phantom")], 0)
    assert str(phantom_error.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a.to("phantom"), a], 0)
    P.synchronize()


# -- Remembered Meta results (ops/AsyncFallback.cpp) -------------------------

def _paths(op):
    row = next((r for r in torch_phantom.ops_report() if r["op"] == op), None)
    return (row["async"], row["sync"]) if row else (0, 0)


def test_an_op_with_a_python_meta_kernel_is_queued_from_its_first_call():
    # index_select's Meta kernel is Python in torch 2.13: too slow to run on
    # every call, so the outputs are remembered per call signature. The
    # first call learns them from a trial run of the CPU kernel on the
    # host, and is queued: it returns while the stream is still busy.
    table = _rand(50, 8)
    index = torch.tensor([3, 1, 4, 1, 5, 9])
    expected = table.index_select(0, index)
    t, i = table.to("phantom"), index.to("phantom")
    stream = P.Stream()
    stream.wait_stream(P.current_stream())  # t and i are written on the default stream
    torch_phantom.reset_ops_report()
    slow_kernel_on(stream)
    with P.stream(stream):
        results = [t.index_select(0, i) for _ in range(5)]
        assert not stream.query()
    assert _paths("aten::index_select") == (5, 0)
    stream.synchronize()
    for r in results:
        assert torch.equal(r.cpu(), expected)
    # Another shape is another signature, queued from its first call too.
    got = [t.index_select(0, i[:3]) for _ in range(2)]
    assert _paths("aten::index_select") == (7, 0)
    for g in got:
        assert torch.equal(g.cpu(), expected[:3])


def test_an_argument_error_the_meta_kernel_misses_is_raised_at_the_call():
    # multinomial's Python Meta kernel does not check the input's dtype; the
    # CPU kernel does. The trial run raises it at the call, as on the CPU,
    # and nothing is left queued to fail later.
    probs = torch.ones(3, dtype=torch.long)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.multinomial(probs, 1)
    with pytest.raises(RuntimeError) as phantom_error:
        torch.multinomial(probs.to("phantom"), 1)
    assert str(phantom_error.value) == str(cpu_error.value)
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.randn(3, device="phantom").softmax(5)
    P.synchronize()


def test_a_meta_answer_that_differs_from_the_cpu_is_never_used():
    # For the CPU's fast path _embedding_bag returns an empty offset2bag;
    # its Meta kernel says one of the indices' length. The trial run gives
    # the CPU's own outputs, and every call, the first included, is queued
    # with them. (Offsets of another dtype than the indices, which the CPU
    # promotes, are left to the generic path by the native kernel.)
    weight = _rand(20, 4)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 3, 5], dtype=torch.int32)
    expected = torch._embedding_bag(weight, indices, offsets, False, 0, False, None, False, -1)
    args = [x.to("phantom") for x in (weight, indices, offsets)]
    torch_phantom.reset_ops_report()
    for _ in range(4):
        got = torch._embedding_bag(*args, False, 0, False, None, False, -1)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and torch.equal(g.cpu(), e)
    assert _paths("aten::_embedding_bag") == (4, 0)


def test_a_first_call_over_more_than_64_mib_waits_instead_of_a_trial():
    # A trial run copies the memory the arguments span; past 64 MiB it
    # would cost as much as the kernel, so that first call waits and checks
    # the Meta kernel's answer instead. A small slice of the same storage
    # spans little and is queued from its first call.
    big = torch.arange(17 * 2**20, dtype=torch.int32, device="phantom")  # 68 MiB
    index = torch.tensor([5, 2**24 + 3], device="phantom")
    torch_phantom.reset_ops_report()
    got = [big.index_select(0, index) for _ in range(2)]
    assert _paths("aten::index_select") == (1, 1)
    for g in got:
        assert g.cpu().tolist() == [5, 2**24 + 3]
    window = big[2**24:2**24 + 8]
    assert window.index_select(0, index[:1]).cpu().tolist() == [2**24 + 5]
    assert _paths("aten::index_select") == (2, 1)


def _op_with_meta(name, schema, cpu, meta):
    lib = torch.library.Library(name, "DEF")
    lib.define(schema)
    op_name = schema.split("(")[0]
    lib.impl(op_name, cpu, "CPU")
    lib.impl(op_name, meta, "Meta")
    return lib, getattr(getattr(torch.ops, name), op_name)


def test_a_resize_the_meta_kernel_does_not_predict_is_made_on_the_host():
    # The CPU kernel resizes its in-place argument to 4 elements, which the
    # Meta kernel does not say. The trial run sees it, so the host resizes
    # the device tensor before the call is queued.
    def grow(x):
        x.resize_(4).fill_(7.0)
        return x
    lib, grow_ = _op_with_meta(
        "phantom_test_grow", "grow_(Tensor(a!) x) -> Tensor(a!)", grow, lambda x: x)
    x = torch.zeros(3, device="phantom")
    torch_phantom.reset_ops_report()
    assert grow_(x) is x
    assert x.shape == (4,) and torch.equal(x.cpu(), torch.full((4,), 7.0))
    assert _paths("phantom_test_grow::grow_") == (1, 0)
    del lib


def test_data_dependent_ops_keep_waiting():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="phantom")
    torch_phantom.reset_ops_report()
    for _ in range(4):
        assert torch.equal(x.nonzero().cpu(), torch.tensor([[1], [3]]))
    assert _paths("aten::nonzero")[0] == 0


def test_a_pointwise_op_is_remembered_whatever_its_float_scalar():
    # Adam calls addcdiv_ with a new step size every step. For a pointwise
    # op a float scalar cannot change the outputs' shape, so one signature
    # covers every value, and each value still gives the CPU's answer.
    p, g, d = _rand(5, 7), _rand(7, 5).t(), _rand(5, 7).abs() + 1
    pp, gp, dp = (x.to("phantom") for x in (p, g, d))
    torch_phantom.reset_ops_report()
    for step in range(1, 5):
        value = -0.1 / step
        pp.addcdiv_(gp, dp, value=value)
        p.addcdiv_(g, d, value=value)
    assert _paths("aten::addcdiv") == (4, 0)  # addcdiv_ runs as addcdiv.out
    assert torch.equal(pp.cpu(), p)
    # A float argument of an op that is not pointwise still tells signatures
    # apart (here it decides the output's shape).
    for end in (5.0, 7.0, 5.0):
        got = torch.arange(0.0, end, 0.5, device="phantom")
        assert torch.equal(got.cpu(), torch.arange(0.0, end, 0.5))


def test_complex_scalars_are_part_of_a_call_signature():
    # addmm with complex alpha and beta (not pointwise: the values count)
    # and masked_fill_ with a complex value are remembered and queued
    # like any other call, and give the CPU's answer.
    a, b, c = (torch.randn(3, 3, dtype=torch.complex64) for _ in range(3))
    pa, pb, pc = (t.to("phantom") for t in (a, b, c))
    torch_phantom.reset_ops_report()
    for beta, alpha in ((1 + 1j, 2 - 1j), (1 + 1j, 2 - 1j), (0.5j, 1)):
        got = torch.addmm(pc, pa, pb, beta=beta, alpha=alpha)
        assert torch.allclose(got.cpu(), torch.addmm(c, a, b, beta=beta, alpha=alpha))
    mask = torch.tensor([True, False, True])
    x = torch.zeros(3, dtype=torch.complex64)
    px = x.to("phantom")
    for value in (1 + 2j, 3 - 1j):
        px.masked_fill_(mask.to("phantom"), value)
        x.masked_fill_(mask, value)
        assert torch.equal(px.cpu(), x)
    assert _paths("aten::addmm")[1] == 0
    assert _paths("aten::masked_fill_")[1] == 0


def test_a_result_that_differs_from_the_one_computed_ahead_fails_loudly():
    # An op whose output shape depends on the data, with a Meta kernel that
    # says it does not: the trial run on zeros gives one shape, the real
    # data another. The queued work must not broadcast the CPU's result
    # into the output computed ahead, but fail at the next sync, naming the
    # op; later calls with that signature then wait and are right.
    lib, head = _op_with_meta(
        "phantom_test_ahead", "head(Tensor x) -> Tensor",
        lambda x: x[: int(x[0])].clone(), lambda x: x.new_empty(3))
    good = torch.tensor([3.0, 1.0, 2.0, 5.0], device="phantom")
    stream = P.Stream()
    with P.stream(stream):
        head(good)
        with pytest.raises(RuntimeError, match=r"phantom_test_ahead::head.*shape \[3\]"):
            stream.synchronize()
    torch_phantom.reset_ops_report()
    assert torch.equal(head(good).cpu(), torch.tensor([3.0, 1.0, 2.0]))
    one = torch.tensor([1.0, 1.0, 2.0, 5.0], device="phantom")
    assert torch.equal(head(one).cpu(), torch.tensor([1.0]))
    assert _paths("phantom_test_ahead::head") == (0, 2)
    del lib


def test_an_op_whose_cpu_entry_is_a_composite_is_queued_too():
    # native_group_norm's CPU entry is a composite kernel, redispatched on
    # the CPU aliases; it used to wait on every call.
    x = _rand(4, 6, 5)
    weight, bias = _rand(6), _rand(6)
    expected = torch.native_group_norm(x, weight, bias, 4, 6, 5, 2, 1e-5)
    args = [t.to("phantom") for t in (x, weight, bias)]
    torch_phantom.reset_ops_report()
    for _ in range(3):
        got = torch.native_group_norm(*args, 4, 6, 5, 2, 1e-5)
        for g, e in zip(got, expected):
            assert torch.equal(g.cpu(), e)
    assert _paths("aten::native_group_norm") == (3, 0)


def test_an_out_argument_the_call_resizes_is_resized_on_the_host_and_queued():
    # torch.arange(n, device=...) fills an empty out= tensor that the op
    # resizes; the resize is remembered with the signature and made on the
    # host, so positional ids built every forward do not wait.
    torch_phantom.reset_ops_report()
    for n in (5, 5, 5, 9, 9):
        got = torch.arange(n, device="phantom")
        assert got.shape == (n,) and torch.equal(got.cpu(), torch.arange(n))
    assert _paths("aten::arange") == (5, 0)
    a, b = _rand(3, 4), _rand(4, 3).t()
    expected = torch.atan2(a, b)
    pa, pb = a.to("phantom"), b.to("phantom")
    for _ in range(3):
        out = torch.empty(0, device="phantom")
        assert torch.atan2(pa, pb, out=out) is out
        assert out.shape == (3, 4) and torch.equal(out.cpu(), expected)
    assert _paths("aten::atan2") == (3, 0)
    # linalg_solve gives an empty out= argument column-major strides, which
    # its Meta kernel does not say: the CPU's are the ones made on the host.
    A = _rand(4, 4) + 4 * torch.eye(4)
    B = _rand(4, 2)
    cpu_out = torch.empty(0)
    torch.linalg.solve(A, B, out=cpu_out)
    for _ in range(2):
        out = torch.empty(0, device="phantom")
        torch.linalg.solve(A.to("phantom"), B.to("phantom"), out=out)
        assert out.stride() == cpu_out.stride()
        assert torch.allclose(out.cpu(), cpu_out)


def test_a_signature_whose_checking_call_raised_is_checked_again():
    # cholesky's trial run raises on zeros and on ones (neither is positive
    # definite), so its first call with a signature waits and checks the
    # Meta kernel's answer against the CPU's. If the CPU kernel raises
    # instead (a matrix that is not positive definite: data, not shape),
    # the next call with that signature must check again and then be
    # queued, not wait for a check that never comes.
    bad = -torch.eye(3, device="phantom")
    good = 2 * torch.eye(3)
    torch_phantom.reset_ops_report()
    with pytest.raises(RuntimeError, match="not positive-definite"):
        torch.cholesky(bad)
    results = [torch.cholesky(good.to("phantom")) for _ in range(4)]
    assert _paths("aten::cholesky") == (3, 2)
    for r in results:
        assert torch.allclose(r.cpu(), torch.cholesky(good))


def test_debug_memo_names_the_ops_whose_meta_kernel_is_not_the_cpus():
    # PHANTOM_DEBUG_MEMO=1 is how the disagreements between Python Meta
    # kernels and CPU kernels are found: it names each one on stderr.
    code = """
import torch
w = torch.randn(20, 4, device="phantom")
i = torch.tensor([1, 2, 4, 5], device="phantom")
o = torch.tensor([0, 2], dtype=torch.int32, device="phantom")  # generic path
torch._embedding_bag(w, i, o, False, 0, False, None, False, -1)
torch.cholesky(2 * torch.eye(3, device="phantom"))
torch.phantom.synchronize()
"""
    quiet = run_python(code)
    assert quiet.returncode == 0, quiet.stderr
    assert "phantom:" not in quiet.stderr
    result = run_python(code, extra_env={"PHANTOM_DEBUG_MEMO": "1"})
    assert result.returncode == 0, result.stderr
    assert ("aten::_embedding_bag: the Meta kernel's answer is not the CPU kernel's"
            in result.stderr)
    assert "aten::cholesky: the trial run raised: cholesky: The factorization" in result.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_foreach_add_is_one_queued_kernel_and_matches_cpu(dtype):
    # SGD's update on phantom: one native call for the whole list, no
    # per-tensor add_, the CPU's bits (scalars, odd shapes and self-aliasing
    # pairs included).
    g = torch.Generator().manual_seed(7)
    params = [torch.randn(s, generator=g).to(dtype) for s in [(3, 4), (7,), (2, 3, 5), ()]]
    grads = [torch.randn(p.shape, generator=g).to(dtype) for p in params]
    dev_params = [p.to("phantom") for p in params]
    dev_grads = [x.to("phantom") for x in grads]
    dev_grads[1] = dev_params[1]  # x.add_(x) in the list
    grads[1] = params[1]
    foreach_before, add_before = _native("aten::_foreach_add_"), _native("aten::add")
    torch._foreach_add_(params, grads, alpha=-0.1)
    torch._foreach_add_(dev_params, dev_grads, alpha=-0.1)
    assert _native("aten::_foreach_add_") == foreach_before + 1
    assert _native("aten::add") == add_before, "the list was split into add_ calls"
    for got, expected in zip(dev_params, params):
        assert torch.equal(got.cpu(), expected)


def test_foreach_add_outside_the_native_case_keeps_the_cpus_behaviour():
    before = _native("aten::_foreach_add_")
    # A broadcast pair and an integer list take ATen's per-pair loop.
    a, b = torch.randn(3, 4), torch.randn(4)
    i, j = torch.arange(6), torch.arange(6)
    da, db, di, dj = (t.to("phantom") for t in (a, b, i, j))
    torch._foreach_add_([a], [b], alpha=2.0)
    torch._foreach_add_([da], [db], alpha=2.0)
    torch._foreach_add_([i], [j])
    torch._foreach_add_([di], [dj])
    assert torch.equal(da.cpu(), a) and torch.equal(di.cpu(), i)
    assert _native("aten::_foreach_add_") == before
    # Lists of different lengths and a boolean alpha: the CPU's errors, at
    # the call.
    with pytest.raises(RuntimeError, match="same number of tensors"):
        torch._foreach_add_([da], [db, db])
    _refused_at_the_call_like_the_cpu(
        lambda x, y: torch._foreach_add_([x], [y], alpha=True), torch.randn(4), torch.randn(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("scalar", [0.9, 3, -1e-3])
def test_foreach_mul_is_one_queued_kernel_and_matches_cpu(dtype, scalar):
    g = torch.Generator().manual_seed(11)
    bufs = [torch.randn(s, generator=g).to(dtype) for s in [(3, 4), (7,), (2, 3, 5), ()]]
    dev_bufs = [b.to("phantom") for b in bufs]
    foreach_before, mul_before = _native("aten::_foreach_mul_"), _native("aten::mul")
    torch._foreach_mul_(bufs, scalar)
    torch._foreach_mul_(dev_bufs, scalar)
    assert _native("aten::_foreach_mul_") == foreach_before + 1
    assert _native("aten::mul") == mul_before, "the list was split into mul_ calls"
    for got, expected in zip(dev_bufs, bufs):
        assert torch.equal(got.cpu(), expected)


def test_foreach_mul_outside_the_native_case_keeps_the_cpus_behaviour():
    before = _native("aten::_foreach_mul_")
    ints, strided = torch.arange(6), torch.randn(4, 6).t()
    d_ints, d_strided = ints.to("phantom"), strided.to("phantom")  # keeps the strides
    assert not d_strided.is_contiguous()
    torch._foreach_mul_([ints], 2)
    torch._foreach_mul_([d_ints], 2)
    torch._foreach_mul_([strided], 0.5)
    torch._foreach_mul_([d_strided], 0.5)
    assert torch.equal(d_ints.cpu(), ints) and torch.equal(d_strided.cpu(), strided)
    assert _native("aten::_foreach_mul_") == before
    _refused_at_the_call_like_the_cpu(lambda x: torch._foreach_mul_([x], 1j), torch.randn(3))


def _twin_mlps():
    """A small MLP on the CPU and its copy on phantom (same parameters)."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    dev_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    dev_model.load_state_dict(model.state_dict())
    return model, dev_model.to("phantom")


def _train_both(model, opt, dev_model, dev_opt, x, y, steps=3):
    """`steps` training steps of each model on (x, y), on its own device."""
    for _ in range(steps):
        for m, o, inp, tgt in ((model, opt, x, y),
                               (dev_model, dev_opt, x.to("phantom"), y.to("phantom"))):
            o.zero_grad()
            F.mse_loss(m(inp), tgt).backward()
            o.step()


def _assert_same_parameters(dev_model, model):
    for got, expected in zip(dev_model.parameters(), model.parameters()):
        assert torch.equal(got.detach().cpu(), expected.detach())


def test_sgd_with_foreach_matches_the_cpu_bit_for_bit():
    torch.manual_seed(3)
    model, dev_model = _twin_mlps()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    before = _native("aten::_foreach_add_"), _native("aten::_foreach_mul_")
    _train_both(model, opt, dev_model, dev_opt, x, y)
    # Per step: the update (add_), and from the second step on the
    # momentum buffers' decay (mul_) and their update (add_).
    assert _native("aten::_foreach_add_") == before[0] + 5
    assert _native("aten::_foreach_mul_") == before[1] + 2
    _assert_same_parameters(dev_model, model)


def test_sgd_weight_decay_with_foreach_matches_the_cpu_bit_for_bit():
    # Weight decay adds wd * params to the gradients out of place
    # (_foreach_add): one native call per step, no per-tensor add.
    torch.manual_seed(5)
    model, dev_model = _twin_mlps()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-2, foreach=False)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1, weight_decay=1e-2)
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    before, adds = _native("aten::_foreach_add"), _calls("aten::add")
    _train_both(model, opt, dev_model, dev_opt, x, y)
    assert _native("aten::_foreach_add") == before + 3
    # The forward's bias adds are addmm; the backward adds none.
    assert _calls("aten::add") == adds, "the weight decay was split into per-tensor adds"
    _assert_same_parameters(dev_model, model)


# Adam's and clip_grad_norm_'s foreach ops (and two overloads of the same
# kernels): each call is one native kernel, and the CPU's bits.
# `call(lists, scalars)` gets lists[0] (written), lists[1], lists[2] and one
# scalar per tensor; lists[1][3] is a 0-d tensor.
OPTIMIZER_FOREACH = {
    "_foreach_lerp_": lambda t, s: torch._foreach_lerp_(t[0], t[1], 0.1),
    "_foreach_addcmul_": lambda t, s: torch._foreach_addcmul_(t[0], t[1], t[2], 0.001),
    "_foreach_addcdiv_": lambda t, s: torch._foreach_addcdiv_(t[0], t[1], t[2], s),
    "_foreach_addcdiv_ (one scalar)": lambda t, s: torch._foreach_addcdiv_(t[0], t[1], t[2], -0.5),
    "_foreach_div_": lambda t, s: torch._foreach_div_(t[0], s),
    "_foreach_add_ (one scalar)": lambda t, s: torch._foreach_add_(t[0], 1e-8),
    "_foreach_sqrt": lambda t, s: torch._foreach_sqrt(t[0]),
    "_foreach_norm": lambda t, s: torch._foreach_norm(t[0], 2.0),
    "_foreach_norm (inf)": lambda t, s: torch._foreach_norm(t[0], float("inf")),
    "_foreach_mul_ (a 0-d tensor)": lambda t, s: torch._foreach_mul_(t[0], t[1][3]),
    "_foreach_add (out of place)": lambda t, s: torch._foreach_add(t[0], t[1], alpha=1e-4),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", list(OPTIMIZER_FOREACH))
def test_optimizer_foreach_ops_are_one_queued_kernel_and_match_cpu(name, dtype):
    g = torch.Generator().manual_seed(5)
    shapes = [(3, 4), (7,), (2, 3, 5), ()]
    # Positive, so that sqrt and the divisions stay finite.
    lists = [[(torch.rand(s, generator=g) + 0.5).to(dtype) for s in shapes] for _ in range(3)]
    scalars = [0.9, -2.0, 1e-3, 3]
    dev_lists = [[t.to("phantom") for t in ts] for ts in lists]
    op = "aten::" + name.split()[0]
    before = _native(op)
    expected = OPTIMIZER_FOREACH[name](lists, scalars)
    got = OPTIMIZER_FOREACH[name](dev_lists, scalars)
    assert _native(op) == before + 1, "not one native call for the whole list"
    if expected is None:  # in place: the written list
        expected, got = lists[0], dev_lists[0]
    for g_, e in zip(got, expected):
        assert g_.device.type == "phantom"
        assert torch.equal(g_.cpu(), e)


def test_optimizer_foreach_ops_outside_the_native_case_keep_the_cpus_behaviour():
    ops = ["aten::_foreach_lerp_", "aten::_foreach_div_", "aten::_foreach_sqrt",
           "aten::_foreach_addcmul_", "aten::_foreach_norm", "aten::_foreach_mul_"]
    before = [_native(op) for op in ops]
    strided = torch.rand(4, 6).t()
    d_strided = strided.to("phantom")
    # Strided tensors and float64 ends for float32 tensors: ATen's loop,
    # the CPU's results and errors.
    torch._foreach_div_([strided], [2.0])
    torch._foreach_div_([d_strided], [2.0])
    roots = torch._foreach_sqrt([d_strided])
    assert torch.equal(roots[0].cpu(), strided.sqrt())
    assert torch.equal(d_strided.cpu(), strided)
    a, b = torch.rand(3), torch.rand(3, dtype=torch.float64)
    _refused_at_the_call_like_the_cpu(lambda x, y: torch._foreach_lerp_([x], [y], 0.5), a, b)
    _refused_at_the_call_like_the_cpu(
        lambda x, y: torch._foreach_addcmul_([x], [y], [y], 1j), a, a)
    # One scalar too few.
    with pytest.raises(RuntimeError, match="[Ss]calar"):
        torch._foreach_div_([d_strided, d_strided], [2.0])
    # A norm with a dtype, the norm of an empty tensor, a 1-d "scalar".
    x = torch.rand(5)
    norms = torch._foreach_norm([x.to("phantom")], 2, dtype=torch.float64)
    assert torch.equal(norms[0].cpu(), torch._foreach_norm([x], 2, dtype=torch.float64)[0])
    _refused_at_the_call_like_the_cpu(lambda e: torch._foreach_norm([e], -1), torch.empty(0))
    _refused_at_the_call_like_the_cpu(lambda a, b: torch._foreach_mul_([a], b), x, torch.rand(2))
    assert [_native(op) for op in ops] == before


def test_clip_grad_norm_matches_the_cpu_bit_for_bit():
    torch.manual_seed(4)
    model, dev_model = _twin_mlps()
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    F.mse_loss(model(x), y).backward()
    F.mse_loss(dev_model(x.to("phantom")), y.to("phantom")).backward()
    before = _native("aten::_foreach_norm"), _native("aten::_foreach_mul_")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    dev_norm = torch.nn.utils.clip_grad_norm_(dev_model.parameters(), 0.1)
    assert (_native("aten::_foreach_norm"), _native("aten::_foreach_mul_")) == \
        (before[0] + 1, before[1] + 1)
    assert torch.equal(dev_norm.cpu(), norm)
    for got, expected in zip(dev_model.parameters(), model.parameters()):
        assert torch.equal(got.grad.cpu(), expected.grad)


def test_adam_with_foreach_matches_the_cpu_bit_for_bit():
    torch.manual_seed(3)
    model, dev_model = _twin_mlps()
    # The CPU's Adam loops over the parameters; phantom's takes the foreach
    # form (the default on an accelerator).
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    dev_opt = torch.optim.Adam(dev_model.parameters(), lr=0.01)
    x, y = torch.randn(8, 6), torch.randn(8, 2)
    ops = ["aten::_foreach_lerp_", "aten::_foreach_mul_", "aten::_foreach_addcmul_",
           "aten::_foreach_sqrt", "aten::_foreach_div_", "aten::_foreach_add_",
           "aten::_foreach_addcdiv_"]
    before = [_native(op) for op in ops]
    per_tensor = [_calls(op) for op in ("aten::lerp", "aten::sqrt", "aten::addcdiv")]
    _train_both(model, opt, dev_model, dev_opt, x, y)
    # Each op once per step, for the whole parameter list.
    assert [_native(op) - b for op, b in zip(ops, before)] == [3] * len(ops)
    assert [_calls(op) for op in ("aten::lerp", "aten::sqrt", "aten::addcdiv")] == per_tensor, \
        "the lists were split into per-tensor ops"
    _assert_same_parameters(dev_model, model)


@pytest.mark.parametrize("op", ["add", "sub", "add_", "sub_"])
@pytest.mark.parametrize("alpha", [True, 1j])
def test_an_alpha_the_cpu_refuses_is_refused_at_the_call(op, alpha):
    # Not queued for the worker to fail on later (a sticky device error at
    # the next sync): the CPU's error, at the call, and the device goes on.
    _refused_at_the_call_like_the_cpu(
        lambda x, y: getattr(x, op)(y, alpha=alpha), torch.randn(4), torch.randn(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_integer_indexing_is_native_and_matches_cpu(dtype):
    # DLRM's pairwise interaction, dots[:, rows, cols]: index.Tensor with a
    # leading slice, and other layouts of integer indices.
    x = _rand(4, 5, 6).to(dtype)
    rows, cols = torch.triu_indices(5, 5, offset=1)
    calls = [
        lambda t, r, c: t[:, r, c],
        lambda t, r, c: t[r.int()],
        lambda t, r, c: t[r[:3], :, -1 - c[:3]],
        lambda t, r, c: t.transpose(0, 2)[c.clamp(max=5).view(2, 5)],
    ]
    for call in calls:
        expected = call(x, rows, cols)
        before = _native("aten::index")
        got = call(x.to("phantom"), rows.to("phantom"), cols.to("phantom"))
        assert _native("aten::index") == before + 1
        assert got.shape == expected.shape and got.stride() == expected.stride()
        assert torch.equal(got.cpu(), expected)


def test_indexing_by_a_mask_or_with_bad_indices_is_left_to_the_generic_path():
    x = _rand(4, 5)
    mask = x > 0
    before = _native("aten::index")
    torch.testing.assert_close(x.to("phantom")[mask.to("phantom")].cpu(), x[mask])
    assert _native("aten::index") == before
    for bad in ([torch.tensor([0, 1]), torch.tensor([0, 1, 2])],  # do not broadcast
                [torch.tensor([0.5])],  # not integers
                [torch.tensor([0])] * 3):  # too many
        with pytest.raises((IndexError, RuntimeError)) as cpu_error:
            x[tuple(bad)]
        with pytest.raises(type(cpu_error.value)) as error:
            x.to("phantom")[tuple(i.to("phantom") for i in bad)]
        assert str(error.value) == str(cpu_error.value)
    P.synchronize()  # nothing failing was queued
    del error, cpu_error
    # A value out of range is data: the queued kernel fails the stream.
    x.to("phantom")[torch.tensor([7], device="phantom")]
    with pytest.raises(torch.AcceleratorError, match="out of bounds"):
        P.synchronize()
