"""The generic path: ATen ops run on phantom tensors and give the CPU's
results.

Each case builds its inputs on the CPU, runs the same function on the CPU
and on phantom copies of the inputs, and compares with
``torch.testing.assert_close``; the CPU is the oracle. Beyond values, the
tests check what user code depends on: in-place ops return their input,
``out=`` tensors are resized and written, views share storage with their
base, data-dependent shapes work, and seeded random ops draw the CPU's
numbers.
"""

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_case_passed, run_cases_forked


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed + 17 * len(shape))
    return torch.randn(*shape, generator=g).to(dtype)


def to_phantom(obj):
    if isinstance(obj, torch.Tensor):
        return obj.to("phantom")
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_phantom(o) for o in obj)
    return obj


def to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        assert obj.device.type == "phantom", f"result on {obj.device}, not phantom"
        return obj.cpu()
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(o) for o in obj)
    return obj


def check(fn, *inputs, rtol=None, atol=None):
    # Copy first: fn may modify its inputs in place (running stats, ...).
    phantom_inputs = to_phantom(inputs)
    expected = fn(*inputs)
    actual = fn(*phantom_inputs)
    torch.testing.assert_close(to_cpu(actual), expected, rtol=rtol, atol=atol)


IDX = torch.tensor([2, 0, 3, 3])
LABELS = torch.tensor([1, 0, 4, 2, 3, 1])

OPS = {
    # elementwise
    "add": (lambda a, b: a + b, lambda: (rand(4, 5), rand(4, 5, seed=1))),
    "add_broadcast": (lambda a, b: a + b, lambda: (rand(4, 5), rand(5, seed=1))),
    "sub_alpha": (lambda a, b: torch.sub(a, b, alpha=2), lambda: (rand(3, 3), rand(3, 3, seed=1))),
    "mul_scalar": (lambda a: a * 3.5, lambda: (rand(4, 5),)),
    "div": (lambda a, b: a / b, lambda: (rand(4, 5), rand(4, 5, seed=1).abs() + 0.5)),
    "floor_divide_int": (lambda a, b: a // b, lambda: (torch.arange(-10, 10), torch.full((20,), 3))),
    "pow": (lambda a: a.abs() ** 1.7, lambda: (rand(10),)),
    "exp_log": (lambda a: torch.log(torch.exp(a) + 1), lambda: (rand(4, 5),)),
    "sin_cos_tanh": (lambda a: torch.sin(a) * torch.cos(a) + torch.tanh(a), lambda: (rand(30),)),
    "sqrt_rsqrt": (lambda a: a.abs().sqrt() + (a.abs() + 1).rsqrt(), lambda: (rand(30),)),
    "sigmoid_relu_gelu": (lambda a: torch.sigmoid(a) + F.relu(a) + F.gelu(a), lambda: (rand(6, 7),)),
    "clamp": (lambda a: a.clamp(-0.5, 0.5), lambda: (rand(20),)),
    "comparison": (lambda a, b: (a > b) | (a == b), lambda: (rand(10), rand(10, seed=1))),
    "logical_bitwise_int": (lambda a: (a & 3) ^ (a >> 1), lambda: (torch.arange(40),)),
    "abs_neg_sign": (lambda a: a.abs() - a.neg() * a.sign(), lambda: (rand(12),)),
    "where": (lambda c, a, b: torch.where(c > 0, a, b), lambda: (rand(5, 5), rand(5, 5, seed=1), rand(5, 5, seed=2))),
    "where_scalar": (lambda a: torch.where(a > 0, a, 0.0), lambda: (rand(5, 5),)),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.3), lambda: (rand(8), rand(8, seed=1))),
    "float64": (lambda a: a * a - 1 / (a.abs() + 1), lambda: (rand(9, dtype=torch.float64),)),
    "float16": (lambda a: a * 2 + 1, lambda: (rand(9, dtype=torch.float16),)),
    "bfloat16": (lambda a: a * 2 + 1, lambda: (rand(9, dtype=torch.bfloat16),)),
    "complex": (lambda a: a * a + a.abs() - 1j * a.angle(), lambda: (torch.complex(rand(6), rand(6, seed=1)),)),
    "complex_real_imag": (lambda a: a.real * 2 + a.imag, lambda: (torch.complex(rand(6), rand(6, seed=1)),)),
    "type_promotion": (lambda a, b: a + b, lambda: (torch.arange(6), rand(6))),
    "cpu_scalar_tensor_operand": (lambda a: a * torch.tensor(2.5), lambda: (rand(4),)),
    # reductions
    "sum": (lambda a: a.sum(), lambda: (rand(7, 9),)),
    "sum_dim_keepdim": (lambda a: a.sum(dim=1, keepdim=True), lambda: (rand(7, 9),)),
    "mean_var_std": (lambda a: (a.mean(0), a.var(1), a.std()), lambda: (rand(7, 9),)),
    "prod": (lambda a: a.prod(1), lambda: (rand(4, 5),)),
    "max_min_dim": (lambda a: (a.max(1), a.min(0)), lambda: (rand(6, 8),)),
    "argmax_argmin": (lambda a: (a.argmax(), a.argmin(1)), lambda: (rand(6, 8),)),
    "amax_logsumexp": (lambda a: (a.amax(1), torch.logsumexp(a, 1)), lambda: (rand(6, 8),)),
    "norm": (lambda a: (a.norm(), torch.linalg.vector_norm(a, 1, dim=0)), lambda: (rand(6, 8),)),
    "all_any": (lambda a: ((a > -3).all(), (a > 2).any(1)), lambda: (rand(6, 8),)),
    "cumsum_cumprod": (lambda a: (a.cumsum(0), a.cumprod(1)), lambda: (rand(5, 4),)),
    # linear algebra
    "matmul": (lambda a, b: a @ b, lambda: (rand(5, 7), rand(7, 3, seed=1))),
    "matmul_vector": (lambda a, b: a @ b, lambda: (rand(5, 7), rand(7, seed=1))),
    "mm_transposed": (lambda a, b: a.t().mm(b), lambda: (rand(7, 5), rand(7, 3, seed=1))),
    "bmm": (lambda a, b: torch.bmm(a, b), lambda: (rand(3, 4, 5), rand(3, 5, 2, seed=1))),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), lambda: (rand(4, 3), rand(4, 6, seed=1), rand(6, 3, seed=2))),
    "einsum": (lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: (rand(3, 4), rand(4, 2, seed=1))),
    "linear": (lambda x, w, b: F.linear(x, w, b), lambda: (rand(8, 5), rand(3, 5, seed=1), rand(3, seed=2))),
    # nn
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1), lambda: (rand(2, 3, 8, 8), rand(4, 3, 3, 3, seed=1), rand(4, seed=2))),
    "conv2d_strided_groups": (lambda x, w: F.conv2d(x, w, stride=2, groups=2), lambda: (rand(1, 4, 9, 9), rand(6, 2, 3, 3, seed=1))),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), lambda: (rand(2, 3, 8, 8),)),
    "max_pool2d_indices": (lambda x: F.max_pool2d(x, 3, stride=2, return_indices=True), lambda: (rand(1, 2, 9, 9),)),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), lambda: (rand(2, 3, 8, 8),)),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (1, 1)), lambda: (rand(2, 3, 7, 7),)),
    "batch_norm_train": (lambda x, rm, rv, w, b: (F.batch_norm(x, rm, rv, w, b, training=True), rm, rv),
                         lambda: (rand(4, 3, 5, 5), torch.zeros(3), torch.ones(3), rand(3, seed=1), rand(3, seed=2))),
    "batch_norm_eval": (lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False),
                        lambda: (rand(4, 3, 5, 5), rand(3, seed=1), rand(3, seed=2).abs() + 0.5)),
    "layer_norm": (lambda x: F.layer_norm(x, (6,)), lambda: (rand(4, 6),)),
    "softmax": (lambda x: F.softmax(x, dim=1), lambda: (rand(4, 10),)),
    "log_softmax": (lambda x: F.log_softmax(x, dim=-1), lambda: (rand(4, 10),)),
    "cross_entropy": (lambda x, y: F.cross_entropy(x, y), lambda: (rand(6, 5), LABELS)),
    "nll_loss_none": (lambda x, y: F.nll_loss(F.log_softmax(x, 1), y, reduction="none"), lambda: (rand(6, 5), LABELS)),
    "mse_loss": (lambda a, b: F.mse_loss(a, b), lambda: (rand(4, 4), rand(4, 4, seed=1))),
    "embedding": (lambda w, i: F.embedding(i, w), lambda: (rand(10, 4), torch.tensor([[1, 2, 4], [4, 3, 9]]))),
    # indexing
    "index_select": (lambda a, i: a.index_select(0, i), lambda: (rand(5, 3), IDX)),
    "gather": (lambda a, i: a.gather(1, i), lambda: (rand(3, 4), torch.tensor([[0, 1], [3, 3], [2, 0]]))),
    "scatter": (lambda a, i, s: a.scatter(1, i, s), lambda: (torch.zeros(3, 5), torch.tensor([[0, 4], [1, 2], [3, 3]]), rand(3, 2))),
    "scatter_add": (lambda a, i, s: a.scatter_add(0, i, s), lambda: (torch.zeros(4), torch.tensor([0, 1, 1, 3, 0]), rand(5))),
    "index_tensor": (lambda a, i: a[i], lambda: (rand(6, 2), IDX)),
    "index_bool_mask": (lambda a: a[a > 0], lambda: (rand(6, 5),)),
    "index_put": (lambda a, i, v: a.index_put((i,), v, accumulate=True), lambda: (torch.zeros(5), IDX, rand(4))),
    "masked_fill": (lambda a: a.masked_fill(a < 0, -1.0), lambda: (rand(5, 5),)),
    "masked_select": (lambda a: torch.masked_select(a, a > 0.3), lambda: (rand(6, 6),)),
    "nonzero": (lambda a: torch.nonzero(a > 0), lambda: (rand(5, 4),)),
    "nonzero_as_tuple": (lambda a: torch.nonzero(a > 0, as_tuple=True), lambda: (rand(5, 4),)),
    "unique": (lambda a: torch.unique(a, return_counts=True), lambda: (torch.tensor([3, 1, 3, 2, 1, 1]),)),
    # shape
    "cat": (lambda a, b: torch.cat([a, b], dim=1), lambda: (rand(3, 2), rand(3, 4, seed=1))),
    "stack": (lambda a, b: torch.stack([a, b]), lambda: (rand(3, 2), rand(3, 2, seed=1))),
    "split": (lambda a: [t.contiguous() for t in a.split([1, 3], dim=0)], lambda: (rand(4, 3),)),
    "chunk": (lambda a: a.chunk(3, dim=1), lambda: (rand(2, 6),)),
    "flip_roll": (lambda a: (a.flip(1), a.roll(2, 0)), lambda: (rand(4, 5),)),
    "repeat_tile": (lambda a: (a.repeat(2, 3), a.tile((3,))), lambda: (rand(2, 2),)),
    "tril_triu": (lambda a: (a.tril(), a.triu(1)), lambda: (rand(4, 4),)),
    "pad": (lambda a: F.pad(a, (1, 2, 0, 1), value=0.5), lambda: (rand(3, 3),)),
    # sorting
    "sort": (lambda a: a.sort(dim=1), lambda: (rand(4, 7),)),
    "sort_descending_stable": (lambda a: torch.sort(a, descending=True, stable=True), lambda: (torch.tensor([3, 1, 3, 2, 1, 1]),)),
    "argsort": (lambda a: a.argsort(0), lambda: (rand(7, 3),)),
    "topk": (lambda a: a.topk(3, dim=1), lambda: (rand(4, 9),)),
    "kthvalue": (lambda a: a.kthvalue(2, dim=0), lambda: (rand(5, 3),)),
}


@pytest.mark.parametrize("name", OPS, ids=str)
def test_op_matches_cpu(name):
    fn, make_inputs = OPS[name]
    check(fn, *make_inputs())


CONJ_OPS = {
    "mul_by_conj": "lambda a: a * a.conj()",
    "matmul_conj_transpose": "lambda a: a @ a.mH",
    "conj_physical": "lambda a: torch.conj_physical(a)",
    "sum_of_conj": "lambda a: a.conj().sum(0)",
    "vdot": "lambda a: torch.vdot(a[0], a[1])",
}


@pytest.fixture(scope="module")
def conj_op_results():
    # Each case runs in its own process: a conjugate view reaching the
    # backend has crashed the process (unbounded recursion) instead of
    # raising, which would take the whole suite down.
    prelude = """
g = torch.Generator().manual_seed(0)
a = torch.complex(torch.randn(3, 3, generator=g), torch.randn(3, 3, generator=g))
"""
    check = """
expected = fn(a)
actual = fn(a.to("phantom"))
assert actual.device.type == "phantom", actual.device
torch.testing.assert_close(actual.cpu().resolve_conj(), expected.resolve_conj())
"""
    return run_cases_forked({k: f"fn = {v}\n{check}" for k, v in CONJ_OPS.items()}, prelude)


@pytest.mark.parametrize("name", CONJ_OPS, ids=str)
def test_ops_on_conjugate_views(name, conj_op_results):
    assert_case_passed(conj_op_results, name)


RECURRENT = {
    "LSTM": "torch.nn.LSTM(3, 4, num_layers=2)",
    "GRU": "torch.nn.GRU(3, 4)",
    "RNN": "torch.nn.RNN(3, 4)",
    "LSTMCell": "torch.nn.LSTMCell(3, 4)",
    "GRUCell": "torch.nn.GRUCell(3, 4)",
}


@pytest.fixture(scope="module")
def crash_prone_results():
    # Each case runs in its own process: these have crashed the process
    # (an op with no CPU kernel reached the generic path) instead of raising.
    check_module = """
import copy
torch.manual_seed(0)
m_cpu = {module}
m = copy.deepcopy(m_cpu).phantom()
x = torch.randn(5, 3) if "Cell" not in "{name}" else torch.randn(2, 3)
out_cpu = m_cpu(x)
out = m(x.phantom())
flat_cpu = out_cpu[0] if isinstance(out_cpu, tuple) else out_cpu
flat = out[0] if isinstance(out, tuple) else out
assert flat.device.type == "phantom"
torch.testing.assert_close(flat.cpu(), flat_cpu)
flat_cpu.sum().backward()
flat.sum().backward()
for (n, p_cpu), (_, p) in zip(m_cpu.named_parameters(), m.named_parameters()):
    torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, msg=n)
"""
    cases = {name: check_module.format(module=module, name=name) for name, module in RECURRENT.items()}
    cases["op_without_cpu_kernel"] = """
x = torch.ones(8, device="phantom")
try:
    torch._fused_dropout(x, 0.5)  # has CUDA kernels only
except NotImplementedError as error:
    assert "aten::_fused_dropout has no phantom kernel, and no CPU kernel" in str(error), error
else:
    raise AssertionError("_fused_dropout ran on phantom without a kernel")
assert (x * 2).sum().item() == 16
"""
    return run_cases_forked(cases)


@pytest.mark.parametrize("name", RECURRENT, ids=str)
def test_recurrent_layers_match_cpu(name, crash_prone_results):
    assert_case_passed(crash_prone_results, name)


def test_op_without_cpu_kernel_raises_instead_of_crashing(crash_prone_results):
    assert_case_passed(crash_prone_results, "op_without_cpu_kernel")


def test_ops_on_device_1_stay_on_device_1(two_devices):
    a = rand(4, 4).to("phantom:1")
    b = rand(4, 4, seed=1).to("phantom:1")
    out = torch.mm(a, b).relu().sum(0)
    assert out.device == torch.device("phantom:1")
    torch.testing.assert_close(out.cpu(), torch.mm(a.cpu(), b.cpu()).relu().sum(0))


def test_non_contiguous_inputs():
    a = rand(6, 8)
    b = rand(8, 6, seed=1)
    check(lambda x, y: x[::2].t() + y[:, ::2], a, b)
    check(lambda x, y: x.t() @ y.t(), a, b)


# --------------------------------------------------------------------------
# In-place ops and out=
# --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["add_", "mul_", "sub_", "div_", "copy_"])
def test_in_place_returns_input(method):
    a_cpu, b_cpu = rand(3, 4), rand(3, 4, seed=1).abs() + 1
    a = a_cpu.to("phantom")
    result = getattr(a, method)(b_cpu.to("phantom"))
    assert result is a
    getattr(a_cpu, method)(b_cpu)
    torch.testing.assert_close(a.cpu(), a_cpu)


def test_in_place_unary_and_scalar():
    a_cpu = rand(10)
    a = a_cpu.to("phantom")
    assert a.relu_() is a
    assert a.add_(1.5) is a
    assert a.mul_(2) is a
    a_cpu.relu_().add_(1.5).mul_(2)
    torch.testing.assert_close(a.cpu(), a_cpu)
    assert a.zero_() is a
    assert a.fill_(3.0) is a
    torch.testing.assert_close(a.cpu(), torch.full((10,), 3.0))


def test_in_place_on_view_updates_base():
    base_cpu = rand(4, 6)
    base = base_cpu.to("phantom")
    view = base[1:3, ::2]
    assert view.mul_(10) is view
    base_cpu[1:3, ::2].mul_(10)
    torch.testing.assert_close(base.cpu(), base_cpu)


def test_out_resizes_empty_tensor():
    a_cpu, b_cpu = rand(3, 4), rand(3, 4, seed=1)
    out = torch.empty(0, device="phantom")
    result = torch.add(a_cpu.to("phantom"), b_cpu.to("phantom"), out=out)
    assert result is out
    assert out.shape == (3, 4) and out.is_phantom
    torch.testing.assert_close(out.cpu(), a_cpu + b_cpu)


def test_out_variants_of_reductions_and_matmul():
    a_cpu, b_cpu = rand(3, 4), rand(4, 5, seed=1)
    out = torch.empty(0, device="phantom")
    assert torch.mm(a_cpu.to("phantom"), b_cpu.to("phantom"), out=out) is out
    torch.testing.assert_close(out.cpu(), a_cpu @ b_cpu)
    s = torch.empty(0, device="phantom")
    assert torch.sum(a_cpu.to("phantom"), 1, out=s) is s
    torch.testing.assert_close(s.cpu(), a_cpu.sum(1))
    values = torch.empty(0, device="phantom")
    indices = torch.empty(0, dtype=torch.int64, device="phantom")
    torch.sort(a_cpu.to("phantom"), 1, out=(values, indices))
    ev, ei = torch.sort(a_cpu, 1)
    torch.testing.assert_close(values.cpu(), ev)
    torch.testing.assert_close(indices.cpu(), ei)


def test_out_with_wrong_size_is_resized():
    a_cpu = rand(5)
    out = torch.zeros(2, 2, device="phantom")
    torch.neg(a_cpu.to("phantom"), out=out)
    assert out.shape == (5,)
    torch.testing.assert_close(out.cpu(), -a_cpu)


def test_out_into_non_contiguous_view():
    a_cpu = rand(3, 3)
    base = torch.zeros(3, 6, device="phantom")
    torch.exp(a_cpu.to("phantom"), out=base[:, ::2])
    expected = torch.zeros(3, 6)
    torch.exp(a_cpu, out=expected[:, ::2])
    torch.testing.assert_close(base.cpu(), expected)


# --------------------------------------------------------------------------
# Views share storage with their base
# --------------------------------------------------------------------------

VIEWS = {
    "view": lambda t: t.view(4, 6),
    "reshape": lambda t: t.reshape(2, 12),
    "transpose": lambda t: t.transpose(0, 1),
    "narrow": lambda t: t.narrow(1, 2, 3),
    "unfold": lambda t: t.unfold(1, 2, 2),
    "diagonal": lambda t: t.diagonal(),
    "expand": lambda t: t[:1].expand(5, 6),
    "squeeze": lambda t: t[:, :1].squeeze(1),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "as_strided": lambda t: t.as_strided((3, 3), (7, 1), 1),
    "select": lambda t: t[2],
    "slice_step": lambda t: t[::2, 1::2],
    "permute": lambda t: t.permute(1, 0),
    "flatten": lambda t: t.flatten(),
    "real_of_complex": lambda t: torch.view_as_real(torch.view_as_complex(t.view(4, 3, 2)))[0],
}


@pytest.mark.parametrize("name", VIEWS, ids=str)
def test_view_shares_storage_and_writes_through(name):
    make_view = VIEWS[name]
    base_cpu = torch.arange(24.0).reshape(4, 6)
    base = base_cpu.to("phantom")
    view = make_view(base)
    view_cpu = make_view(base_cpu)
    assert view.is_phantom
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert view.shape == view_cpu.shape
    assert view.stride() == view_cpu.stride()
    assert view.storage_offset() == view_cpu.storage_offset()
    torch.testing.assert_close(view.cpu(), view_cpu)
    # A write into the base is visible through the view ...
    base.add_(100)
    base_cpu.add_(100)
    torch.testing.assert_close(view.cpu(), view_cpu)
    # ... and a write through the view is visible in the base (an expanded
    # view has overlapping elements, which cannot be written in place).
    if name != "expand":
        view.mul_(-1)
        view_cpu.mul_(-1)
        torch.testing.assert_close(base.cpu(), base_cpu)


def test_setitem_writes_device_memory():
    base_cpu = torch.zeros(4, 5)
    base = base_cpu.to("phantom")
    base[1] = 3.0
    base[:, 2] = torch.arange(4.0).to("phantom")
    base[2:, 3:] = torch.tensor(7.0)
    base_cpu[1] = 3.0
    base_cpu[:, 2] = torch.arange(4.0)
    base_cpu[2:, 3:] = torch.tensor(7.0)
    torch.testing.assert_close(base.cpu(), base_cpu)


def test_contiguous_of_view_is_a_copy():
    base = torch.arange(12.0).reshape(3, 4).to("phantom")
    c = base.t().contiguous()
    assert c.is_contiguous()
    assert c.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    c.zero_()
    torch.testing.assert_close(base.cpu(), torch.arange(12.0).reshape(3, 4))


# --------------------------------------------------------------------------
# Host values
# --------------------------------------------------------------------------


def test_item():
    x = torch.tensor([1.5, 2.5, -4.0]).to("phantom")
    assert x.sum().item() == 0.0
    assert x[1].item() == 2.5
    assert torch.tensor(7, device="phantom").item() == 7
    assert torch.tensor(True, device="phantom").item() is True
    assert x.max().item() == 2.5


def test_tolist_and_numpy_via_cpu():
    cpu = torch.arange(6).reshape(2, 3)
    x = cpu.to("phantom")
    assert x.tolist() == cpu.tolist()
    assert (x.cpu().numpy() == cpu.numpy()).all()


def test_python_scalar_conversions_and_control_flow():
    x = torch.tensor([3.0, -1.0], device="phantom")
    assert float(x[0]) == 3.0
    assert int(x[1]) == -1
    assert bool(x[0] > x[1])
    assert bool((x > 0).any())


# --------------------------------------------------------------------------
# Random numbers: seeded phantom draws equal the CPU's
# --------------------------------------------------------------------------

RANDOM_FACTORIES = {
    "randn": lambda device, g=None: torch.randn(5, 7, device=device, generator=g),
    "rand": lambda device, g=None: torch.rand(100, device=device, generator=g),
    "randint": lambda device, g=None: torch.randint(0, 10, (50,), device=device, generator=g),
    "randperm": lambda device, g=None: torch.randperm(20, device=device, generator=g),
    "normal_": lambda device, g=None: torch.empty(30, device=device).normal_(2.0, 3.0, generator=g),
    "uniform_": lambda device, g=None: torch.empty(30, device=device).uniform_(-1, 1, generator=g),
    "bernoulli": lambda device, g=None: torch.bernoulli(torch.full((40,), 0.3, device=device), generator=g),
    "multinomial": lambda device, g=None: torch.multinomial(torch.tensor([0.1, 0.2, 0.7], device=device), 10, True, generator=g),
}


@pytest.mark.parametrize("name", RANDOM_FACTORIES, ids=str)
def test_manual_seed_matches_cpu(name):
    make = RANDOM_FACTORIES[name]
    torch.manual_seed(0)
    expected = make("cpu")
    torch.manual_seed(0)
    actual = make("phantom")
    assert actual.is_phantom
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", RANDOM_FACTORIES, ids=str)
def test_explicit_generator_matches_cpu(name):
    make = RANDOM_FACTORIES[name]
    g_cpu = torch.Generator().manual_seed(1)
    g = torch.Generator(device="phantom").manual_seed(1)
    assert g.device.type == "phantom"
    expected = [make("cpu", g_cpu) for _ in range(2)]
    actual = [make("phantom", g) for _ in range(2)]
    torch.testing.assert_close([a.cpu() for a in actual], expected, rtol=0, atol=0)


def test_seeded_sequences_repeat():
    torch.manual_seed(123)
    a = torch.randn(10, device="phantom")
    b = torch.randn(10, device="phantom")
    assert not torch.equal(a.cpu(), b.cpu())
    torch.manual_seed(123)
    torch.testing.assert_close(torch.randn(10, device="phantom").cpu(), a.cpu())
    torch.testing.assert_close(torch.randn(10, device="phantom").cpu(), b.cpu())


def test_phantom_manual_seed_and_rng_state():
    torch.phantom.manual_seed(5)
    state = torch.phantom.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    a = torch.rand(8, device="phantom")
    torch.phantom.set_rng_state(state)
    torch.testing.assert_close(torch.rand(8, device="phantom").cpu(), a.cpu())
    assert torch.phantom.initial_seed() == 5


def test_device_generators_are_independent(two_devices):
    torch.manual_seed(0)
    a0 = torch.randn(6, device="phantom:0")
    a1 = torch.randn(6, device="phantom:1")
    # manual_seed seeds every device: both draw the CPU's first numbers.
    torch.manual_seed(0)
    expected = torch.randn(6)
    torch.testing.assert_close(a0.cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(a1.cpu(), expected, rtol=0, atol=0)


def test_generator_of_wrong_device_is_rejected():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError, match="expected a generator of device phantom:0 but got one "
                                           "of device cpu"):
        torch.randn(3, device="phantom", generator=g)
    # and the device still works afterwards
    assert torch.randn(3, device="phantom").shape == (3,)


def test_dropout_with_seed_matches_cpu():
    x_cpu = rand(8, 16)
    torch.manual_seed(3)
    expected = F.dropout(x_cpu, p=0.4, training=True)
    torch.manual_seed(3)
    actual = F.dropout(x_cpu.to("phantom"), p=0.4, training=True)
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)
    # Module form, and eval mode is the identity.
    drop = torch.nn.Dropout(0.5)
    torch.manual_seed(4)
    expected = drop(x_cpu)
    torch.manual_seed(4)
    torch.testing.assert_close(drop(x_cpu.to("phantom")).cpu(), expected, rtol=0, atol=0)
    drop.eval()
    torch.testing.assert_close(drop(x_cpu.to("phantom")).cpu(), x_cpu, rtol=0, atol=0)


# -- The hot elementwise ops: native kernels that only queue ----------------

def _native_calls(op_name):
    # In-place forms are counted under their own name (aten::relu_) or the
    # op's (aten::add).
    return sum(row["native"] for row in torch_phantom.ops_report()
               if row["op"] in (op_name, op_name + "_"))


import torch_phantom  # noqa: E402
from torch_phantom.testing import faults  # noqa: E402


@pytest.mark.parametrize("case", [
    ("aten::add", lambda x, y: x + y),
    ("aten::add", lambda x, y: torch.add(x, y, alpha=-0.5)),
    ("aten::sub", lambda x, y: x - 2.0),
    ("aten::mul", lambda x, y: x * y[0]),
    ("aten::div", lambda x, y: x / y),
    ("aten::relu", lambda x, y: torch.relu(x)),
    ("aten::add", lambda x, y: x.add_(y)),
    ("aten::mul", lambda x, y: x.mul_(x)),
    ("aten::relu", lambda x, y: x.relu_()),
    ("aten::div", lambda x, y: torch.div(x, y, out=torch.empty_like(x))),
], ids=["add", "add_alpha", "sub_scalar", "mul_bcast_0d", "div", "relu",
        "add_", "mul_self", "relu_", "div_out"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.requires_kernel_view(
    "native kernels step aside without a kernel view")
def test_hot_elementwise_ops_are_queued_and_match_cpu(case, dtype):
    op_name, fn = case
    x = torch.randn(6, 5, dtype=dtype)
    y = torch.rand(5, dtype=dtype) + 0.5
    expected = fn(x.clone(), y)
    before = _native_calls(op_name)
    got = fn(x.to("phantom"), y.to("phantom"))
    assert _native_calls(op_name) > before, "did not take the native kernel"
    assert got.device.type == "phantom" and got.dtype == expected.dtype
    assert torch.equal(got.cpu(), expected)


def test_hot_elementwise_cpu_scalars_promote_as_on_cpu_and_are_read_at_the_call():
    # A 0-dim CPU tensor and a Python number promote differently (int64
    # tensor * float64 0-dim tensor is float64, * 2.5 is float32); both
    # must give the CPU's dtype and values.
    i = torch.arange(6)
    x = torch.randn(6)
    scalar = torch.tensor(2.5, dtype=torch.float64)
    for fn in (lambda t: t * scalar, lambda t: t * 2.5, lambda t: t / scalar,
               lambda t: torch.add(t, scalar, alpha=3)):
        for base in (i, x):
            expected = fn(base)
            got = fn(base.to("phantom"))
            assert got.dtype == expected.dtype
            assert torch.equal(got.cpu(), expected)
    # The CPU scalar's value is taken when the op is called, as CUDA passes
    # it to the kernel by value: changing it before the device runs the op
    # must not change the result.
    torch.phantom.synchronize()
    y = torch.randn(1000, device="phantom")
    side = torch.phantom.Stream()
    side.wait_stream(torch.phantom.current_stream())  # y is written on the default stream
    with torch.phantom.stream(side):
        faults.set_latency_us(20000)  # the kernel runs late
        try:
            value = torch.tensor(3.0)
            out = y * value
            value.fill_(-1.0)
        finally:
            faults.set_latency_us(0)
    torch.phantom.synchronize()
    assert torch.equal(out.cpu(), y.cpu() * 3.0)


@pytest.mark.requires_kernel_view(
    "native kernels step aside without a kernel view")
def test_integer_and_strided_binary_ops_are_native_with_the_cpus_layout():
    i = torch.arange(12).reshape(3, 4)
    t = torch.randn(4, 6)
    cases = [
        ("aten::add", lambda a, b: a + 3),          # integer result
        ("aten::mul", lambda a, b: a * a),
        ("aten::div", lambda a, b: a / 2),           # integer inputs, float result
        ("aten::add", lambda a, b: b.t() + 1),       # strided input
        ("aten::mul", lambda a, b: b.t() * b.t()),
        ("aten::sub", lambda a, b: b[:, ::2] - 0.5),
    ]
    for op, fn in cases:
        expected = fn(i, t)
        before = _native_calls(op)
        got = fn(i.to("phantom"), t.to("phantom"))
        assert _native_calls(op) > before, f"{op} did not take the native kernel"
        assert got.dtype == expected.dtype and got.stride() == expected.stride()
        assert torch.equal(got.cpu(), expected)
    # What the CPU refuses is refused at the call, with the CPU's message.
    b = torch.tensor([True, False])
    with pytest.raises(RuntimeError) as cpu_error:
        b - b
    with pytest.raises(RuntimeError) as phantom_error:
        b.to("phantom") - b.to("phantom")
    assert str(phantom_error.value) == str(cpu_error.value)


def test_relu_matches_cpu_bit_for_bit_on_special_values():
    x = torch.tensor([float("nan"), -0.0, 0.0, -1.0, 2.0, float("-inf"), float("inf")])
    for fn in (torch.relu, lambda t: t.clone().relu_(), torch.nn.functional.relu):
        got = fn(x.to("phantom")).cpu()
        expected = fn(x)
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


def test_hot_elementwise_ops_on_two_devices_raise_at_the_call():
    if torch.phantom.device_count() < 2:
        pytest.skip("needs two phantom devices")
    a = torch.randn(4, device="phantom:0")
    b = torch.randn(4, device="phantom:1")
    for fn in (lambda: a + b, lambda: a.mul_(b), lambda: torch.div(a, b, out=a)):
        with pytest.raises(RuntimeError, match="same device"):
            fn()


def test_hot_elementwise_ops_outside_the_fast_cases_keep_cpu_behaviour():
    # Each of these must keep raising at the call, as on the CPU: the fast
    # path must not queue them (a queued failure would surface later).
    i = torch.arange(6, device="phantom")
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.mul_(1.5)  # integer result of a float product
    x = torch.randn(3, 1, device="phantom")
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        x.add_(torch.randn(3, 4, device="phantom"))
    base = torch.randn(8, device="phantom")
    with pytest.raises(RuntimeError, match="memory location"):
        torch.add(base[:6], 1.0, out=base[2:])  # partial overlap
    # Integer and non-contiguous inputs still match the CPU (general path).
    assert torch.equal((i * 3).cpu(), torch.arange(6) * 3)
    t = torch.randn(4, 6)
    assert torch.equal((t.to("phantom").t() + 1).cpu(), t.t() + 1)
    assert (t.to("phantom").t() + 1).stride() == (t.t() + 1).stride()
