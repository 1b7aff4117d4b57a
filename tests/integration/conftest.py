"""Setup of the integration suite: the libraries people train with
(Hugging Face transformers and accelerate, PyTorch Lightning, TorchRec with
fbgemm-gpu-cpu) run on phantom and are compared with the CPU.

scripts/install_test_deps.sh installs the pinned versions
(requirements.txt, requirements-no-deps.txt). Nothing is downloaded at test
time: models are built from configs, and the Hugging Face hub is offline.
The environment below is set before torch (and so the phantom driver) is
imported: two devices, so ``devices=[1]`` and ``phantom:1`` are covered.
"""

import os

os.environ.setdefault("PHANTOM_DEVICE_COUNT", "2")
os.environ.setdefault("PHANTOM_DEVICE_MEMORY", "1GiB")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch_phantom  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _restore_current_device():
    """Every test starts on phantom:0 and leaves every device synchronized."""
    torch.phantom.set_device(0)
    yield
    torch.phantom.set_device(0)
    for index in range(torch.phantom.device_count()):
        torch.phantom.synchronize(index)


def assert_same_tensors(phantom, cpu, what):
    """Each phantom tensor of ``phantom`` equals the CPU's bit for bit."""
    phantom, cpu = list(phantom), list(cpu)
    assert len(phantom) == len(cpu), what
    for i, (p, c) in enumerate(zip(phantom, cpu)):
        assert p.device.type == "phantom", f"{what}[{i}] is on {p.device}"
        assert torch.equal(p.cpu(), c), (
            f"{what}[{i}] differs from the CPU's by {(p.cpu() - c).abs().max().item()}")
