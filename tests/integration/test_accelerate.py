"""Hugging Face accelerate on phantom, against the CPU.

accelerate finds the device through ``torch.accelerator`` (phantom is the
current accelerator), so ``Accelerator()`` needs nothing from us. A training
loop through ``prepare()`` must then train the model that was prepared, on
phantom, exactly as the same loop written by hand trains it on the CPU: in
float32, and in float16 mixed precision, where accelerate autocasts the
forward and steps through a GradScaler on phantom (the CPU's reference
autocasts on the CPU and scales with the CPU's GradScaler).
"""
import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState

from conftest import assert_same_tensors


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    """accelerate keeps one state per process, fixed by the first
    Accelerator(); each test builds its own."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _data():
    g = torch.Generator().manual_seed(1)
    dataset = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g),
                                             torch.randn(32, 1, generator=g))
    return torch.utils.data.DataLoader(dataset, batch_size=8)


def _train_with_accelerate(mixed_precision):
    accelerator = Accelerator(mixed_precision=mixed_precision)
    model, optimizer = _model_and_optimizer()
    prepared, optimizer, data = accelerator.prepare(model, optimizer, _data())
    losses = []
    for x, y in data:
        assert x.device.type == "phantom"
        loss = F.mse_loss(prepared(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return accelerator, model, losses


def _train_on_the_cpu(float16):
    model, optimizer = _model_and_optimizer()
    scaler = torch.amp.GradScaler("cpu", enabled=float16)
    losses = []
    for x, y in _data():
        with torch.autocast("cpu", dtype=torch.float16, enabled=float16):
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return model, losses, scaler


def test_accelerator_finds_phantom():
    accelerator = Accelerator()
    assert accelerator.device.type == "phantom"
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    assert {p.device.type for p in model.parameters()} == {"phantom"}


def test_prepare_and_train_in_float32_like_the_cpu():
    _, model, losses = _train_with_accelerate("no")
    cpu_model, cpu_losses, _ = _train_on_the_cpu(float16=False)
    assert_same_tensors(losses, cpu_losses, "losses")
    # The model handed to prepare() is the one trained, on phantom.
    assert_same_tensors(model.parameters(), cpu_model.parameters(), "parameters")


def test_prepare_and_train_in_float16_with_grad_scaler_like_the_cpu():
    accelerator, model, losses = _train_with_accelerate("fp16")
    cpu_model, cpu_losses, cpu_scaler = _train_on_the_cpu(float16=True)
    assert isinstance(accelerator.scaler, torch.amp.GradScaler)
    assert accelerator.scaler._device == "phantom"
    assert_same_tensors(losses, cpu_losses, "losses")
    assert_same_tensors(model.parameters(), cpu_model.parameters(), "parameters")
    # The first step's gradients overflow float16 at the initial scale, so
    # both scalers skipped it and halved the scale.
    assert accelerator.scaler.get_scale() == cpu_scaler.get_scale() < 65536.0
