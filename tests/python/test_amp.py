"""Automatic mixed precision: torch.autocast("phantom") and
torch.amp.GradScaler("phantom").

The policy is CUDA's (ops/Autocast.cpp, docs/amp.md). Every value is
compared with the CPU computing the same thing: CPU autocast where the CPU
policy agrees with CUDA's (matmul, linear, losses), explicit casts where it
does not (the CPU runs softmax and layer_norm in low precision, CUDA and
phantom in float32).
"""

import pytest
import torch
import torch.nn.functional as F

LOW_DTYPES = [torch.float16, torch.bfloat16]


def _on_phantom(*tensors):
    return [t.to("phantom") for t in tensors]


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_matmul_family_runs_in_low_precision_like_cpu_autocast(dtype, generator):
    a = torch.randn(8, 16, generator=generator)
    b = torch.randn(16, 4, generator=generator)
    bias = torch.randn(4, generator=generator)
    batch1 = torch.randn(3, 8, 16, generator=generator)
    batch2 = torch.randn(3, 16, 4, generator=generator)
    weight = torch.randn(4, 16, generator=generator)
    cases = {
        "matmul": lambda a, b, bias, b1, b2, w: a @ b,
        "mm": lambda a, b, bias, b1, b2, w: torch.mm(a, b),
        "linear": lambda a, b, bias, b1, b2, w: F.linear(a, w, bias),
        "addmm": lambda a, b, bias, b1, b2, w: torch.addmm(bias, a, b),
        "bmm": lambda a, b, bias, b1, b2, w: torch.bmm(b1, b2),
        "baddbmm": lambda a, b, bias, b1, b2, w: torch.baddbmm(bias, b1, b2),
    }
    inputs = (a, b, bias, batch1, batch2, weight)
    for name, op in cases.items():
        with torch.autocast("cpu", dtype=dtype):
            expected = op(*inputs)
        with torch.autocast("phantom", dtype=dtype):
            actual = op(*_on_phantom(*inputs))
        assert actual.device.type == "phantom", name
        assert actual.dtype == dtype, name
        assert expected.dtype == dtype, name
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_convolution_runs_in_low_precision(dtype, generator):
    x = torch.randn(2, 3, 8, 8, generator=generator)
    w = torch.randn(4, 3, 3, 3, generator=generator)
    b = torch.randn(4, generator=generator)
    expected = F.conv2d(x.to(dtype), w.to(dtype), b.to(dtype), padding=1)
    with torch.autocast("phantom", dtype=dtype):
        actual = F.conv2d(*_on_phantom(x, w, b), padding=1)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_numerically_sensitive_ops_run_in_float32(dtype, generator):
    # Low-precision inputs (as a preceding matmul produces them) come out
    # float32, computed from the inputs upcast, as on CUDA.
    x = torch.randn(6, 10, generator=generator).to(dtype)
    target = torch.randn(6, 10, generator=generator).to(dtype)
    labels = torch.randint(0, 10, (6,), generator=generator)
    cases = {
        "softmax": (lambda x, t: torch.softmax(x, dim=1), False),
        "log_softmax": (lambda x, t: F.log_softmax(x, dim=1), False),
        "layer_norm": (lambda x, t: F.layer_norm(x, (10,)), False),
        "group_norm": (lambda x, t: F.group_norm(x, 2), False),
        "mse_loss": (lambda x, t: F.mse_loss(x, t), False),
        "nll_loss": (lambda x, t: F.nll_loss(x, t), True),
        "cumsum": (lambda x, t: torch.cumsum(x, dim=1), False),
        "sum": (lambda x, t: x.sum(), False),
        "exp": (lambda x, t: torch.exp(x), False),
        "logsumexp": (lambda x, t: torch.logsumexp(x, dim=1), False),
    }
    for name, (op, uses_labels) in cases.items():
        second = labels if uses_labels else target
        upcast = (x.float(), second if uses_labels else second.float())
        with torch.autocast("phantom", dtype=dtype):
            actual = op(*_on_phantom(x, second))
        assert actual.dtype == torch.float32, name
        # Exactly what the same op computes on phantom from float32 inputs...
        explicit = op(*_on_phantom(*upcast)).cpu()
        torch.testing.assert_close(actual.cpu(), explicit, rtol=0, atol=0, msg=name)
        # ...and what the CPU computes.
        torch.testing.assert_close(actual.cpu(), op(*upcast), rtol=0, atol=0, msg=name)


# One op from each of the lists CUDA registers (AT_FORALL_* in
# ATen/autocast_mode.h), the inputs it gets, and the dtype CUDA's policy
# gives its result: "low" is the autocast dtype, "float" float32.
POLICY_CASES = {
    "lower_precision_fp/mv": (torch.mv, ("float", "float"), "low"),
    "fp32/acos": (torch.acos, ("low",), "float"),
    "fp32_set_opt_dtype/prod": (torch.prod, ("low",), "float"),
    # torch.norm() is Python that calls linalg_vector_norm; norm.Scalar is
    # what TorchScript and C++ callers reach.
    "fp32_append_dtype/norm": (lambda x: torch.ops.aten.norm.Scalar(x, 2), ("low",), "float"),
    "promote/dot-mixed": (torch.dot, ("low", "float"), "float"),
    "promote/dot-same": (torch.dot, ("low", "low"), "low"),
}
_POLICY_SHAPES = {torch.mv: [(3, 4), (4,)]}


@pytest.mark.parametrize("case", sorted(POLICY_CASES))
@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_each_of_cudas_policy_lists_gives_cudas_dtype(case, dtype, generator):
    op, kinds, result_kind = POLICY_CASES[case]
    kind_dtype = {"low": dtype, "float": torch.float32}
    shapes = _POLICY_SHAPES.get(op, [(4,)] * len(kinds))
    inputs = [
        (torch.rand(shape, generator=generator) - 0.5).to(kind_dtype[kind])
        for shape, kind in zip(shapes, kinds)
    ]
    with torch.autocast("phantom", dtype=dtype):
        actual = op(*_on_phantom(*inputs))
    expected_dtype = kind_dtype[result_kind]
    assert actual.dtype == expected_dtype
    # The value is the op computed on the CPU from inputs cast the same way.
    expected = op(*[t.to(expected_dtype) for t in inputs])
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def test_promote_refuses_to_mix_the_two_low_precision_types_as_cuda_does():
    half = torch.randn(4, dtype=torch.float16, device="phantom")
    with torch.autocast("phantom", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"):
            torch.dot(half, half.bfloat16())


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_explicit_dtype_argument_wins_over_the_fp32_policy(dtype):
    x = torch.randn(4, 5).to(dtype)
    with torch.autocast("phantom", dtype=dtype):
        out = torch.softmax(x.to("phantom"), dim=1, dtype=torch.float64)
    assert out.dtype == torch.float64


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_inputs_are_promoted_to_the_widest_type(dtype):
    low = torch.randn(5).to(dtype)
    full = torch.randn(5)
    expected = torch.addcmul(full, low.float(), full)
    with torch.autocast("phantom", dtype=dtype):
        actual = torch.addcmul(*_on_phantom(full, low, full))
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def test_ops_without_a_policy_keep_their_input_dtype():
    x = torch.randn(4, 4)
    with torch.autocast("phantom", dtype=torch.bfloat16):
        y = x.to("phantom")
        assert torch.relu(y).dtype == torch.float32
        assert (y + 1).dtype == torch.float32
        low = y @ y
        assert torch.relu(low).dtype == torch.bfloat16


def test_autocast_default_dtype_is_float16_and_supported_dtypes_are_reported():
    assert torch.phantom.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    x = torch.randn(3, 3, device="phantom")
    with torch.autocast("phantom"):
        assert (x @ x).dtype == torch.float16


def test_autocast_leaves_other_devices_and_disabled_regions_alone():
    cpu = torch.randn(3, 3)
    x = cpu.to("phantom")
    with torch.autocast("phantom", dtype=torch.bfloat16):
        assert (cpu @ cpu).dtype == torch.float32  # not a phantom tensor
        with torch.autocast("phantom", enabled=False):
            assert (x @ x).dtype == torch.float32
        assert (x @ x).dtype == torch.bfloat16
    assert (x @ x).dtype == torch.float32  # and off again after the region


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(4, device="phantom")
    with torch.autocast("phantom", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, p)
        logits_loss = F.binary_cross_entropy_with_logits(p, p)
    assert logits_loss.dtype == torch.float32


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_backward_through_autocast_matches_cpu(dtype, generator):
    # Gradients come back in the parameters' dtype (float32), computed by
    # the low-precision backward of the matmul, as on the CPU.
    w = torch.randn(8, 4, generator=generator)
    x = torch.randn(5, 8, generator=generator)

    def grad_on(device):
        weight = w.to(device).requires_grad_()
        with torch.autocast(device, dtype=dtype):
            loss = F.mse_loss(x.to(device) @ weight, torch.zeros(5, 4, device=device))
        loss.backward()
        return loss.detach().cpu(), weight.grad.cpu()

    loss_p, grad_p = grad_on("phantom")
    loss_c, grad_c = grad_on("cpu")
    assert grad_p.dtype == torch.float32
    torch.testing.assert_close(loss_p, loss_c, rtol=0, atol=0)
    torch.testing.assert_close(grad_p, grad_c, rtol=0, atol=0)


def _train_with_grad_scaler(device, dtype, steps=6, poison_step=2):
    """A few steps of an autocast MLP with a GradScaler. On `poison_step`
    one gradient is made infinite after backward, so the scaler must skip
    that optimizer step and halve the scale."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**12, growth_interval=2)
    data = torch.Generator().manual_seed(1)
    losses, scales, skipped = [], [], []
    for step in range(steps):
        inputs = torch.randn(8, 16, generator=data).to(device)
        targets = torch.randn(8, 3, generator=data).to(device)
        optimizer.zero_grad()
        with torch.autocast(device, dtype=dtype):
            loss = F.mse_loss(model(inputs), targets)
        scaler.scale(loss).backward()
        if step == poison_step:
            with torch.no_grad():
                model[0].weight.grad[0, 0] = float("inf")
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        after = list(model.parameters())
        skipped.append(all(torch.equal(b, a.detach()) for b, a in zip(before, after)))
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    params = [p.detach().cpu() for p in model.parameters()]
    return losses, scales, skipped, params


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_grad_scaler_training_matches_cpu_and_skips_inf_steps(dtype):
    losses_p, scales_p, skipped_p, params_p = _train_with_grad_scaler("phantom", dtype)
    losses_c, scales_c, skipped_c, params_c = _train_with_grad_scaler("cpu", dtype)

    # The poisoned step was skipped and the scale halved; the others ran.
    assert skipped_p == [False, False, True, False, False, False]
    assert scales_p[2] == scales_p[1] / 2
    # growth_interval=2: two good steps in a row double the scale.
    assert scales_p[1] == 2 * scales_p[0] or scales_p[0] == 2.0**12
    assert scales_p[4] == 2 * scales_p[3]

    assert skipped_p == skipped_c
    assert scales_p == scales_c
    assert losses_p == losses_c
    for p, c in zip(params_p, params_c):
        torch.testing.assert_close(p, c, rtol=0, atol=0)


def test_grad_scaler_state_lives_on_phantom():
    scaler = torch.amp.GradScaler("phantom")
    loss = torch.ones((), device="phantom", requires_grad=True) * 2
    scaled = scaler.scale(loss)
    assert scaled.device.type == "phantom"
    assert scaler._scale.device.type == "phantom"
    assert scaled.item() == 2 * 2.0**16
