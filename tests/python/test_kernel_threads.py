"""Small kernels that split over whole outputs run on one OpenMP thread on
the stream worker (device/hostexec/phantom/KernelThreads.h): no OpenMP team is woken
for them, larger kernels still get one, and the answers are the CPU's bits
computed on all of its threads. A worker left idle gives its team back
(device/fake/idle_thread_teams.h), and the host-side checks of a call run
on one thread, so no other thread gets a team for device work."""
import pytest
import torch
import torch.nn.functional as F

import torch_phantom  # noqa: F401
from conftest import run_python

needs_threads = pytest.mark.skipif(
    torch.get_num_threads() < 2, reason="needs an OpenMP team of two or more threads")

# For the child scripts below: the stream worker's threads (its OpenMP
# helpers inherit its name).
pytestmark = pytest.mark.requires_kernel_view(
    "checks the threads of kernels running as stream work over the kernel view")

_WORKER_THREADS = r"""
import os

def on_the_worker():
    # Waits for the current stream by polling an event: a synchronize or a
    # copy to the host may run the queued kernels on this thread instead
    # (a waiting host thread runs the queue), and these scripts count the
    # worker's threads.
    import torch
    event = torch.phantom.Event()
    event.record()
    while not event.query():
        pass

def worker_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip()
             for t in os.listdir("/proc/self/task")]
    return sum(name.startswith("ph-stream-d0") for name in names)

def team_after(kernel, tries=3):
    # The worker's threads right after `kernel` ran on it. A worker idle
    # for a few ms gives its OpenMP team back (device/fake/
    # idle_thread_teams.h); should this process stall that long between
    # the kernel's end and the count, the kernel runs again.
    for _ in range(tries):
        kernel()
        on_the_worker()
        count = worker_threads()
        if count > 1:
            return count
    return count
"""

# The worker's threads after small kernels of the three ops, then after a
# large EmbeddingBag (8192 indices of width 8: 65536 elements of work, over
# ATen's grain).
_WORKER_TEAM = _WORKER_THREADS + r"""
import torch, torch.nn.functional as F, torch_phantom
d = "phantom"
g = torch.Generator().manual_seed(0)
weight = torch.randn(40, 8, generator=g).to(d).requires_grad_()
indices = torch.randint(0, 40, (40,), generator=g).to(d)
offsets = torch.arange(0, 40, 3)[:16].to(d)
weights = torch.rand(40, generator=g).to(d)
x = torch.randn(16, generator=g).to(d)
torch.ones(1, device=d).cpu()
for _ in range(5):
    F.embedding_bag(indices, weight, offsets, mode="sum", per_sample_weights=weights)
    F.embedding_bag(indices, weight.detach(), offsets, mode="mean")
    F.logsigmoid(x)
on_the_worker()
small = worker_threads()
big = torch.randint(0, 40, (8192,), generator=g).to(d)
big_offsets = torch.arange(0, 8192, 64).to(d)
print(small, team_after(lambda: F.embedding_bag(big, weight.detach(), big_offsets, mode="sum")))
"""


@needs_threads
def test_small_bag_and_log_sigmoid_kernels_wake_no_openmp_team():
    result = run_python(_WORKER_TEAM)
    assert result.returncode == 0, result.stderr
    small, large = map(int, result.stdout.split())
    # Only the worker itself: no helper thread was ever started for the
    # small kernels. Without the one-thread rule the first of them starts
    # the worker's team (2 here).
    assert small == 1, f"{small} worker threads after small kernels"
    # A large kernel still runs on the team: the worker's own thread count
    # was given back after each small one.
    assert large > 1, "a large EmbeddingBag ran on one thread"


# torch.set_num_threads() on the host, after the worker has started: the
# worker's kernels use that many OpenMP threads too (the thread count
# decides the bits of some CPU kernels, so phantom must follow it).
_FOLLOWS_SET_NUM_THREADS = _WORKER_THREADS + r"""
import torch, torch_phantom
torch.ones(1, device="phantom").cpu()  # the worker exists, with no team
x = torch.randn(4_000_000, generator=torch.Generator().manual_seed(0))
counts = []
xd = x.to("phantom")
for n in (1, 2):
    torch.set_num_threads(n)
    sums = []
    counts.append(team_after(lambda: sums.append(xd.sum())))
    assert all(torch.equal(got.cpu(), x.sum()) for got in sums), n
print(*counts)
"""


@needs_threads
def test_the_worker_follows_torch_set_num_threads():
    result = run_python(_FOLLOWS_SET_NUM_THREADS)
    assert result.returncode == 0, result.stderr
    one, two = map(int, result.stdout.split())
    assert one == 1, f"the worker started {one - 1} OpenMP helpers under set_num_threads(1)"
    assert two == 2, f"{two} worker threads under set_num_threads(2)"


# A worker that has had no work for a few ms gives back the OpenMP team its
# kernels made (device/fake/idle_thread_teams.h): libgomp counts every
# team's threads, and with the host's and the worker's over the CPU count
# it makes all of them sleep between parallel regions, so an idle device
# would slow the host's own CPU ops. Twice: the next large kernel makes a
# team again and computes the CPU's bits on it.
_IDLE_WORKER_GIVES_TEAM_BACK = _WORKER_THREADS + r"""
import time, torch, torch_phantom
torch.set_num_threads(2)
x = torch.randn(4_000_000, generator=torch.Generator().manual_seed(0))
xd = x.to("phantom")
torch.phantom.synchronize()
results = []
for _ in range(2):
    sums = []
    busy = team_after(lambda: sums.append(xd.sum()))
    deadline = time.monotonic() + 10
    while worker_threads() > 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    idle = worker_threads()
    results += [busy, idle, all(torch.equal(got.cpu(), x.sum()) for got in sums)]
print(*results)
"""


@needs_threads
def test_an_idle_worker_gives_its_openmp_team_back():
    result = run_python(_IDLE_WORKER_GIVES_TEAM_BACK)
    assert result.returncode == 0, result.stderr
    busy1, idle1, same1, busy2, idle2, same2 = result.stdout.split()
    assert int(busy1) == 2 and int(busy2) == 2, "a large sum ran without a team"
    # Without the release the helper lives as long as the worker.
    assert int(idle1) == 1, f"{int(idle1) - 1} OpenMP helpers left on an idle worker"
    assert int(idle2) == 1, f"{int(idle2) - 1} OpenMP helpers left on an idle worker"
    assert same1 == same2 == "True", "a sum on the team differs from the CPU's"


# The host-side checks of a call (the generic path's trial run, a native
# kernel's admission probe) run the CPU kernel on the dispatching thread
# on one OpenMP thread: in backward that thread is autograd's device
# thread, and a parallel region there would give it an OpenMP team of its
# own, kept for the process's life, which keeps libgomp's teams asleep
# between regions (more pooled threads than CPUs). Three SGD steps of a
# small MLP run nll_loss_backward's trial and log_softmax backward's
# probe there; the parameters must still be the CPU's.
_AUTOGRAD_THREAD_WITHOUT_TEAM = r"""
import os, torch, torch_phantom
torch.set_num_threads(2)
def train(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 5)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 20, generator=g).to(device)
    y = torch.randint(0, 5, (32,), generator=g).to(device)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]
on_phantom = train("phantom")
names = [open(f"/proc/self/task/{t}/comm").read().strip()
         for t in os.listdir("/proc/self/task")]
autograd = [n for n in names if n.startswith("pt_autograd_")]
same = all(torch.equal(a, b) for a, b in zip(on_phantom, train("cpu")))
print(len(autograd), len(set(autograd)), same)
"""


@needs_threads
def test_autograd_device_threads_make_no_openmp_team():
    result = run_python(_AUTOGRAD_THREAD_WITHOUT_TEAM)
    assert result.returncode == 0, result.stderr
    threads, devices, same = result.stdout.split()
    # One thread per device: an OpenMP helper would carry its name too.
    assert int(devices) >= 1, "backward ran on no autograd device thread"
    assert int(threads) == int(devices), (
        f"{int(threads) - int(devices)} OpenMP helpers on autograd's device threads")
    assert same == "True", "the parameters differ from the CPU's"


_SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_equal(got, expected):
    """Bit for bit (so -0.0 differs from 0.0, and NaNs compare)."""
    width = _SAME_WIDTH_INT[expected.element_size()]
    return got.dtype == expected.dtype and torch.equal(got.cpu().view(width), expected.view(width))


@needs_threads
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 7, 16, 17, 33, 1000, 32767])
def test_log_sigmoid_on_one_thread_gives_the_cpus_bits(dtype, n):
    # Odd sizes put a chunk's end inside a vector on the CPU's two threads.
    x = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * 20).to(dtype)
    expected = F.logsigmoid(x)
    got = F.logsigmoid(x.to("phantom"))
    assert _bits_equal(got, expected)


@needs_threads
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("bags", [1, 3, 16, 255])
def test_embedding_bag_on_one_thread_gives_the_cpus_bits(mode, dtype, bags):
    g = torch.Generator().manual_seed(bags)
    weight = torch.randn(50, 8, generator=g).to(dtype)
    lengths = torch.randint(0, 9, (bags,), generator=g)  # empty bags too
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    indices = torch.randint(0, 50, (int(lengths.sum()),), generator=g)  # repeats
    psw = (torch.rand(indices.shape[0], generator=g).to(dtype) if mode == "sum" else None)
    expected = F.embedding_bag(indices, weight.requires_grad_(), offsets, mode=mode,
                               per_sample_weights=psw)
    got = F.embedding_bag(indices.to("phantom"), weight.detach().to("phantom").requires_grad_(),
                          offsets.to("phantom"), mode=mode,
                          per_sample_weights=None if psw is None else psw.to("phantom"))
    assert indices.numel() * 8 < 32768  # under the grain: the one-thread path
    assert _bits_equal(got, expected)
