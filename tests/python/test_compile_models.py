"""The example models (examples/train_models.py) train under torch.compile
on phantom as they train eagerly on the CPU.

Each model's forward is compiled (Inductor; AOTAutograd compiles the
backward too) and trained for a few steps on phantom and on the CPU from
the same initial weights and batches; losses and final parameters are
compared. The reference is the CPU's compiled run: Inductor's dropout
draws its masks its own way (seeds from the device's generator, which on
phantom are the CPU's numbers), so no compiled run matches an eager one.
The MLP and the DLRM agree bit for bit; convolution and attention models
within float32 rounding (their extern kernels are the same, the
summation order of some fused reductions is not always).
"""

import os
import sys

import pytest
import torch
import torch._dynamo
import torch._inductor.config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import train_models  # noqa: E402

pytestmark = pytest.mark.requires_kernel_view("torch.compile's kernels run over the kernel view")

STEPS = 3
BIT_EXACT = {"mlp", "dlrm-adam"}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _train(name, device, compiled, steps=STEPS, seed=0):
    spec = train_models.MODELS[name]
    torch.manual_seed(seed)
    model = spec.make_model().to(device)
    batches = spec.make_batches(steps, torch.Generator().manual_seed(seed + 1))
    optimizer = spec.optimizer(list(model.parameters()))
    forward = torch.compile(model) if compiled else model
    torch.manual_seed(seed + 2)
    model.train()
    losses = []
    for batch in batches:
        optimizer.zero_grad()
        loss = spec.loss(forward(*[t.to(device) for t in batch.inputs]),
                         batch.target.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "lstm", "dlrm-adam"])
def test_compiled_training_matches_the_cpu(name):
    with torch._inductor.config.patch(compile_threads=1):
        torch._dynamo.reset()
        losses, parameters = _train(name, "phantom", compiled=True)
        torch._dynamo.reset()
        expected_losses, expected_parameters = _train(name, "cpu", compiled=True)
    assert losses[-1] == losses[-1]  # not NaN
    if name in BIT_EXACT:
        assert losses == expected_losses
    torch.testing.assert_close(losses, expected_losses, **TOLERANCE)
    for key, expected in expected_parameters.items():
        torch.testing.assert_close(parameters[key], expected, msg=key, **TOLERANCE)
    # Training did something (the comparison is not between two no-ops).
    initial = _train(name, "cpu", compiled=False, steps=0)[1]
    assert any(not torch.equal(initial[k], expected_parameters[k]) for k in initial)
    torch._dynamo.reset()
