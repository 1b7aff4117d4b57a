"""Scripted and traced functions run on phantom as they do in eager mode.

TorchScript's interpreter calls ops through the dispatcher with boxed
arguments, as the generic path receives them, but builds some of them its
own way: a `Tensor?[]` argument (the indices of `x[mask] = v`) arrives as a
list the generic path once took for a plain value, so the CPU kernel got
phantom tensors and ran `nonzero` on phantom from inside device work
("ph_run_host_func: called from work running on the same stream"). Each
test runs the same function in eager mode, scripted and traced, on phantom
and on the CPU, and compares."""
import pytest
import torch

import torch_phantom  # noqa: F401

# torch 2.13 deprecates TorchScript; this file tests that it still works.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.(script|trace)` is deprecated:DeprecationWarning")


def masked_assign(x):
    x[x < 50] = 1.0
    return x


def masked_assign_tensor(x, v):
    x[x > 10] = v
    return x


def index_with_list(x, i, j):
    return x[i, :, j].sum(0) + x[i][:, :, 0].sum(0)


def accumulate_put(x, i, v):
    return x.index_put_([i], v, accumulate=True)


def masked_read(x):
    return x[x > 0.5].sum() + x[x <= 0.5].float().mean()


def _inputs(name, device):
    g = torch.Generator().manual_seed(0)
    if name == "masked_assign":
        return (torch.arange(100.0).to(device),)
    if name == "masked_assign_tensor":
        return torch.arange(20.0).to(device), torch.tensor(-1.0).to(device)
    if name == "index_with_list":
        x = torch.randn(4, 5, 6, generator=g).to(device)
        return x, torch.tensor([0, 3, 1]).to(device), torch.tensor([5, 0, 2]).to(device)
    if name == "accumulate_put":
        return (torch.zeros(6).to(device), torch.tensor([1, 1, 4]).to(device),
                torch.tensor([1.0, 2.0, 3.0]).to(device))
    if name == "masked_read":
        return (torch.rand(7, 3, generator=g).to(device),)
    raise AssertionError(name)


FUNCTIONS = {
    "masked_assign": masked_assign,
    "masked_assign_tensor": masked_assign_tensor,
    "index_with_list": index_with_list,
    "accumulate_put": accumulate_put,
    "masked_read": masked_read,
}


def _compiled(mode, fn, example):
    if mode == "eager":
        return fn
    if mode == "script":
        return torch.jit.script(fn)
    # Traced on clones: the functions that write in place would change
    # the example the comparison runs on.
    return torch.jit.trace(fn, tuple(t.clone() for t in example), check_trace=False)


@pytest.mark.parametrize("mode", ["eager", "script", "trace"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_compiled_function_matches_the_cpu(name, mode):
    fn = FUNCTIONS[name]
    cpu_inputs = _inputs(name, "cpu")
    ph_inputs = _inputs(name, "phantom")
    expected = _compiled(mode, fn, cpu_inputs)(*cpu_inputs)
    got = _compiled(mode, fn, ph_inputs)(*ph_inputs)
    torch.phantom.synchronize()  # a failure queued on the stream would show here
    assert got.device.type == "phantom"
    torch.testing.assert_close(got.cpu(), expected)


def test_scripted_masked_assign_keeps_the_stream_usable():
    scripted = torch.jit.script(masked_assign)
    x = torch.arange(100.0, device="phantom")
    scripted(x)
    torch.phantom.synchronize()
    # The next, unrelated work runs: no sticky error was left behind.
    assert torch.ones(3, device="phantom").sum().item() == 3.0
    assert x.sum().item() == 50 + sum(range(50, 100))


def test_scripted_module_trains_like_eager():
    """A scripted module with masked and list indexing in its forward and
    backward: same loss and gradients as the CPU."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 6)

        def forward(self, x, keep: torch.Tensor):
            y = self.linear(x)
            y = y.clone()
            y[y < 0] = 0.0
            return y[keep].pow(2).sum()

    torch.manual_seed(0)
    cpu_net = Net()
    ph_net = Net()
    ph_net.load_state_dict(cpu_net.state_dict())
    ph_net = torch.jit.script(ph_net.to("phantom"))
    cpu_net = torch.jit.script(cpu_net)
    x = torch.randn(5, 6)
    keep = torch.tensor([0, 2, 4])
    cpu_loss = cpu_net(x, keep)
    cpu_loss.backward()
    ph_loss = ph_net(x.to("phantom"), keep.to("phantom"))
    ph_loss.backward()
    torch.testing.assert_close(ph_loss.cpu(), cpu_loss)
    torch.testing.assert_close(ph_net.linear.weight.grad.cpu(), cpu_net.linear.weight.grad)
