"""Graph capture and replay on phantom: torch.accelerator.Graph, the
torch.phantom.graph context manager, private memory pools, and the errors
of work that cannot be captured (docs/graphs.md)."""
import os

import pytest
import torch

import torch_phantom  # noqa: F401

pytestmark = pytest.mark.requires_kernel_view(
    "graph capture records stream work; the copying CPU fallback's blocking host copies cannot be captured")


def _chain(x):
    y = x * 2.0 + 1.0
    y = torch.relu(y - 3.0)
    return (y * y).sin() + x


def test_accelerator_graph_replays_new_input_data_like_eager_cpu():
    static_x = torch.zeros(64, device="phantom")
    g = torch.accelerator.Graph()
    with torch.phantom.graph(g):
        static_y = _chain(static_x)
    for seed in range(3):
        data = torch.randn(64, generator=torch.Generator().manual_seed(seed))
        static_x.copy_(data)
        g.replay()
        torch.testing.assert_close(static_y.cpu(), _chain(data), rtol=0, atol=0)


def test_capture_records_instead_of_running_and_replays_many_times():
    acc = torch.zeros(8, device="phantom")
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        acc.add_(1.0)
        acc.mul_(1.0)
    assert acc.cpu().sum().item() == 0.0  # nothing ran during the capture
    for _ in range(200):
        g.replay()
    assert torch.equal(acc.cpu(), torch.full((8,), 200.0))


def test_plain_accelerator_api_with_a_user_stream():
    x = torch.ones(4, device="phantom")
    stream = torch.Stream(device="phantom")
    g = torch.accelerator.Graph()
    with stream, g:
        x += 1
    g.replay()
    g.replay()
    assert torch.equal(x.cpu(), torch.full((4,), 3.0))


def test_replay_on_another_stream_runs_in_that_streams_order():
    x = torch.zeros(4, device="phantom")
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        x.add_(1.0)
    other = torch.phantom.Stream()
    with torch.phantom.stream(other):
        x.mul_(10.0)
        g.replay()
        x.mul_(10.0)
    other.synchronize()
    assert torch.equal(x.cpu(), torch.full((4,), 10.0))


def test_is_current_stream_capturing():
    assert not torch.phantom.is_current_stream_capturing()
    seen = []
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        seen.append(torch.phantom.is_current_stream_capturing())
    assert seen == [True]
    assert not torch.phantom.is_current_stream_capturing()


@pytest.mark.parametrize(
    "illegal",
    [
        pytest.param(lambda x: x.sum().item(), id="item"),
        pytest.param(lambda x: x.cpu(), id="copy-to-pageable"),
        pytest.param(lambda x: torch.phantom.synchronize(), id="synchronize"),
        pytest.param(lambda x: torch.nonzero(x), id="data-dependent-shape"),
    ],
)
def test_work_that_cannot_be_captured_raises_and_leaves_the_process_usable(illegal):
    x = torch.ones(16, device="phantom")
    g = torch.phantom.Graph()
    with pytest.raises(RuntimeError, match="captur"):
        with torch.phantom.graph(g):
            y = x + 1
            illegal(y)
    assert not torch.phantom.is_current_stream_capturing()
    # The device and the graph work again.
    assert torch.equal((x * 3).cpu(), torch.full((16,), 3.0))
    g.reset()
    with torch.phantom.graph(g):
        x.add_(1.0)
    g.replay()
    assert torch.equal(x.cpu(), torch.full((16,), 2.0))


def test_capture_memory_is_kept_until_reset():
    x = torch.ones(1 << 18, device="phantom")  # 1 MiB
    z = torch.zeros(1 << 18, device="phantom")
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    free_before = torch.phantom.mem_get_info()[0]
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        tmp = x * 2.0      # a temporary of the capture: 1 MiB
        y = tmp + 1.0      # the static output: 1 MiB
        del tmp
    pool = g.pool()
    assert torch.phantom.graphs._C._graph_pool_reserved_bytes(*pool) >= 2 << 20
    assert torch.phantom.mem_get_info()[0] <= free_before - (2 << 20)
    # The temporary's memory stays the graph's: a new tensor never gets it.
    z = torch.zeros(1 << 18, device="phantom")
    for _ in range(3):
        g.replay()
    assert torch.equal(y.cpu(), torch.full((1 << 18,), 3.0))
    assert torch.equal(z.cpu(), torch.zeros(1 << 18))
    g.reset()
    del y, z
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    assert torch.phantom.graphs._C._graph_pool_reserved_bytes(*pool) == 0
    assert torch.phantom.mem_get_info()[0] >= free_before


def test_pinned_memory_a_capture_used_is_not_handed_out_again():
    """A replay reads the pinned source of a captured non_blocking copy:
    another pinned tensor must not get its block after the source dies."""
    dst = torch.zeros(1024, device="phantom")
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        src = torch.arange(1024.0).pin_memory()
        used = src.data_ptr()
        dst.copy_(src, non_blocking=True)
        del src
    others = [torch.full((1024,), -1.0).pin_memory() for _ in range(3)]
    assert used not in [o.data_ptr() for o in others]
    dst.zero_()
    g.replay()
    assert torch.equal(dst.cpu(), torch.arange(1024.0))
    g.reset()


def test_pinned_memory_outside_a_capture_still_reuses_its_cache():
    """Only the capture's blocks are held back: eager pinned tensors keep
    reusing the cache while a capture is underway on another stream, and
    after it."""
    first = torch.ones(4096).pin_memory()
    address = first.data_ptr()
    del first
    again = torch.ones(4096).pin_memory()
    assert again.data_ptr() == address
    del again
    g = torch.phantom.Graph()
    x = torch.ones(4, device="phantom")
    with torch.phantom.graph(g):
        y = x + 1
    after = torch.ones(4096).pin_memory()
    assert after.data_ptr() == address
    g.replay()
    assert torch.equal(y.cpu(), torch.full((4,), 2.0))
    g.reset()


def test_graphs_share_a_pool_from_graph_pool_handle():
    handle = torch.phantom.graph_pool_handle()
    x = torch.ones(4, device="phantom")
    g1, g2 = torch.phantom.Graph(), torch.phantom.Graph()
    with torch.phantom.graph(g1, pool=handle):
        a = x + 1
    with torch.phantom.graph(g2, pool=g1.pool()):
        b = a * 2
    assert g1.pool() == g2.pool() == handle
    g1.replay()
    g2.replay()
    assert torch.equal(b.cpu(), torch.full((4,), 4.0))


def test_debug_dump_writes_the_graph(tmp_path):
    x = torch.ones(4, device="phantom")
    g = torch.phantom.Graph()
    g.enable_debug_mode()
    with torch.phantom.graph(g):
        x.add_(1.0)
        x.mul_(2.0)
    path = os.path.join(tmp_path, "graph.dot")
    g.debug_dump(path)
    with open(path) as f:
        text = f.read()
    assert text.startswith("digraph") and "n1" in text


def test_replay_before_capture_and_double_capture_are_refused():
    g = torch.phantom.Graph()
    with pytest.raises(RuntimeError, match="capture"):
        g.replay()
    x = torch.ones(2, device="phantom")
    with torch.phantom.graph(g):
        x.add_(1.0)
    with pytest.raises(RuntimeError, match="reset"):
        with torch.phantom.graph(g):
            x.add_(1.0)


def test_fork_and_join_across_streams_is_captured_into_one_graph():
    x = torch.ones(8, device="phantom")
    side = torch.phantom.Stream()
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        a = x * 2.0
        side.wait_stream(torch.phantom.current_stream())  # fork
        with torch.phantom.stream(side):
            b = x + 10.0  # allocated from the graph's pool too
        torch.phantom.current_stream().wait_stream(side)  # join
        c = a + b
    # a, b (on the side stream) and c: all three in the graph's pool.
    assert torch.phantom.graphs._C._graph_pool_reserved_bytes(*g.pool()) >= 3 * 512
    x.fill_(3.0)
    g.replay()
    assert torch.equal(c.cpu(), torch.full((8,), 19.0))


def test_random_ops_draw_fresh_numbers_like_eager_iterations():
    x = torch.ones(1000, device="phantom")
    torch.manual_seed(5)
    eager = [torch.rand_like(x).cpu() for _ in range(3)]
    torch.manual_seed(5)
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        y = torch.rand_like(x)
    replayed = []
    for _ in range(3):
        g.replay()
        replayed.append(y.cpu())
    for a, b in zip(eager, replayed):
        assert torch.equal(a, b)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).to("phantom")


def test_captured_training_step_matches_eager_bit_for_bit():
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(4)]
    eager, graphed = _mlp(), _mlp()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.1, momentum=0.9)

    def step(model, opt, x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    # One eager warm-up step each (the optimizer creates its state).
    x0, y0 = data[0][0].to("phantom"), data[0][1].to("phantom")
    step(eager, opt_e, x0, y0)
    step(graphed, opt_g, x0, y0)
    static_x = torch.zeros(8, 16, device="phantom")
    static_y = torch.zeros(8, 4, device="phantom")
    g = torch.phantom.Graph()
    opt_g.zero_grad(set_to_none=True)
    with torch.phantom.graph(g):
        torch.nn.functional.mse_loss(graphed(static_x), static_y).backward()
        opt_g.step()
    for x, y in data[1:]:
        step(eager, opt_e, x.to("phantom"), y.to("phantom"))
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()
    for pe, pg in zip(eager.parameters(), graphed.parameters()):
        assert torch.equal(pe.cpu(), pg.cpu())


def test_many_replays_leave_memory_allocated_unchanged():
    x = torch.ones(256, device="phantom")
    g = torch.phantom.Graph()
    with torch.phantom.graph(g):
        y = (x * 2.0).relu() + 1.0
    torch.phantom.synchronize()
    before = torch.phantom.memory_allocated()
    for _ in range(1000):
        g.replay()
    torch.phantom.synchronize()
    assert torch.phantom.memory_allocated() == before
    assert torch.equal(y.cpu(), torch.full((256,), 3.0))


def test_make_graphed_callables_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 2)).to("phantom")
    graphed = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 2)).to("phantom")
    graphed.load_state_dict(eager.state_dict())

    def scale(t):
        return t * 3.0 + 1.0

    sample = torch.randn(4, 8, device="phantom", requires_grad=True)
    graphed_module, graphed_fn = torch.phantom.make_graphed_callables(
        (graphed, scale), ((sample,), (torch.randn(4, 2, device="phantom",
                                                    requires_grad=True),)))
    for seed in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
        xe = x.to("phantom").requires_grad_()
        xg = x.to("phantom").requires_grad_()
        eager.zero_grad(set_to_none=True)
        graphed.zero_grad(set_to_none=True)
        scale(eager(xe)).sum().backward()
        graphed_fn(graphed_module(xg)).sum().backward()
        assert torch.equal(xe.grad.cpu(), xg.grad.cpu())
        for pe, pg in zip(eager.parameters(), graphed.parameters()):
            assert torch.equal(pe.grad.cpu(), pg.grad.cpu())


def test_a_failed_capture_leaves_nothing_allocated():
    x = torch.ones(1 << 16, device="phantom")
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    free_before = torch.phantom.mem_get_info()[0]
    allocated_before = torch.phantom.memory_allocated()
    g = torch.phantom.Graph()

    def capture():
        with torch.phantom.graph(g):
            y = x * 2.0  # pool memory of a capture that will fail
            y.sum().item()

    with pytest.raises(RuntimeError, match="captur"):
        capture()
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    assert torch.phantom.memory_allocated() <= allocated_before
    assert torch.phantom.mem_get_info()[0] >= free_before


def test_transformer_encoder_inference_replays_bit_for_bit():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64,
                                             dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    model = model.to("phantom").eval()
    static_x = torch.zeros(2, 5, 32, device="phantom")
    with torch.no_grad():
        model(static_x)  # warm-up
        g = torch.phantom.Graph()
        with torch.phantom.graph(g):
            static_out = model(static_x)
        for seed in range(3):
            x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(seed))
            static_x.copy_(x)
            g.replay()
            expected = model(x.to("phantom"))
            assert torch.equal(static_out.cpu(), expected.cpu())


def test_wrap_in_graph_captures_per_signature_and_falls_back_with_one_warning():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to("phantom")
    wrapped = torch_phantom.wrap_in_graph(model)
    for batch in (2, 3, 2, 3):
        x = torch.randn(batch, 8, device="phantom")
        with torch.no_grad():
            assert torch.equal(wrapped(x).cpu(), model(x).cpu())
    assert len(wrapped._graphs) == 2  # one graph per input shape

    class Reads(torch.nn.Module):
        def forward(self, x):
            return x * float(x.sum().item())  # needs the host: not capturable

    reads = torch_phantom.wrap_in_graph(Reads())
    x = torch.ones(4, device="phantom")
    with pytest.warns(UserWarning, match="runs eagerly"):
        out = reads(x)
    assert torch.equal(out.cpu(), torch.full((4,), 4.0))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(reads(x).cpu(), torch.full((4,), 4.0))
