"""Sparse COO and compressed layouts on phantom (docs/sparse.md): made,
moved, converted, multiplied and trained with as on the CPU, with the CPU's
results bit for bit and the CPU's errors at the call."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytestmark = pytest.mark.requires_kernel_view("the sparse generic path runs over the kernel view")

DEV = "phantom"


def _coo():
    i = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])
    v = torch.tensor([3.0, 4.0, 5.0, 6.0])
    return torch.sparse_coo_tensor(i, v, (2, 3))


def _same(phantom, cpu):
    """Same layout, same members bit for bit, phantom tensors on phantom."""
    assert phantom.device.type == DEV
    assert phantom.layout == cpu.layout
    got = phantom.cpu()
    if cpu.layout == torch.sparse_coo:
        assert got.is_coalesced() == cpu.is_coalesced()
        assert torch.equal(got._indices(), cpu._indices())
        assert torch.equal(got._values(), cpu._values())
    elif cpu.layout != torch.strided:
        assert torch.equal(got.to_dense(), cpu.to_dense())
    else:
        assert torch.equal(got, cpu)


def test_coo_construction_accessors_and_round_trip():
    cpu = _coo()
    made = torch.sparse_coo_tensor(cpu._indices(), cpu._values(), (2, 3), device=DEV)
    assert made.is_sparse and made.device == torch.device("phantom:0")
    assert made._indices().device.type == DEV and made._values().device.type == DEV
    assert made._nnz() == 4 and made.sparse_dim() == 2 and made.dense_dim() == 0
    assert not made.is_coalesced()
    _same(made, cpu)
    moved = cpu.to(DEV)
    _same(moved, cpu)
    assert torch.equal(moved.cpu().to_dense(), cpu.to_dense())


def test_coalesce_and_conversions_match_the_cpu():
    cpu = _coo()
    p = cpu.to(DEV)
    _same(p.coalesce(), cpu.coalesce())
    _same(p.to_dense(), cpu.to_dense())
    dense = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    _same(dense.to(DEV).to_sparse(), dense.to_sparse())
    _same(dense.to(DEV).to_sparse(1), dense.to_sparse(1))
    for convert in ("to_sparse_csr", "to_sparse_csc"):
        got = getattr(dense.to(DEV), convert)()
        _same(got, getattr(dense, convert)())
        _same(got.to_dense(), dense)
    bsr = dense.to(DEV).to_sparse_bsr((1, 3))
    _same(bsr, dense.to_sparse_bsr((1, 3)))
    _same(p.coalesce().to_sparse_csr(), cpu.coalesce().to_sparse_csr())


def test_csr_construction_accessors_and_moves():
    crow, col = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1])
    val = torch.tensor([1.0, 2.0, 3.0])
    cpu = torch.sparse_csr_tensor(crow, col, val, (2, 3))
    p = torch.sparse_csr_tensor(crow, col, val, (2, 3), device=DEV)
    assert p.layout == torch.sparse_csr and p.device.type == DEV
    assert p.crow_indices().device.type == DEV and p.col_indices().device.type == DEV
    assert torch.equal(p.crow_indices().cpu(), crow)
    assert torch.equal(p.values().cpu(), val)
    _same(p, cpu)
    _same(cpu.to(DEV), cpu)
    _same(p.to_sparse(), cpu.to_sparse())
    x = torch.randn(3, 2)
    assert torch.equal((p @ x.to(DEV)).cpu(), cpu @ x)


def test_sparse_dense_matmul_matches_the_cpu_bit_for_bit():
    torch.manual_seed(0)
    a = torch.randn(6, 5).relu().to_sparse()
    b = torch.randn(5, 4)
    c = torch.randn(6, 4)
    pa, pb, pc = a.to(DEV), b.to(DEV), c.to(DEV)
    _same(torch.mm(pa, pb), torch.mm(a, b))
    _same(torch.sparse.mm(pa, pb), torch.sparse.mm(a, b))
    _same(torch.addmm(pc, pa, pb, beta=0.5, alpha=2.0),
          torch.addmm(c, a, b, beta=0.5, alpha=2.0))
    _same(pa @ pb, a @ b)
    _same(torch.sparse.addmm(pc, pa, pb), torch.sparse.addmm(c, a, b))


def test_torch_sparse_reductions_softmax_and_arithmetic():
    cpu = _coo()
    p = cpu.to(DEV)
    _same(torch.sparse.sum(p), torch.sparse.sum(cpu))
    _same(torch.sparse.sum(p, dim=1), torch.sparse.sum(cpu, dim=1))
    _same(torch.sparse.softmax(p, 1), torch.sparse.softmax(cpu, 1))
    _same(torch.sparse.log_softmax(p, 0), torch.sparse.log_softmax(cpu, 0))
    _same(p + p, cpu + cpu)
    _same(p * 2.5, cpu * 2.5)
    _same(p.t(), cpu.t())
    _same(torch.zeros(2, 3).to(DEV).sparse_mask(p.coalesce()),
          torch.zeros(2, 3).sparse_mask(cpu.coalesce()))
    q = p.clone()
    q.add_(p)  # in place on a sparse tensor: new members, same object
    _same(q, cpu + cpu)
    dense = torch.ones(2, 3)
    pd = dense.to(DEV)
    pd.add_(p, alpha=-0.5)  # a dense parameter updated by a sparse gradient
    _same(pd, dense.add(cpu, alpha=-0.5))


def test_sparse_gradients_of_embeddings_are_the_cpus():
    for make in (lambda: nn.Embedding(10, 3, sparse=True, padding_idx=2),
                 lambda: nn.EmbeddingBag(10, 3, sparse=True, mode="mean")):
        grads = []
        for dev in ("cpu", DEV):
            torch.manual_seed(0)
            m = make().to(dev)
            idx = torch.tensor([[1, 2, 4], [4, 3, 9]], device=dev)
            m(idx).pow(2).sum().backward()
            grads.append(m.weight.grad)
        assert grads[1].is_sparse
        _same(grads[1], grads[0])


def _train_embeddings(dev, optimizer, bag, steps=4):
    torch.manual_seed(0)
    emb = (nn.EmbeddingBag(30, 4, sparse=True, mode="sum") if bag
           else nn.Embedding(30, 4, sparse=True)).to(dev)
    head = nn.Linear(4, 1).to(dev)
    opt = optimizer(emb.parameters())
    head_opt = torch.optim.SGD(head.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, 30, (8, 3), generator=g).to(dev)
        out = emb(idx) if bag else emb(idx).sum(1)
        loss = head(out).pow(2).mean()
        opt.zero_grad()
        head_opt.zero_grad()
        loss.backward()
        opt.step()
        head_opt.step()
        losses.append(loss.item())
    return losses, emb.weight.detach().cpu()


@pytest.mark.parametrize("bag", [False, True], ids=["Embedding", "EmbeddingBag"])
@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.1),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.SparseAdam(p, lr=0.01),
    lambda p: torch.optim.Adagrad(p, lr=0.1),
], ids=["SGD", "SGD-momentum", "SparseAdam", "Adagrad"])
def test_sparse_training_is_bit_identical_to_the_cpu(optimizer, bag):
    cpu_losses, cpu_weight = _train_embeddings("cpu", optimizer, bag)
    losses, weight = _train_embeddings(DEV, optimizer, bag)
    assert losses == cpu_losses
    assert torch.equal(weight, cpu_weight)


class TinyDLRM(nn.Module):
    """Dense features through a bottom MLP, sparse features through
    EmbeddingBags with sparse gradients, pairwise dot interactions, a top
    MLP: the shape of a DLRM."""

    def __init__(self, tables=(40, 25, 60), dim=8):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for n in tables)
        pairs = (len(tables) + 1) * len(tables) // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        feats = [x] + [e(i, o) for e, i, o in zip(self.embeddings, indices, offsets)]
        t = torch.stack(feats, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        li, lj = torch.tril_indices(t.shape[1], t.shape[1], offset=-1, device=t.device)
        return self.top(torch.cat([x, z[:, li, lj]], dim=1))


def _train_dlrm(dev, steps=5):
    torch.manual_seed(0)
    model = TinyDLRM().to(dev)
    sparse_opt = torch.optim.SparseAdam(list(model.embeddings.parameters()), lr=0.01)
    dense_opt = torch.optim.Adam(list(model.bottom.parameters()) + list(model.top.parameters()),
                                 lr=0.01)
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        batch = 6
        dense = torch.randn(batch, 5, generator=g)
        lengths = [torch.randint(1, 4, (batch,), generator=g) for _ in model.embeddings]
        indices = [torch.randint(0, e.num_embeddings, (int(n.sum()),), generator=g)
                   for e, n in zip(model.embeddings, lengths)]
        offsets = [torch.cat([torch.zeros(1, dtype=torch.long), n.cumsum(0)[:-1]]) for n in lengths]
        target = torch.rand(batch, 1, generator=g)
        out = model(dense.to(dev), [i.to(dev) for i in indices], [o.to(dev) for o in offsets])
        loss = F.binary_cross_entropy_with_logits(out, target.to(dev))
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        assert all(e.weight.grad.is_sparse for e in model.embeddings)
        sparse_opt.step()
        dense_opt.step()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def test_a_tiny_dlrm_with_sparse_embedding_gradients_trains_as_on_the_cpu():
    cpu_losses, cpu_state = _train_dlrm("cpu")
    losses, state = _train_dlrm(DEV)
    assert losses == cpu_losses
    for name, value in cpu_state.items():
        assert torch.equal(state[name], value), name


def test_indices_out_of_range_are_refused_at_the_call():
    i = torch.tensor([[0, 5]])
    v = torch.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError) as cpu_error:
        torch.sparse_coo_tensor(i, v, (3,), check_invariants=True)
    with pytest.raises(RuntimeError) as error:
        torch.sparse_coo_tensor(i.to(DEV), v.to(DEV), (3,), check_invariants=True)
    assert str(error.value) == str(cpu_error.value)
    assert "size is 3 but found index 5" in str(error.value)
    torch.phantom.synchronize()  # nothing was left queued that fails later


def test_mixing_devices_is_refused_with_a_clear_error():
    p = _coo().to(DEV)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*"
                                           "phantom:0 and cpu"):
        torch.mm(p, torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="same device"):
        p + _coo()
    # ATen's own check, as on CUDA.
    with pytest.raises(RuntimeError, match="backend of indices .* must match backend of values"):
        torch.sparse_coo_tensor(torch.tensor([[0]], device=DEV), torch.tensor([1.0]), (2,))
    torch.phantom.synchronize()


def test_cpu_errors_of_sparse_kernels_reach_the_caller_unchanged():
    p = _coo().to(DEV)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.mm(_coo(), torch.ones(4, 2))
    with pytest.raises(RuntimeError) as error:
        torch.mm(p, torch.ones(4, 2, device=DEV))
    assert str(error.value) == str(cpu_error.value)
    torch.phantom.synchronize()


def test_sparse_tensors_on_the_second_device():
    cpu = _coo()
    p = cpu.to("phantom:1")
    assert p.device == torch.device("phantom:1")
    assert p._values().device == torch.device("phantom:1")
    out = torch.sparse.mm(p, torch.ones(3, 2, device="phantom:1"))
    assert out.device == torch.device("phantom:1")
    assert torch.equal(out.cpu(), torch.sparse.mm(cpu, torch.ones(3, 2)))


def test_save_and_load_keep_a_sparse_tensor_on_phantom(tmp_path):
    p = _coo().to(DEV)
    torch.save(p, tmp_path / "sparse.pt")
    loaded = torch.load(tmp_path / "sparse.pt")
    _same(loaded, _coo())


def test_sparse_ops_are_reported_as_waiting():
    import torch_phantom

    torch_phantom.reset_ops_report()
    _coo().to(DEV).coalesce()
    rows = {r["op"]: r for r in torch_phantom.ops_report()}
    assert rows["aten::_coalesce"]["sync"] >= 1
    assert "sparse layouts run synchronously" in rows["aten::_coalesce"]["sync_reason"]
