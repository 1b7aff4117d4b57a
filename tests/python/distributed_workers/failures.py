"""A rank that dies, hangs or hits a device error in the middle of training.

    failures.py dead    the last rank exits between two all_reduces
    failures.py hung    the last rank sleeps past the group timeout instead
    failures.py fault   rank 0's all_reduce hits an injected device fault

A second argument, "small", makes the all_reduces 64 bytes: small jobs,
whose data travels in their agreement message; by default they move
256 KiB.

The other ranks (every rank, for "fault") must raise an error that names
the collective and the rank at fault, without waiting for the group's
timeout when the peer is gone, and leave no device memory allocated.
Each rank reports what it raised and the device memory it ends with.
"""

import datetime
import os
import sys
import time

from common import RANK, WORLD, device, dist, report, torch

from torch_phantom.testing import faults

MODE = sys.argv[1]
ELEMENTS = 16 if sys.argv[2:] == ["small"] else 1 << 16
TIMEOUT_S = 3 if MODE == "hung" else 60
LAST = WORLD - 1

dist.init_process_group(
    "pccl", timeout=datetime.timedelta(seconds=TIMEOUT_S), device_id=device()
)
DEV = device()
baseline = torch.phantom.memory_allocated(DEV)

t = torch.ones(ELEMENTS, device=DEV)
dist.all_reduce(t)  # collective #1: everyone is here
torch.phantom.synchronize()

if RANK == LAST and MODE == "dead":
    os._exit(3)
if RANK == LAST and MODE == "hung":
    time.sleep(TIMEOUT_S + 4)
    report(error="", slept=True)
    os._exit(0)  # the group is broken; it has nothing left to do

error = ""
if RANK == 0 and MODE == "fault":
    faults.fail_kernel(1)  # the next kernel is the collective itself
start = time.monotonic()
try:
    dist.all_reduce(t)  # collective #2
    t.cpu()  # its error, if any, reaches this rank's stream here
except RuntimeError as e:
    error = f"{type(e).__name__}: {e}"
elapsed = time.monotonic() - start
faults.reset()

# The group is broken: a later call says so at once.
later = ""
try:
    dist.all_reduce(torch.ones(1, device=DEV))
except RuntimeError as e:
    later = str(e)

# Nothing is left queued, and every device buffer went back.
try:
    torch.phantom.synchronize()
except RuntimeError:
    pass  # the communication stream's own copy of the error
del t
leaked = torch.phantom.memory_allocated(DEV) - baseline
report(error=error, later=later, leaked=leaked, elapsed=elapsed)
# Stay a moment, as a real job's ranks would while they handle the error:
# rank 0 hosts the store the peers read to name the rank at fault.
time.sleep(2)
os._exit(0)  # do not wait at exit for peers that are gone
