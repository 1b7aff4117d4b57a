"""Device memory is not host-addressable.

The phantom device lives in host RAM, but like a discrete accelerator its
pointers must not be dereferenced by host code: doing so by mistake (a
custom op reading ``data_ptr()``, ctypes, numpy over the pointer) must fault
at once with a message saying device memory was touched from the host,
rather than silently work and hide the bug until real hardware. Each case
runs in a subprocess, since the expected outcome is a crash.
"""

import signal

import pytest
import torch

from conftest import run_python

READ_DATA_PTR = """
import ctypes, torch, torch_phantom
x = torch.arange(16, dtype=torch.float32, device={device!r})
torch.phantom.synchronize() if x.device.type == "phantom" else None
print("before", flush=True)
data = ctypes.string_at(x.data_ptr(), 4)
print("read", data.hex(), flush=True)
"""

WRITE_DATA_PTR = """
import ctypes, torch, torch_phantom
x = torch.zeros(4, device={device!r})
ctypes.memset(x.data_ptr(), 0xff, 4)
print("wrote", flush=True)
"""


@pytest.mark.parametrize("template", [READ_DATA_PTR, WRITE_DATA_PTR], ids=["read", "write"])
def test_host_access_to_device_memory_faults(template):
    result = run_python(template.format(device="phantom"))
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stderr)
    assert "device memory" in result.stderr, result.stderr
    assert "read " not in result.stdout and "wrote" not in result.stdout


def test_host_access_to_view_of_device_1_faults(two_devices):
    code = READ_DATA_PTR.format(device="phantom:1").replace("x.data_ptr()", "x[5:].data_ptr()")
    result = run_python(code)
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stderr)
    assert "device memory" in result.stderr, result.stderr


@pytest.mark.parametrize("template", [READ_DATA_PTR, WRITE_DATA_PTR], ids=["read", "write"])
def test_same_code_on_cpu_tensor_works(template):
    result = run_python(template.format(device="cpu"))
    assert result.returncode == 0, result.stderr
    assert "read" in result.stdout or "wrote" in result.stdout


def test_pinned_host_memory_is_host_addressable():
    # Pinned memory is host memory: reading it from host code is fine.
    import ctypes

    x = torch.arange(4, dtype=torch.int32).pin_memory()
    assert ctypes.string_at(x.data_ptr(), 4) == (0).to_bytes(4, "little")
    assert ctypes.string_at(x.data_ptr() + 12, 4) == (3).to_bytes(4, "little")


def test_numpy_of_phantom_tensor_is_refused():
    # The supported path is .cpu().numpy(); .numpy() must not hand out a
    # host view of device memory.
    x = torch.ones(3, device="phantom")
    with pytest.raises(TypeError, match=r"can't convert phantom:0 device type tensor to numpy\. "
                                         r"Use Tensor\.cpu\(\)"):
        x.numpy()
