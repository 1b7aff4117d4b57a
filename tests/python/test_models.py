"""Real models train on phantom exactly as on the CPU.

The models and the training loop are those of examples/train_models.py (one
source, so the examples cannot rot): each trains a few steps on phantom and
on the CPU from the same seed, and the losses and final parameters are
compared. Also here: scaled_dot_product_attention against the CPU.
"""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import train_models  # noqa: E402

# Models whose phantom run is bit-identical to the CPU's today.
BIT_EXACT = {"mlp", "cnn", "transformer", "dlrm-sgd", "dlrm-adam"}


# ATen sends LSTM and GRU cells to fused ops with no CPU kernel, which
# phantom computes over the kernel view (ops/FusedRnnCells.cpp).
_FUSED_RNN = pytest.mark.requires_kernel_view("the fused LSTM/GRU cell kernels")


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=_FUSED_RNN) if name in ("lstm", "gru") else name
    for name in sorted(train_models.MODELS)])
def test_training_matches_cpu(name):
    phantom = train_models.train(name, "phantom", steps=4)
    cpu = train_models.train(name, "cpu", steps=4)
    assert phantom.losses[-1] == phantom.losses[-1]  # not NaN
    if name in BIT_EXACT:
        assert phantom.losses == cpu.losses
    torch.testing.assert_close(
        phantom.losses, cpu.losses, rtol=train_models.RTOL, atol=train_models.ATOL
    )
    assert phantom.parameters.keys() == cpu.parameters.keys()
    for key, expected in cpu.parameters.items():
        actual = phantom.parameters[key]
        if name in BIT_EXACT:
            assert torch.equal(actual, expected), key
        torch.testing.assert_close(
            actual, expected, rtol=train_models.RTOL, atol=train_models.ATOL, msg=key
        )
    # Training did something (the comparison is not between two no-ops).
    initial = train_models.train(name, "cpu", steps=0).parameters
    assert any(not torch.equal(initial[k], cpu.parameters[k]) for k in initial)


def test_training_on_the_second_device(two_devices):
    phantom = train_models.train("dlrm-adam", "phantom:1", steps=3)
    cpu = train_models.train("dlrm-adam", "cpu", steps=3)
    assert phantom.losses == cpu.losses


def test_embedding_bag_modes_and_backward_match_cpu():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(20, 4, generator=gen)
    indices = torch.randint(0, 20, (11,), generator=gen)
    offsets = torch.tensor([0, 3, 3, 7])  # one empty bag
    per_sample = torch.rand(11, generator=gen)
    for mode, weights in (("sum", per_sample), ("sum", None), ("mean", None), ("max", None)):
        results = []
        for device in ("phantom", "cpu"):
            w = weight.detach().to(device).requires_grad_()
            out = F.embedding_bag(
                indices.to(device), w, offsets.to(device), mode=mode,
                per_sample_weights=None if weights is None else weights.to(device),
            )
            out.pow(2).sum().backward()
            results.append((out.detach().cpu(), w.grad.cpu()))
        (out_p, grad_p), (out_c, grad_c) = results
        assert torch.equal(out_p, out_c), mode
        assert torch.equal(grad_p, grad_c), mode


def test_the_example_script_exits_zero_on_match():
    from conftest import run_python

    script = os.path.join(os.path.dirname(train_models.__file__), "train_models.py")
    result = run_python(
        f"import sys; sys.argv = ['x', '--model', 'dlrm-sgd', '--steps', '2']; "
        f"exec(open({script!r}).read())"
    )
    assert result.returncode == 0, result.stderr
    assert "OK: dlrm-sgd match the CPU" in result.stdout


# --- scaled_dot_product_attention --------------------------------------------


def _qkv(seed=0, shape=(2, 3, 6, 8)):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen) for _ in range(3)]


def _sdpa_on(device, q, k, v, **kwargs):
    q, k, v = (t.detach().to(device).requires_grad_() for t in (q, k, v))
    kwargs = {key: (val.to(device) if torch.is_tensor(val) else val) for key, val in kwargs.items()}
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    out.backward(torch.ones_like(out))
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


MASKS = {
    "none": {},
    "float_mask": {"attn_mask": torch.randn(6, 6, generator=torch.Generator().manual_seed(1))},
    "bool_mask": {"attn_mask": torch.rand(6, 6, generator=torch.Generator().manual_seed(2)) > 0.3},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.5},
}


@pytest.mark.parametrize("case", sorted(MASKS))
def test_sdpa_matches_cpu(case):
    q, k, v = _qkv()
    phantom = _sdpa_on("phantom", q, k, v, **MASKS[case])
    cpu = _sdpa_on("cpu", q, k, v, **MASKS[case])
    for name, p, c in zip(("out", "dq", "dk", "dv"), phantom, cpu):
        torch.testing.assert_close(p, c, msg=f"{case}: {name}")


def test_sdpa_grouped_query_attention():
    q = torch.randn(1, 4, 5, 8, generator=torch.Generator().manual_seed(3))
    k, v = _qkv(4, (1, 2, 5, 8))[:2]
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    actual = F.scaled_dot_product_attention(
        q.to("phantom"), k.to("phantom"), v.to("phantom"), enable_gqa=True
    )
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("case", ["none", "causal", "bool_mask"])
def test_sdpa_dropout_with_the_same_seed_matches_cpu(case):
    q, k, v = _qkv()
    torch.manual_seed(7)
    phantom = _sdpa_on("phantom", q, k, v, dropout_p=0.3, **MASKS[case])
    torch.manual_seed(7)
    cpu = _sdpa_on("cpu", q, k, v, dropout_p=0.3, **MASKS[case])
    torch.manual_seed(8)
    other = _sdpa_on("phantom", q, k, v, dropout_p=0.3, **MASKS[case])
    for p, c in zip(phantom, cpu):
        torch.testing.assert_close(p, c)
    assert not torch.equal(phantom[0], other[0])  # dropout did something


def test_layer_norm_is_bit_identical_to_cpu():
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(F.layer_norm(x.to("phantom"), (10,)).cpu(), F.layer_norm(x, (10,)))
