"""Native kernels for EmbeddingBag and log_sigmoid (ops/Embedding.cpp): the
sparse-feature ops of a DLRM step. Each is checked to take the native path,
to give the CPU kernel's outputs (all four of _embedding_bag's, with their
shapes, dtypes and strides) and gradients bit for bit, to raise the CPU's
error at the call, and to leave what it does not handle to the generic
path, which still gives the CPU's answer."""
import pytest
import torch
import torch.nn.functional as F

import torch_phantom

pytestmark = pytest.mark.requires_kernel_view(
    "checks that ops take the native kernels, which run over the kernel view")

P = torch.phantom
MODES = {"sum": 0, "mean": 1, "max": 2}


def _count(op, path="native"):
    return sum(r[path] for r in torch_phantom.ops_report() if r["op"] == op)


def _generic(*ops):
    return sum(r["async"] + r["sync"] for r in torch_phantom.ops_report() if r["op"] in ops)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _bags(rows=10, dim=4, index_dtype=torch.int64, include_last_offset=False, dtype=torch.float32):
    """A table and bags with an empty one in the middle: offsets 0, 2, 2, 5
    over 7 indices (and the final offset 7 with include_last_offset)."""
    weight = torch.randn(rows, dim, generator=_gen(), dtype=torch.float64).to(dtype)
    indices = torch.tensor([1, 2, 9, 0, 3, 3, 7], dtype=index_dtype)
    offsets = [0, 2, 2, 5] + ([7] if include_last_offset else [])
    return weight, indices, torch.tensor(offsets, dtype=index_dtype)


def _to(device, *tensors):
    return [None if t is None else t.detach().clone().to(device) for t in tensors]


def _assert_same(cpu, got):
    """Same shape, dtype, strides and bits."""
    got = got.cpu() if got.device.type != "cpu" else got
    assert (got.shape, got.dtype, got.stride()) == (cpu.shape, cpu.dtype, cpu.stride())
    assert torch.equal(got, cpu)


CONFIGS = [
    # mode, per_sample_weights, include_last_offset, padding_idx
    ("sum", False, False, -1),
    ("sum", True, False, -1),
    ("sum", True, True, -1),
    ("sum", False, True, 3),
    ("sum", True, False, 3),
    ("mean", False, False, -1),
    ("mean", False, True, 3),
    ("max", False, False, -1),
    ("max", False, True, 3),
]


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(map(str, c)) for c in CONFIGS])
def test_embedding_bag_forward_and_backward_are_native_and_match_the_cpu(config, index_dtype):
    mode, weighted, include_last_offset, padding_idx = config
    weight, indices, offsets = _bags(index_dtype=index_dtype, include_last_offset=include_last_offset)
    weights = torch.rand(indices.shape[0], generator=_gen(1)) if weighted else None

    def run(device):
        w, i, o, s = _to(device, weight, indices, offsets, weights)
        w.requires_grad_()
        outs = torch.ops.aten._embedding_bag(w, i, o, False, MODES[mode], False, s,
                                             include_last_offset, padding_idx)
        (outs[0] * torch.arange(1.0, 5.0, device=device)).sum().backward()
        return outs, w.grad

    expected, expected_grad = run("cpu")
    torch_phantom.reset_ops_report()
    got, grad = run("phantom")
    P.synchronize()
    assert _count("aten::_embedding_bag") == 1
    assert _count("aten::_embedding_bag_backward") == 1
    # Nothing went to the generic path: neither the ops nor the device ops
    # that rebuild offset2bag for ATen's device-generic backward.
    assert _generic("aten::_embedding_bag", "aten::_embedding_bag_dense_backward",
                    "aten::index_add", "aten::cumsum", "aten::sub_") == 0
    for cpu, out in zip(expected, got):
        _assert_same(cpu, out)
    _assert_same(expected_grad, grad)


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(map(str, c)) for c in CONFIGS])
def test_embedding_bag_forward_only_is_native_and_matches_the_cpu(config):
    """A table that does not require grad: the CPU gives bag_size one entry
    per offset (sum mode), or per bag."""
    mode, weighted, include_last_offset, padding_idx = config
    weight, indices, offsets = _bags(include_last_offset=include_last_offset)
    weights = torch.rand(indices.shape[0], generator=_gen(1)) if weighted else None
    args = (False, MODES[mode], False)
    expected = torch.ops.aten._embedding_bag_forward_only(
        weight, indices, offsets, *args, weights, include_last_offset, padding_idx)
    torch_phantom.reset_ops_report()
    got = torch.ops.aten._embedding_bag_forward_only(
        *_to("phantom", weight, indices, offsets), *args,
        *_to("phantom", weights), include_last_offset, padding_idx)
    assert _count("aten::_embedding_bag_forward_only") == 1
    for cpu, out in zip(expected, got):
        _assert_same(cpu, out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_in_other_float_dtypes_matches_the_cpu(dtype, mode):
    weight, indices, offsets = _bags(dtype=dtype)
    w = weight.requires_grad_()
    expected = F.embedding_bag(indices, w, offsets, mode=mode)
    expected.sum().backward()
    pw = weight.detach().to("phantom").requires_grad_()
    before = _count("aten::_embedding_bag")
    got = F.embedding_bag(indices.to("phantom"), pw, offsets.to("phantom"), mode=mode)
    got.sum().backward()
    assert _count("aten::_embedding_bag") == before + 1
    _assert_same(expected.detach(), got.detach())
    _assert_same(w.grad, pw.grad)


def test_large_embedding_bag_is_computed_in_its_output():
    """A large result is computed in the device output's memory (lent to the
    kernel), not copied there, and is still the CPU's."""
    weight = torch.randn(5000, 64, generator=_gen())
    indices = torch.randint(0, 5000, (4096,), generator=_gen(1))
    offsets = torch.arange(0, 4096, 4)
    expected = F.embedding_bag(indices, weight, offsets, mode="sum")
    before = P.kernel_host_memory_stats()["in_place"]
    got = F.embedding_bag(*_to("phantom", indices, weight, offsets), mode="sum")
    _assert_same(expected, got)
    assert P.kernel_host_memory_stats()["in_place"] > before


def test_embedding_bag_raises_the_cpus_error_at_the_call():
    weight, indices, offsets = _bags()
    calls = [
        lambda w, i, o: torch.ops.aten._embedding_bag(w, i.float(), o),
        lambda w, i, o: torch.ops.aten._embedding_bag(w.int(), i, o),
        lambda w, i, o: torch.ops.aten._embedding_bag(w, i, o, False, 1, False, torch.ones_like(w[:, 0])),
        lambda w, i, o: torch.ops.aten._embedding_bag(w, i, o, False, 0, False, w[0, :2]),
        lambda w, i, o: torch.ops.aten._embedding_bag(w, i, o[:0], False, 0, False, None, True),
        lambda w, i, o: torch.ops.aten._embedding_bag(w[0], i, o),
    ]
    for call in calls:
        with pytest.raises(RuntimeError) as cpu_error:
            call(weight, indices, offsets)
        with pytest.raises(RuntimeError) as error:
            call(*_to("phantom", weight, indices, offsets))
        assert str(error.value) == str(cpu_error.value)
    P.synchronize()  # nothing failing was queued
    del error, cpu_error


def test_an_index_out_of_range_fails_the_stream_as_on_the_generic_path():
    """Data the host cannot see: the queued kernel raises the CPU's message
    as a device error at the next sync, then the stream works again. The
    generic path (indices and offsets of different dtypes) does the same."""
    weight = torch.randn(10, 4, device="phantom")
    for offsets_dtype in (torch.int64, torch.int32):
        torch_phantom.reset_ops_report()
        F.embedding_bag(torch.tensor([1, 20], device="phantom"), weight,
                        torch.tensor([0], dtype=offsets_dtype, device="phantom"))
        with pytest.raises(torch.AcceleratorError, match="20"):
            P.synchronize()
        paths = ("native",) if offsets_dtype == torch.int64 else ("async", "sync")
        assert sum(_count("aten::_embedding_bag_forward_only", p) for p in paths) == 1
        assert torch.equal((weight + 1).cpu(), weight.cpu() + 1)


def test_what_the_native_kernel_does_not_take_gives_the_cpus_answer():
    """Indices and offsets of different dtypes (which the CPU promotes), and
    a sparse gradient, take the generic path and ATen's device-generic
    backward: same results, not counted as native."""
    weight, indices, offsets = _bags()
    offsets32 = offsets.int()
    w = weight.clone().requires_grad_()
    expected = F.embedding_bag(indices, w, offsets32, mode="mean")
    expected.sum().backward()
    pw = weight.to("phantom").requires_grad_()
    torch_phantom.reset_ops_report()
    got = F.embedding_bag(*_to("phantom", indices), pw, *_to("phantom", offsets32), mode="mean")
    got.sum().backward()
    assert _count("aten::_embedding_bag") == 0 and _generic("aten::_embedding_bag") == 1
    _assert_same(expected.detach(), got.detach())
    _assert_same(w.grad, pw.grad)

    w = weight.clone().requires_grad_()
    F.embedding_bag(indices, w, offsets, sparse=True).sum().backward()
    pw = weight.to("phantom").requires_grad_()
    torch_phantom.reset_ops_report()
    F.embedding_bag(*_to("phantom", indices), pw, *_to("phantom", offsets), sparse=True).sum().backward()
    assert _count("aten::_embedding_bag_backward") == 0
    assert pw.grad.is_sparse
    _assert_same(w.grad.to_dense(), pw.grad.to_dense())


def test_per_sample_weights_gradient_matches_the_cpu():
    """The per-sample weights' gradient (its own op, on the generic path)
    still gets the native forward's offset2bag right."""
    weight, indices, offsets = _bags()
    weights = torch.rand(indices.shape[0], generator=_gen(1))

    def run(device):
        w, i, o, s = _to(device, weight, indices, offsets, weights)
        w.requires_grad_(), s.requires_grad_()
        F.embedding_bag(i, w, o, mode="sum", per_sample_weights=s).pow(2).sum().backward()
        return w.grad, s.grad

    for cpu, got in zip(run("cpu"), run("phantom")):
        _assert_same(cpu, got)


@pytest.mark.parametrize("shape", [(7, 5), (1000, 33), (3, 40000)])
def test_log_sigmoid_is_native_and_matches_the_cpu(shape):
    """Sizes below and above the one-thread limit, and a transposed input:
    forward (both outputs) and backward bit for bit."""
    x = torch.randn(*shape, generator=_gen())
    for inp in (x, x.t()):
        expected = torch.ops.aten.log_sigmoid_forward(inp)
        before = _count("aten::log_sigmoid_forward")
        got = torch.ops.aten.log_sigmoid_forward(inp.to("phantom"))
        assert _count("aten::log_sigmoid_forward") == before + 1
        for cpu, out in zip(expected, got):
            _assert_same(cpu, out)
    xc = x.clone().requires_grad_()
    F.logsigmoid(xc).sum().backward()
    xp = x.to("phantom").requires_grad_()
    F.logsigmoid(xp).sum().backward()
    _assert_same(xc.grad, xp.grad)


def test_log_sigmoid_refuses_what_the_cpu_refuses_at_the_call():
    x = torch.arange(6)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.ops.aten.log_sigmoid_forward(x)
    with pytest.raises(RuntimeError) as error:
        torch.ops.aten.log_sigmoid_forward(x.to("phantom"))
    assert str(error.value) == str(cpu_error.value)
    P.synchronize()
    del error, cpu_error


def test_integer_cumsum_and_index_add_are_native_and_match_the_cpu():
    """ATen's device-generic EmbeddingBag backward builds offset2bag with
    index_add_ and cumsum over int64 offsets: both are native, and an index
    out of range the meta function cannot see fails the stream."""
    offsets = torch.tensor([0, 2, 2, 5])
    def offset2bag(o):
        bags = torch.zeros(8, dtype=o.dtype, device=o.device).index_add(0, o, torch.ones_like(o))
        return bags.cumsum(0)
    before = _count("aten::cumsum"), _count("aten::index_add")
    got = offset2bag(offsets.to("phantom"))
    assert (_count("aten::cumsum"), _count("aten::index_add")) == (before[0] + 1, before[1] + 1)
    _assert_same(offset2bag(offsets), got)
    torch.zeros(3, device="phantom").index_add(0, torch.tensor([5], device="phantom"),
                                               torch.ones(1, device="phantom"))
    with pytest.raises(torch.AcceleratorError, match="index_add"):
        P.synchronize()


def test_captured_bags_indexing_and_log_sigmoid_replay_new_data_like_eager():
    """The native kernels record into a graph and replay over new contents
    of their inputs (indices, offsets, weights) with the CPU's results."""
    weight = torch.randn(30, 4, generator=_gen())
    rows, cols = torch.triu_indices(3, 3, offset=1)

    def step(w, i, o, r, c):
        w = w.detach().requires_grad_()
        bags = F.embedding_bag(i, w, o, mode="mean")
        stacked = torch.stack([bags, bags * 2, bags.flip(0)], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))[:, r, c]
        loss = -F.logsigmoid(dots).sum()
        (grad,) = torch.autograd.grad(loss, w)
        return loss, grad

    def data(seed):
        g = _gen(seed)
        lengths = torch.tensor([1, 2, 3, 1, 2])[torch.randperm(5, generator=g)]
        indices = torch.randint(0, 30, (9,), generator=g)
        return indices, torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])

    indices, offsets = data(0)
    static = _to("phantom", weight, indices, offsets, rows, cols)
    step(*static)  # warm-up, outside the capture
    torch_phantom.reset_ops_report()
    g = P.Graph()
    with P.graph(g):
        static_loss, static_grad = step(*static)
    for op in ("aten::_embedding_bag", "aten::_embedding_bag_backward",
               "aten::index", "aten::log_sigmoid_forward"):
        assert _count(op) == 1, op
    for seed in range(1, 4):
        indices, offsets = data(seed)
        static[1].copy_(indices)
        static[2].copy_(offsets)
        g.replay()
        loss, grad = step(weight, indices, offsets, rows, cols)
        _assert_same(loss, static_loss)
        _assert_same(grad, static_grad)


@pytest.mark.parametrize("table", ["transposed", "contiguous"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_over_strided_weights_matches_the_cpu(mode, table):
    """A transposed table, or per-sample weights with a stride, leave the
    CPU's sum fast path (offset2bag is then one per index): same outputs."""
    weight = torch.randn(4, 10, generator=_gen()).t()
    if table == "contiguous":
        weight = weight.contiguous()
    _, indices, offsets = _bags()
    every_other = torch.rand(2 * indices.shape[0], generator=_gen(1))
    for op in (torch.ops.aten._embedding_bag, torch.ops.aten._embedding_bag_forward_only):
        weights = every_other[::2] if mode == "sum" else None
        expected = op(weight, indices, offsets, False, MODES[mode], False, weights)
        weights = every_other.to("phantom")[::2] if mode == "sum" else None
        got = op(*[t.to("phantom") for t in (weight, indices, offsets)], False, MODES[mode],
                 False, weights)
        for cpu, out in zip(expected, got):
            _assert_same(cpu, out)
