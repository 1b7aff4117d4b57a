"""PyTorch Lightning on phantom (torch_phantom.lightning), against the CPU.

``Trainer(accelerator="phantom")`` is spelled as for any built-in
accelerator: torch_phantom registers the name when Lightning is imported.
Lightning installs two namespaces with separate classes, lightning.pytorch
(used here) and pytorch_lightning (one test). Each test trains a small model with one Trainer on phantom and one on the
CPU and compares the parameters bit for bit; the module records, at every
training step, where its batch and parameters were and whether autocast was
on for their device.
"""
import os
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.accelerators import AcceleratorRegistry

from conftest import assert_same_tensors


def _regression(namespace=pl):
    """A small regression LightningModule of ``namespace``'s, seeded."""

    class Regression(namespace.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                           torch.nn.Linear(16, 1))
            self.steps = []  # (batch device, parameter device, output dtype, autocast on)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self(x)
            self.steps.append((x.device, self.net[0].weight.device, out.dtype,
                               torch.is_autocast_enabled(x.device.type)))
            return F.mse_loss(out.float(), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    return Regression()


def _data():
    g = torch.Generator().manual_seed(1)
    dataset = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g),
                                             torch.randn(32, 1, generator=g))
    return torch.utils.data.DataLoader(dataset, batch_size=8)


def _fit(namespace=pl, max_epochs=2, **trainer_args):
    module = _regression(namespace)
    trainer = namespace.Trainer(max_epochs=max_epochs, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                **trainer_args)
    trainer.fit(module, _data())
    return module, trainer


def test_phantom_is_a_registered_accelerator():
    assert "phantom" in AcceleratorRegistry.available_accelerators()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_trainer_trains_on_phantom_like_the_cpu(precision):
    module, _ = _fit(accelerator="phantom", devices=1, precision=precision)
    cpu_module, _ = _fit(accelerator="cpu", devices=1, precision=precision)
    mixed = precision == "bf16-mixed"
    phantom0 = torch.device("phantom", 0)
    want = (phantom0, phantom0, torch.bfloat16 if mixed else torch.float32, mixed)
    assert module.steps == [want] * 8
    # Lightning moves the model back to the CPU when fit ends, on phantom as
    # on CUDA.
    assert_same_tensors([p.to("phantom") for p in module.parameters()],
                        cpu_module.parameters(), f"parameters trained with {precision}")


def test_float16_mixed_precision_scales_on_phantom_like_the_cpu():
    module, trainer = _fit(accelerator="phantom", devices=1, precision="16-mixed")
    scaler = trainer.strategy.precision_plugin.scaler
    assert scaler is not None and scaler._device == "phantom"
    assert {step[2:] for step in module.steps} == {(torch.float16, True)}
    # Lightning turns 16-mixed into bf16-mixed on the CPU; the reference is
    # Lightning's float16 step written by hand.
    cpu = _regression()
    optimizer = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    cpu_scaler = torch.amp.GradScaler("cpu")
    for _ in range(2):
        for x, y in _data():
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                out = cpu(x)
            cpu_scaler.scale(F.mse_loss(out.float(), y)).backward()
            cpu_scaler.unscale_(optimizer)
            cpu_scaler.step(optimizer)
            cpu_scaler.update()
    assert_same_tensors([p.to("phantom") for p in module.parameters()], cpu.parameters(),
                        "parameters trained with 16-mixed")
    assert scaler.get_scale() == cpu_scaler.get_scale()


def test_devices_names_the_phantom_device():
    module, _ = _fit(accelerator="phantom", devices=[1])
    assert {step[:2] for step in module.steps} == {(torch.device("phantom", 1),) * 2}


def test_more_than_one_device_is_refused_at_the_trainer():
    with pytest.raises(ValueError, match="phantom has no distributed .c10d. backend"):
        pl.Trainer(accelerator="phantom", devices=2)
    with pytest.raises(ValueError, match=r"phantom device\(s\) \[5\], but the driver offers 2"):
        pl.Trainer(accelerator="phantom", devices=[5])


def test_the_pytorch_lightning_namespace_trains_on_phantom_too():
    import pytorch_lightning

    module, trainer = _fit(pytorch_lightning, max_epochs=1, accelerator="phantom",
                           devices=1, precision="bf16-mixed")
    assert type(trainer.accelerator).__mro__[1] is pytorch_lightning.accelerators.Accelerator
    phantom0 = torch.device("phantom", 0)
    assert module.steps == [(phantom0, phantom0, torch.bfloat16, True)] * 4


def test_registration_does_not_depend_on_import_order():
    # Lightning imported first, torch_phantom's autoload turned off: the
    # registration happens when torch_phantom is imported afterwards.
    code = (
        "import pytorch_lightning\n"
        "from pytorch_lightning.accelerators import AcceleratorRegistry\n"
        "assert 'phantom' not in AcceleratorRegistry\n"
        "import torch_phantom\n"
        "assert 'phantom' in AcceleratorRegistry\n"
        "t = pytorch_lightning.Trainer(accelerator='phantom', devices=1, logger=False)\n"
        "print(type(t.accelerator).__name__)\n"
    )
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "PhantomAccelerator"


def test_a_failing_registration_warns_and_lightning_still_imports():
    code = (
        "import warnings\n"
        "import torch_phantom.lightning\n"
        "def broken(namespace):\n"
        "    raise RuntimeError('registry moved')\n"
        "torch_phantom.lightning.register = broken\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import pytorch_lightning\n"
        "print([str(w.message) for w in caught if 'torch_phantom' in str(w.message)])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("torch_phantom could not register the phantom device with "
            "pytorch_lightning.accelerators: RuntimeError: registry moved") in result.stdout
