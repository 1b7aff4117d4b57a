"""Native kernels for structured ops (ops/Structured.cpp): matrix products,
reductions, softmax and activations. Each is checked to take the native
path (it only queues), to give the CPU's answer bit for bit, forward and
backward, and to raise the CPU's error at the call for bad arguments."""
import pytest
import torch
import torch.nn.functional as F

import torch_phantom

P = torch.phantom


def _native(op):
    return sum(r["native"] for r in torch_phantom.ops_report() if r["op"] == op)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


CASES = [
    ("aten::mm", lambda a, b, c: a @ b.t(), ((6, 5), (4, 5), (4,))),
    ("aten::bmm", lambda a, b, c: torch.bmm(a, b), ((3, 4, 5), (3, 5, 2), (2,))),
    ("aten::addmm", lambda a, b, c: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
     ((6, 5), (5, 3), (3,))),
    ("aten::addmm", lambda a, b, c: F.linear(a, b, c), ((6, 5), (3, 5), (3,))),
    ("aten::sum", lambda a, b, c: a.sum(), ((6, 5), (1,), (1,))),
    ("aten::sum", lambda a, b, c: a.sum(dim=(0, 2), keepdim=True), ((3, 4, 5), (1,), (1,))),
    ("aten::mean", lambda a, b, c: a.mean(dim=1), ((6, 5), (1,), (1,))),
    ("aten::_softmax", lambda a, b, c: a.softmax(-1), ((6, 5), (1,), (1,))),
    ("aten::_log_softmax", lambda a, b, c: F.log_softmax(a, dim=0), ((6, 5), (1,), (1,))),
    ("aten::sigmoid", lambda a, b, c: torch.sigmoid(a), ((6, 5), (1,), (1,))),
    ("aten::tanh", lambda a, b, c: torch.tanh(a), ((6, 5), (1,), (1,))),
    ("aten::gelu", lambda a, b, c: F.gelu(a, approximate="tanh"), ((6, 5), (1,), (1,))),
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
        P.faults.set_latency_us(20000)  # every kernel now takes >= 20 ms
        try:
            out = a @ a
            pending = not stream.query()
        finally:
            P.faults.set_latency_us(0)
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
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(3, 3, device="phantom") @ torch.randn(3, 3)
    if P.device_count() > 1:
        with pytest.raises(RuntimeError, match="same device"):
            torch.randn(3, 3, device="phantom:0") @ torch.randn(3, 3, device="phantom:1")
    # Nothing was queued that fails later: the device is still clean.
    P.synchronize()
    x = torch.randn(4, 4)
    assert torch.equal((x.to("phantom") @ x.to("phantom")).cpu(), x @ x)


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


def test_an_op_with_a_python_meta_kernel_is_queued_from_its_second_identical_call():
    # index_select's Meta kernel is Python in torch 2.13: too slow to run on
    # every call, so the first call checks the Meta kernel's answer against
    # the CPU's (and waits for it), and later ones are queued with it.
    table = _rand(50, 8)
    index = torch.tensor([3, 1, 4, 1, 5, 9])
    expected = table.index_select(0, index)
    t, i = table.to("phantom"), index.to("phantom")
    torch_phantom.reset_ops_report()
    results = [t.index_select(0, i) for _ in range(5)]
    queued, waited = _paths("aten::index_select")
    assert (queued, waited) == (4, 1)
    for r in results:
        assert torch.equal(r.cpu(), expected)
    # Another shape is another signature: it waits once, then is queued.
    got = [t.index_select(0, i[:3]) for _ in range(2)]
    assert _paths("aten::index_select") == (5, 2)
    for g in got:
        assert torch.equal(g.cpu(), expected[:3])


def test_a_meta_answer_that_differs_from_the_cpu_is_replaced_by_the_cpus():
    # For the CPU's fast path _embedding_bag returns an empty offset2bag;
    # its Meta kernel says one of the indices' length. The memo must see the
    # difference, never use the Meta answer, and remember the CPU's own
    # outputs once a second call has returned the same ones.
    weight = _rand(20, 4)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 3, 5])
    expected = torch._embedding_bag(weight, indices, offsets, False, 0, False, None, False, -1)
    args = [x.to("phantom") for x in (weight, indices, offsets)]
    torch_phantom.reset_ops_report()
    for _ in range(4):
        got = torch._embedding_bag(*args, False, 0, False, None, False, -1)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and torch.equal(g.cpu(), e)
    assert _paths("aten::_embedding_bag") == (2, 2)


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
    assert _paths("aten::addcdiv") == (3, 1)  # addcdiv_ runs as addcdiv.out
    assert torch.equal(pp.cpu(), p)
    # A float argument of an op that is not pointwise still tells signatures
    # apart (here it decides the output's shape).
    for end in (5.0, 7.0, 5.0):
        got = torch.arange(0.0, end, 0.5, device="phantom")
        assert torch.equal(got.cpu(), torch.arange(0.0, end, 0.5))


def test_a_result_that_differs_from_the_one_computed_ahead_fails_loudly():
    # A Meta kernel that is wrong for some data: the queued work must not
    # broadcast the CPU's result into the output computed ahead, but fail
    # with an error naming the op at the next sync.
    lib = torch.library.Library("phantom_test_ahead", "DEF")
    lib.define("head(Tensor x) -> Tensor")
    lib.impl("head", lambda x: x[: int(x[0])].clone(), "CPU")
    lib.impl("head", lambda x: x.new_empty(3), "Meta")
    head = torch.ops.phantom_test_ahead.head
    good = torch.tensor([3.0, 1.0, 2.0, 5.0], device="phantom")
    assert torch.equal(head(good).cpu(), torch.tensor([3.0, 1.0, 2.0]))
    stream = P.Stream()
    with P.stream(stream):
        head(torch.tensor([1.0, 1.0, 2.0, 5.0], device="phantom"))
        with pytest.raises(RuntimeError, match=r"phantom_test_ahead::head.*shape \[1\]"):
            stream.synchronize()
    assert torch.equal(head(good).cpu(), torch.tensor([3.0, 1.0, 2.0]))


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
    assert _paths("aten::native_group_norm") == (2, 1)


def test_an_out_argument_the_call_resizes_is_resized_on_the_host_and_queued():
    # torch.arange(n, device=...) fills an empty out= tensor that the op
    # resizes; the resize is remembered with the signature and made on the
    # host, so positional ids built every forward do not wait.
    torch_phantom.reset_ops_report()
    for n in (5, 5, 5, 9, 9):
        got = torch.arange(n, device="phantom")
        assert got.shape == (n,) and torch.equal(got.cpu(), torch.arange(n))
    assert _paths("aten::arange") == (3, 2)
    a, b = _rand(3, 4), _rand(4, 3).t()
    expected = torch.atan2(a, b)
    pa, pb = a.to("phantom"), b.to("phantom")
    for _ in range(3):
        out = torch.empty(0, device="phantom")
        assert torch.atan2(pa, pb, out=out) is out
        assert out.shape == (3, 4) and torch.equal(out.cpu(), expected)
    assert _paths("aten::atan2") == (2, 1)


def test_a_signature_whose_checking_call_raised_is_checked_again():
    # The first call of a signature checks the Meta answer; if the CPU
    # kernel raises instead (an index out of range: data, not shape), the
    # next call with that signature must check again and then be queued,
    # not wait for a check that never comes.
    table = _rand(10, 4).to("phantom")
    bad = torch.tensor([1, 2, 99], device="phantom")
    good = torch.tensor([1, 2, 3], device="phantom")
    torch_phantom.reset_ops_report()
    with pytest.raises(IndexError, match="out of range"):
        table.index_select(0, bad)
    results = [table.index_select(0, good) for _ in range(3)]
    assert _paths("aten::index_select") == (2, 2)
    for r in results:
        assert torch.equal(r.cpu(), table.cpu()[[1, 2, 3]])
