"""What a replayed graph node computes (docs/graphs.md, "Speed"): a node
keeps its CPU aliases of device memory from one replay to the next and
runs its CPU kernel below autograd, and relu of a small float or double
tensor is a direct loop. Each replay must still read the data the static
inputs hold at that replay, through views and strides as captured, write
in place where the op does, and give the CPU's bits."""
import pytest
import torch

import torch_phantom  # noqa: F401

pytestmark = pytest.mark.requires_kernel_view(
    "graph capture records stream work; the copying CPU fallback's blocking host copies cannot be captured")


def _capture(fn, *static_inputs):
    # A warm-up first, as torch.cuda.graph advises: an op's first call
    # with a new signature makes a trial run, which cannot be captured.
    fn(*static_inputs)
    torch.phantom.synchronize()
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        out = fn(*static_inputs)
    return g, out


def _bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def _structured_and_copy_ops(x, w, b, m):
    # addmm, mm, bmm, softmax, layer_norm (native kernels), a strided copy
    # (copy_), a broadcast mul (the binary ops' CPU kernel), relu (the
    # direct loop), sum (a structured reduction).
    h = torch.nn.functional.linear(x, w, b)
    h = torch.relu(h)
    s = torch.softmax(h @ w.t(), dim=-1)
    bm = torch.bmm(m, m.transpose(1, 2)).contiguous()
    ln = torch.nn.functional.layer_norm(h, (h.shape[-1],), w[0], b)
    scaled = m.transpose(1, 2) * b[: m.shape[1]].view(1, 1, -1)
    # The generic path: gt, where, cumsum, isneginf.
    generic = torch.where(h > 0.5, h, s).cumsum(dim=1)
    return (h, s, bm, ln, scaled, s.sum(dim=0), generic,
            torch.isneginf(m.log()))


def test_replays_read_each_replays_input_data_bit_for_bit():
    torch.manual_seed(0)
    cpu = [torch.randn(3, 16), torch.randn(16, 16), torch.randn(16),
           torch.randn(2, 5, 4)]
    static = [t.to("phantom") for t in cpu]
    g, outs = _capture(_structured_and_copy_ops, *static)
    for seed in range(4):
        gen = torch.Generator().manual_seed(100 + seed)
        fresh = [torch.randn(t.shape, generator=gen) for t in cpu]
        for s, f in zip(static, fresh):
            s.copy_(f)  # new data at the captured addresses
        g.replay()
        expected = _structured_and_copy_ops(*fresh)
        for got, want in zip(outs, expected):
            assert _bits_equal(got.cpu(), want), "replay %d" % seed


def test_views_and_strided_inputs_are_read_as_captured():
    torch.manual_seed(1)
    base_cpu = torch.randn(8, 12)
    base = base_cpu.to("phantom")

    def fn(base):
        a = base[1:7:2, ::3]           # offset and strides
        w = base[:4, 2:6].t()          # a transposed view of the same storage
        return torch.mm(a, w), torch.addmm(base[0, :4], a, w), a * base[7, ::3]

    g, outs = _capture(fn, base)
    for step in range(3):
        data = torch.randn(8, 12, generator=torch.Generator().manual_seed(step))
        base.copy_(data)
        g.replay()
        for got, want in zip(outs, fn(data)):
            assert _bits_equal(got.cpu(), want)


def test_in_place_nodes_accumulate_over_replays():
    x = torch.full((4, 6), -1.5, device="phantom")
    col = torch.full((4, 1), 2.0, device="phantom")
    d = torch.full((5,), -3.0, dtype=torch.float64, device="phantom")

    def step():
        x.mul_(col)                  # broadcast: the CPU kernel, in place
        x[:, ::2].add_(1.0)          # strided view, in place
        d.relu_()                    # direct loop, in place
        d.add_(1.0)

    step()  # warm-up (one eager step), then start again from the same data
    x.fill_(-1.5)
    d.fill_(-3.0)
    torch.phantom.synchronize()
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        step()
    for _ in range(3):
        g.replay()
    expected = torch.full((4, 6), -1.5)
    for _ in range(3):
        expected.mul_(2.0)
        expected[:, ::2].add_(1.0)
    assert torch.equal(x.cpu(), expected)
    assert torch.equal(d.cpu(), torch.full((5,), 3.0, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("in_place", [False, True])
def test_relu_keeps_the_cpus_bits_eager_and_replayed(dtype, in_place):
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[dtype]
    special = torch.tensor([-0.0, 0.0, float("nan"), -float("nan"),
                            float("inf"), -float("inf"), 1e-310, -1e-310,
                            1.0, -1.0, 2.5, -2.5], dtype=dtype)
    values = special.repeat(9)[:101].clone()  # vector lanes and a tail
    raw = values.view(ints)
    raw[14] = raw[2] | 3  # NaNs with payloads, both signs
    raw[15] = raw[3] | 5
    want = torch.relu(values)

    eager_in = values.to("phantom")
    eager = eager_in.relu_() if in_place else torch.relu(eager_in)
    assert _bits_equal(eager.cpu(), want)

    static = torch.zeros_like(values, device="phantom")
    g, out = _capture(lambda s: s.relu_() if in_place else torch.relu(s), static)
    for _ in range(2):  # each replay reads what the input holds then
        static.copy_(values)
        g.replay()
        assert _bits_equal(out.cpu(), want)


def test_one_graph_replayed_on_two_streams_gives_each_its_result():
    x = torch.randn(4, 8, device="phantom")
    w = torch.randn(8, 8, device="phantom")
    g, y = _capture(lambda x, w: torch.relu(x @ w).sum(dim=1), x, w)
    want = torch.relu(x.cpu() @ w.cpu()).sum(dim=1)
    streams = [torch.phantom.Stream(), torch.phantom.Stream()]
    for i in range(6):
        with torch.phantom.stream(streams[i % 2]):
            g.replay()
            torch.phantom.current_stream().synchronize()
        assert _bits_equal(y.cpu(), want)
