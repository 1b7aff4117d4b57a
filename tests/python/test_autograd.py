"""Autograd and training on phantom give the CPU's numbers.

A user moving a model to the device expects the same gradients and the same
loss curve as on the CPU: forward and backward of a small MLP, a CNN
forward/backward, and five steps of SGD (and Adam) training, all compared
with the identical computation on the CPU.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import run_python

TIGHT = dict(rtol=1e-5, atol=1e-6)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 4))


def data(n=16, features=10, classes=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)


def test_tensor_backward_matches_cpu():
    a_cpu = torch.randn(5, 4, requires_grad=True)
    b_cpu = torch.randn(4, 3, requires_grad=True)
    a = a_cpu.detach().to("phantom").requires_grad_()
    b = b_cpu.detach().to("phantom").requires_grad_()
    (a_cpu @ b_cpu).sigmoid().pow(2).sum().backward()
    (a @ b).sigmoid().pow(2).sum().backward()
    assert a.grad is not None and a.grad.is_phantom and b.grad.is_phantom
    torch.testing.assert_close(a.grad.cpu(), a_cpu.grad, **TIGHT)
    torch.testing.assert_close(b.grad.cpu(), b_cpu.grad, **TIGHT)


def test_grad_through_copy_to_device():
    # Gradients flow back across .to("phantom") into a CPU leaf.
    w = torch.randn(6, requires_grad=True)
    (w.to("phantom") * 3).sum().backward()
    assert w.grad.device.type == "cpu"
    torch.testing.assert_close(w.grad, torch.full((6,), 3.0))


def test_mlp_forward_backward_matches_cpu():
    model_cpu = mlp()
    model = copy.deepcopy(model_cpu).to("phantom")
    x, y = data()
    loss_cpu = F.cross_entropy(model_cpu(x), y)
    loss = F.cross_entropy(model(x.to("phantom")), y.to("phantom"))
    assert loss.is_phantom
    torch.testing.assert_close(loss.cpu(), loss_cpu, **TIGHT)
    loss_cpu.backward()
    loss.backward()
    for (name, p_cpu), (_, p) in zip(model_cpu.named_parameters(), model.named_parameters()):
        assert p.grad is not None and p.grad.is_phantom, name
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, **TIGHT, msg=name)


def test_cnn_forward_backward_matches_cpu():
    torch.manual_seed(0)
    model_cpu = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 5),
    )
    model = copy.deepcopy(model_cpu).to("phantom")
    x = torch.randn(2, 3, 8, 8)
    y = torch.tensor([1, 4])
    loss_cpu = F.cross_entropy(model_cpu(x), y)
    loss = F.cross_entropy(model(x.to("phantom")), y.to("phantom"))
    torch.testing.assert_close(loss.cpu(), loss_cpu, **TIGHT)
    loss_cpu.backward()
    loss.backward()
    for (name, p_cpu), (_, p) in zip(model_cpu.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("optimizer", ["sgd", "sgd_momentum", "adam"])
def test_training_loop_losses_match_cpu(optimizer):
    def make_opt(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.1)
        if optimizer == "sgd_momentum":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
        return torch.optim.Adam(params, lr=0.01)

    model_cpu = mlp()
    model = copy.deepcopy(model_cpu).phantom()
    opt_cpu, opt = make_opt(model_cpu.parameters()), make_opt(model.parameters())
    x, y = data()
    xd, yd = x.to("phantom"), y.to("phantom")
    losses_cpu, losses = [], []
    for _ in range(5):
        for m, o, xx, yy, out in ((model_cpu, opt_cpu, x, y, losses_cpu), (model, opt, xd, yd, losses)):
            o.zero_grad()
            loss = F.cross_entropy(m(xx), yy)
            loss.backward()
            o.step()
            out.append(loss.item())
    assert losses_cpu[-1] < losses_cpu[0]  # the loop really trains
    torch.testing.assert_close(losses, losses_cpu, **TIGHT)
    for p_cpu, p in zip(model_cpu.parameters(), model.parameters()):
        assert p.is_phantom
        torch.testing.assert_close(p.detach().cpu(), p_cpu.detach(), **TIGHT)


def test_no_grad_and_detach():
    x = torch.randn(3, device="phantom", requires_grad=True)
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad
    z = (x * 2).detach()
    assert not z.requires_grad and z.is_phantom


def test_autograd_grad_functional():
    x_cpu = torch.randn(4, requires_grad=True)
    x = x_cpu.detach().to("phantom").requires_grad_()
    (g_cpu,) = torch.autograd.grad((x_cpu**3).sum(), x_cpu)
    (g,) = torch.autograd.grad((x**3).sum(), x)
    torch.testing.assert_close(g.cpu(), g_cpu, **TIGHT)


# A script that exits right after backward(), with autograd's device thread
# made unable to run until the main thread blocks: one CPU for the process,
# SCHED_IDLE for the device thread. A marker object lives only in the
# contextvars copy that torch's backward() stashes in its graph task, so it
# dies when the device thread releases that task. An atexit check that runs
# after torch_phantom's own hook (registered before torch, and atexit runs
# hooks last-in first-out) reports whether it is still alive. Without the
# hook the device thread would release it during finalization, which is
# the race that aborts the process (docs/reliability.md).
_EXIT_AFTER_BACKWARD = r"""
import atexit, contextvars, os, weakref
marker_ref = None
def check():
    os.write(1, b"marker alive\n" if marker_ref() is not None else b"marker released\n")
atexit.register(check)
import torch, torch_phantom
if MODE == "without-hook":
    atexit.unregister(torch_phantom._exit.release_autograd_graph_tasks)
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
x = torch.rand(8, device="phantom", requires_grad=True)
(x * 2).sum().backward()  # starts autograd's device threads
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        if f.read().startswith("pt_autograd"):
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
class Marker:
    pass
var = contextvars.ContextVar("v")
marker = Marker()
token = var.set(marker)
(x * 3).sum().backward()
var.reset(token)
marker_ref = weakref.ref(marker)
del marker
"""


def _exit_after_backward(mode):
    return run_python(f"MODE = {mode!r}\n" + _EXIT_AFTER_BACKWARD, timeout=120)


def test_exit_right_after_backward_releases_the_graph_task_first():
    # With the hook, the device thread has released the graph task before
    # the check runs, and the process exits cleanly (no "terminate called
    # without an active exception").
    for _ in range(3):
        run = _exit_after_backward("with-hook")
        assert "marker released" in run.stdout, (run.stdout, run.stderr)
        assert run.returncode == 0, run.stderr
        assert "terminate called" not in run.stderr
    # The control: the set-up holds the graph task on the device thread past
    # the script's end, so without the hook the marker is still alive when
    # atexit runs. That needs a scheduler that honours SCHED_IDLE for a
    # thread sharing one CPU with a runnable one; where it does not (some
    # sandboxes run the idle thread anyway), the device thread releases the
    # task on its own and this machine cannot show what the hook changes.
    controls = [_exit_after_backward("without-hook") for _ in range(3)]
    if not any("marker alive" in c.stdout for c in controls):
        pytest.skip("this machine's scheduler runs a SCHED_IDLE thread beside a runnable "
                    "one, so the race the hook closes cannot be made certain here "
                    f"(control runs: {[c.stdout.strip() for c in controls]})")
