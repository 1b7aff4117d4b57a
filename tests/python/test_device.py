"""Device names, registration and the ``torch.phantom`` device module.

What a user relies on to address the device the way they address CUDA:
device strings, the ``privateuseone`` alias, device counting and selection
(per thread), the ``torch.phantom.device`` context manager, the generated
``Tensor.phantom()`` / ``is_phantom`` / ``Module.phantom()`` methods, and the
``torch.accelerator`` API.
"""

import threading

import pytest
import torch

from conftest import DEVICE_COUNT


def test_device_strings():
    d = torch.device("phantom")
    assert d.type == "phantom" and d.index is None
    d1 = torch.device("phantom:1")
    assert d1.type == "phantom" and d1.index == 1
    assert torch.device("phantom", 1) == d1


def test_privateuseone_is_an_alias_of_phantom():
    alias = torch.device("privateuseone:1")
    assert alias.type == "phantom"
    assert alias == torch.device("phantom:1")
    x = torch.ones(2, device="privateuseone")
    assert x.device.type == "phantom"


def test_device_count_and_availability():
    assert torch.phantom.device_count() == DEVICE_COUNT == 2
    assert torch.phantom.is_available()


def test_set_device_and_current_device(two_devices):
    assert torch.phantom.current_device() == 0
    torch.phantom.set_device(1)
    assert torch.phantom.current_device() == 1
    # A device-less "phantom" means the current device.
    x = torch.empty(1, device="phantom")
    assert x.device == torch.device("phantom:1")
    torch.phantom.set_device("phantom:0")
    assert torch.phantom.current_device() == 0
    torch.phantom.set_device(torch.device("phantom", 1))
    assert torch.phantom.current_device() == 1


def test_current_device_is_per_thread(two_devices):
    torch.phantom.set_device(1)
    seen = {}

    def worker():
        seen["start"] = torch.phantom.current_device()
        torch.phantom.set_device(1)
        seen["tensor"] = torch.zeros(1, device="phantom").device
        torch.phantom.set_device(0)
        seen["end"] = torch.phantom.current_device()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["start"] == 0, "a new thread must start on device 0"
    assert seen["tensor"] == torch.device("phantom:1")
    assert seen["end"] == 0
    # The other thread's set_device(0) did not change this thread's device.
    assert torch.phantom.current_device() == 1


def test_synchronize_completes_queued_work(two_devices):
    x = torch.arange(1000, dtype=torch.float32, device="phantom:1")
    y = x * 2
    torch.phantom.synchronize()
    torch.phantom.synchronize(1)
    torch.phantom.synchronize("phantom:1")
    torch.testing.assert_close(y.cpu(), torch.arange(1000, dtype=torch.float32) * 2)


def test_device_context_manager_restores_previous(two_devices):
    assert torch.phantom.current_device() == 0
    with torch.phantom.device(1):
        assert torch.phantom.current_device() == 1
        x = torch.ones(3, device="phantom")
        with torch.phantom.device("phantom:0"):
            assert torch.phantom.current_device() == 0
        assert torch.phantom.current_device() == 1
    assert x.device == torch.device("phantom:1")
    assert torch.phantom.current_device() == 0


def test_device_context_manager_restores_on_exception(two_devices):
    with pytest.raises(ValueError, match="boom"):
        with torch.phantom.device(1):
            assert torch.phantom.current_device() == 1
            raise ValueError("boom")
    assert torch.phantom.current_device() == 0


def test_device_context_manager_none_is_noop(two_devices):
    torch.phantom.set_device(1)
    with torch.phantom.device(None):
        assert torch.phantom.current_device() == 1
    assert torch.phantom.current_device() == 1


def test_tensor_phantom_and_is_phantom(two_devices):
    cpu = torch.arange(6.0).reshape(2, 3)
    assert not cpu.is_phantom
    x = cpu.phantom()
    assert x.is_phantom
    assert x.device == torch.device("phantom:0")
    torch.testing.assert_close(x.cpu(), cpu)
    y = cpu.phantom(1)
    assert y.device == torch.device("phantom:1")
    torch.testing.assert_close(y.cpu(), cpu)


def test_module_phantom_moves_parameters_and_buffers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    returned = model.phantom()
    assert returned is model
    for name, param in model.named_parameters():
        assert param.device.type == "phantom", name
    for name, buf in model.named_buffers():
        assert buf.device.type == "phantom", name
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value.cpu(), expected[key])


def test_factories_on_phantom():
    x = torch.randn(3, device="phantom")
    assert x.device == torch.device("phantom:0")
    assert x.shape == (3,) and x.dtype == torch.float32
    z = torch.zeros(2, 3, device="phantom", dtype=torch.int64)
    torch.testing.assert_close(z.cpu(), torch.zeros(2, 3, dtype=torch.int64))
    a = torch.arange(10, device="phantom")
    torch.testing.assert_close(a.cpu(), torch.arange(10))
    f = torch.full((2, 2), 7.5, device="phantom")
    torch.testing.assert_close(f.cpu(), torch.full((2, 2), 7.5))
    e = torch.eye(3, device="phantom")
    torch.testing.assert_close(e.cpu(), torch.eye(3))
    l = torch.linspace(0, 1, 5, device="phantom")
    torch.testing.assert_close(l.cpu(), torch.linspace(0, 1, 5))


def test_to_and_cpu_round_trip():
    cpu = torch.randn(4, 5)
    x = cpu.to("phantom")
    assert x.is_phantom
    back = x.cpu()
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, cpu, rtol=0, atol=0)
    # .to() with a device and a dtype at once
    y = cpu.to("phantom", torch.float64)
    assert y.dtype == torch.float64 and y.is_phantom
    torch.testing.assert_close(y.cpu(), cpu.double(), rtol=0, atol=0)
    # .to() of a tensor already there returns the same tensor, as on CUDA
    assert x.to("phantom:0") is x


def test_repr_shows_device_and_values():
    cpu = torch.tensor([1.5, -2.25, 3.0])
    x = cpu.to("phantom")
    text = repr(x)
    assert "device='phantom:0'" in text
    assert repr(cpu) in text.replace(", device='phantom:0'", "")
    assert str(x) == text


def test_print_of_int_tensor_on_device_1(two_devices, capsys):
    x = torch.tensor([[1, 2], [3, 4]], device="phantom:1")
    print(x)
    out = capsys.readouterr().out
    assert "device='phantom:1'" in out
    assert "[3, 4]" in out


def test_accelerator_api():
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == "phantom"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.phantom.device_count()


def test_accelerator_set_device_index(two_devices):
    torch.accelerator.set_device_index(1)
    assert torch.phantom.current_device() == 1
    assert torch.accelerator.current_device_index() == 1
    torch.accelerator.synchronize()
