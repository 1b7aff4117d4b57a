"""The remote driver (device/remote, docs/remote-driver.md) under torch.

Each test runs a fresh interpreter with ``PHANTOM_DRIVER`` naming
``libphantom_remote.so``, the second HAL driver: the device is a server
process the driver starts, with no kernel view. What works without the
runtime's copying CPU fallback is checked here: tensors created on the
device and copied back (pageable and pinned, and views of them; fills such
as ``torch.zeros`` are CPU kernels, which need the fallback), the device
count and
properties the server answers, memory statistics, that the server keeps
none of the program's files open, and device loss: when the
server is killed, the next phantom call raises a RuntimeError saying the
device was lost, and nothing hangs (each run has a bounded timeout).
"""

import json
import pathlib

import pytest
import torch_phantom

from conftest import run_python

DRIVER = pathlib.Path(torch_phantom.__file__).resolve().parent / "libphantom_remote.so"
SERVER = DRIVER.parent / "phantom_remote_server"

pytestmark = pytest.mark.skipif(
    not (DRIVER.exists() and SERVER.exists()),
    reason="the remote driver is not installed next to the runtime")

ENV = {"PHANTOM_DRIVER": str(DRIVER), "PHANTOM_DEVICE_COUNT": "2",
       "PHANTOM_DEVICE_MEMORY": "256MiB"}


def run(code):
    result = run_python(code, ENV, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tensors_round_trip_through_the_server():
    state = run("""
import json, torch, torch_phantom
x = torch.arange(1000, dtype=torch.float32)
d = x.to("phantom")
pinned = torch.empty(1000).pin_memory()
pinned.copy_(d, non_blocking=True)
torch.phantom.synchronize()
e = torch.empty(1000, device="phantom:1")
e.copy_(d)
print(json.dumps({
    "device": str(d.device),
    "pageable": torch.equal(d.cpu(), x),
    "pinned": torch.equal(pinned, x),
    "cross_device": torch.equal(e.cpu(), x),
    "view": d[10:13].cpu().tolist(),
}))
""")
    assert state == {"device": "phantom:0", "pageable": True, "pinned": True,
                     "cross_device": True,
                     "view": [10.0, 11.0, 12.0]}


def test_device_count_and_properties_come_from_the_server():
    state = run("""
import json, torch, torch_phantom
p = torch.phantom.get_device_properties(1)
print(json.dumps({"count": torch.phantom.device_count(), "name": p.name,
                  "total": p.total_memory}))
""")
    assert state == {"count": 2, "name": "Phantom remote accelerator",
                     "total": 256 << 20}


def test_memory_statistics_follow_allocations():
    state = run("""
import json, torch, torch_phantom
free0, total = torch.phantom.mem_get_info()
x = torch.empty(16 << 20, dtype=torch.uint8, device="phantom")
allocated = torch.phantom.memory_allocated()
free1, _ = torch.phantom.mem_get_info()
print(json.dumps({"total": total, "allocated": allocated,
                  "server_free_dropped": free0 - free1 >= (16 << 20)}))
""")
    assert state == {"total": 256 << 20, "allocated": 16 << 20,
                     "server_free_dropped": True}


def test_the_server_keeps_none_of_the_programs_files_open():
    # A socket or pipe the program opened before the device started (Gloo's
    # connections, a store's) must close when the program closes it: a
    # peer waiting on it sees the close, not the server's copy holding it.
    state = run("""
import json, os, torch, torch_phantom
r, w = os.pipe()
os.set_inheritable(w, True)  # no close-on-exec, as a C library's socket may be
x = torch.ones(4, device="phantom")  # starts the server
os.close(w)
os.set_blocking(r, False)
try:
    closed = os.read(r, 1) == b""
except BlockingIOError:
    closed = False  # another process still holds the write end
print(json.dumps({"closed": closed, "value": x.cpu().tolist()}))
""")
    assert state == {"closed": True, "value": [1.0, 1.0, 1.0, 1.0]}


def test_a_killed_server_is_a_clear_error_not_a_hang():
    state = run("""
import json, os, signal, time, torch, torch_phantom
x = torch.ones(4, device="phantom")
servers = []
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        continue
    if int(fields[1]) == os.getpid() and "phantom_remote" in open(f"/proc/{pid}/comm").read():
        servers.append(int(pid))
os.kill(servers[0], signal.SIGKILL)
errors = []
for attempt in (lambda: x.cpu(), lambda: torch.ones(2, device="phantom"),
                lambda: torch.phantom.synchronize()):
    try:
        attempt()
        errors.append(None)
    except RuntimeError as error:
        errors.append(str(error))
print(json.dumps({"servers": len(servers), "errors": errors}))
""")
    assert state["servers"] == 1
    for error in state["errors"]:
        assert error is not None, state
        assert "device was lost" in error and "killed by signal 9" in error, error
