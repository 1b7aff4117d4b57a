"""Remembered output geometries (ops/phantom/ops/OutputGeometry.h): a
structured native kernel called again with the same geometry key takes its
output's sizes, strides and dtype from a memo instead of the meta function.
Each test calls an op first with arguments that fill the memo, then with
arguments that differ only in what the key must hold (strides, a scalar's
value, the default dtype, a dim), and checks that phantom gives the CPU's
answer, layout and error every time."""
import pytest
import torch
import torch.nn.functional as F

import torch_phantom

pytestmark = pytest.mark.requires_kernel_view(
    "checks that ops take the native kernels, which run over the kernel view")


def _native(op):
    return sum(r["native"] for r in torch_phantom.ops_report() if r["op"] == op)


def _same_as_cpu(fn, *inputs):
    expected = fn(*inputs)
    got = fn(*(t.to("phantom") for t in inputs))
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_the_same_sizes_with_other_strides_get_the_cpus_layout():
    x = _rand(5, 5, 5)
    # Four views of one size whose CPU results are laid out as they are.
    views = [lambda t: t, lambda t: t.transpose(0, 2), lambda t: t.permute(1, 2, 0),
             lambda t: t.permute(2, 0, 1)]
    before = _native("aten::sigmoid")
    for _ in range(2):  # the second round is served from the memo
        for view in views:
            _same_as_cpu(lambda t: torch.sigmoid(view(t)), x)
            _same_as_cpu(lambda t: torch.neg(view(t)), x)
    assert _native("aten::sigmoid") == before + 2 * len(views)


def test_each_dim_and_keepdim_of_a_reduction_gets_its_own_output():
    x = _rand(3, 4, 5)
    for _ in range(2):
        for dim in (0, 1, 2, (0, 2)):
            for keepdim in (False, True):
                _same_as_cpu(lambda t: t.sum(dim=dim, keepdim=keepdim), x)
                _same_as_cpu(lambda t: t.mean(dim=dim, keepdim=keepdim), x)
        for dim in (0, 1, 2):
            _same_as_cpu(lambda t: torch.cat([t, t * 2], dim=dim), x)
            _same_as_cpu(lambda t: torch.softmax(t, dim), x)


def test_a_check_on_a_scalars_value_is_made_on_every_call():
    x = torch.arange(6).reshape(2, 3)
    dx = x.to("phantom")
    assert torch.equal((dx ** 2).cpu(), x ** 2)
    assert torch.equal((dx ** 3).cpu(), x ** 3)
    # The same call signature as above but for the exponent's value, which
    # the CPU refuses.
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        dx ** -1
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        x ** -1
    torch.phantom.synchronize()  # nothing bad was queued
    assert torch.equal((dx ** 2).cpu(), x ** 2)


def test_the_default_dtype_decides_a_remembered_result_type():
    x = torch.arange(6).reshape(2, 3)
    previous = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            _same_as_cpu(lambda t: t ** 2.5, x)
            assert (x.to("phantom") ** 2.5).dtype == default
    finally:
        torch.set_default_dtype(previous)


def test_a_call_refused_after_accepted_ones_is_refused_at_the_call():
    a, b = _rand(4, 5), _rand(5, 3, seed=1)
    da, db = a.to("phantom"), b.to("phantom")
    for _ in range(2):
        assert torch.equal((da @ db).cpu(), a @ b)
        with pytest.raises(RuntimeError, match="cannot be multiplied") as error:
            da @ da
        with pytest.raises(RuntimeError) as cpu_error:
            a @ a
        assert str(error.value) == str(cpu_error.value)
        del error, cpu_error


def test_more_geometries_than_the_memo_holds_still_match_the_cpu():
    # 600 lengths: past the memo's 512 keys per op, calls take the full path.
    before = _native("aten::neg")
    for n in range(1, 601):
        x = _rand(n, seed=n)
        assert torch.equal(torch.neg(x.to("phantom")).cpu(), -x)
    assert _native("aten::neg") == before + 600


def test_remembered_linear_and_its_backward_train_like_the_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Sigmoid(),
                                torch.nn.Linear(16, 1))
    device_model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Sigmoid(),
                                       torch.nn.Linear(16, 1)).to("phantom")
    device_model.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    device_opt = torch.optim.SGD(device_model.parameters(), lr=0.1)
    for step in range(4):
        # Batches of two sizes, alternating: both geometries are remembered.
        x = _rand(8 if step % 2 else 3, 6, seed=step)
        for m, o, t in ((model, opt, x), (device_model, device_opt, x.to("phantom"))):
            o.zero_grad()
            F.mse_loss(m(t), t[:, :1]).backward()
            o.step()
    for p, q in zip(model.parameters(), device_model.parameters()):
        assert torch.equal(p, q.cpu())


def test_integer_indexing_gets_each_placement_and_layout_its_own_output():
    x = _rand(4, 4, 4)
    r, c = torch.triu_indices(4, 4, 1)
    dx, dr, dc = x.to("phantom"), r.to("phantom"), c.to("phantom")
    before = _native("aten::index")
    # The same index tensors, placed differently, over differently laid out
    # inputs: each has the CPU's shape and strides.
    calls = [lambda t, r, c: t[:, r, c], lambda t, r, c: t[r, c],
             lambda t, r, c: t[r, :, c], lambda t, r, c: t.transpose(0, 2)[:, r, c],
             lambda t, r, c: t[:, :, r]]
    for _ in range(2):
        for call in calls:
            expected = call(x, r, c)
            got = call(dx, dr, dc)
            assert (got.shape, got.stride()) == (expected.shape, expected.stride())
            assert torch.equal(got.cpu(), expected)
    assert _native("aten::index") == before + 2 * len(calls)


def test_binary_ops_by_meta_get_each_layout_dtype_and_alpha_check():
    # Gradients summed by autograd (a transposed and a plain tensor) and
    # integer results take the binary ops' meta path, remembered too.
    x, y = _rand(5, 5), _rand(5, 5, seed=1)
    i, j = torch.arange(25).reshape(5, 5), torch.arange(25, 50).reshape(5, 5)
    before = _native("aten::add")
    for _ in range(2):
        _same_as_cpu(lambda a, b: a.t() + b, x, y)
        _same_as_cpu(lambda a, b: a + b.t(), x, y)
        _same_as_cpu(lambda a, b: a.t() * b.t(), x, y)
        _same_as_cpu(lambda a, b: a - b, i, j)
        _same_as_cpu(lambda a, b: a.t() + b, i, j)
        _same_as_cpu(lambda a, b: torch.add(a, b, alpha=3), i, j)
        _same_as_cpu(lambda a: a.t() + 2.5, i)
        _same_as_cpu(lambda a: a.t() + 2, i)
        _same_as_cpu(lambda a, b: (a > 3) + (b > 30), i, j)
    assert _native("aten::add") == before + 2 * 7
    # An alpha the CPU refuses for integer tensors, after ones it took with
    # the same tensors: refused at the call.
    di, dj = i.to("phantom"), j.to("phantom")
    with pytest.raises(RuntimeError, match="alpha must not be a floating point") as error:
        torch.add(di, dj, alpha=2.5)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.add(i, j, alpha=2.5)
    assert str(error.value) == str(cpu_error.value)
    del error, cpu_error
    torch.phantom.synchronize()
