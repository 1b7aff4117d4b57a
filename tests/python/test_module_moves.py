"""Moving a module to or from phantom keeps its Parameter objects, as a
move to CUDA does (ops/ShallowCopyType.cpp).

nn.Module._apply swaps a moved tensor into the existing Parameter when
aten::_has_compatible_shallow_copy_type says the two are compatible, and
builds a new Parameter otherwise. What users rely on: weights tied by
identity stay tied, an optimizer built before the move trains the moved
model, lazy modules moved before their first forward initialise on the
device. Buffers are reassigned by _apply on every device (stock torch does
`self._buffers[key] = fn(buf)`), so only their place and values are
checked. Modules that never touch phantom keep torch's own answers.
"""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn


def _identities(module):
    return {name: id(p) for name, p in module.named_parameters(remove_duplicate=False)}


def _small_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model(torch.randn(5, 4)).sum().backward()  # every parameter has a .grad
    return model


@pytest.mark.parametrize(
    "move",
    [
        pytest.param(lambda m: m.to("phantom"), id="to-phantom"),
        pytest.param(lambda m: m.phantom(), id="phantom-method"),
        pytest.param(lambda m: m.to(torch.device("phantom", 0)), id="to-device-object"),
    ],
)
def test_parameters_and_their_grads_keep_identity_to_phantom_and_back(move):
    model = _small_model()
    params = _identities(model)
    grads = {name: id(p.grad) for name, p in model.named_parameters()}
    expected = copy.deepcopy(model.state_dict())

    assert move(model) is model
    assert _identities(model) == params
    assert {name: id(p.grad) for name, p in model.named_parameters()} == grads
    for name, p in model.named_parameters():
        assert type(p) is nn.Parameter and p.requires_grad and p.is_leaf, name
        assert p.device.type == "phantom" and p.grad.device == p.device, name
    for name, tensor in model.state_dict().items():  # buffers included
        assert tensor.device.type == "phantom", name
        assert torch.equal(tensor.cpu(), expected[name]), name

    model.cpu()
    assert _identities(model) == params
    assert {name: id(p.grad) for name, p in model.named_parameters()} == grads
    for name, tensor in model.state_dict().items():
        assert tensor.device.type == "cpu", name
        assert torch.equal(tensor, expected[name]), name


def test_parameters_keep_identity_between_devices(two_devices):
    model = _small_model()
    params = _identities(model)
    model.to("phantom")
    model.to("phantom:1")
    assert _identities(model) == params
    assert all(p.device == torch.device("phantom", 1) for p in model.parameters())
    assert all(b.device == torch.device("phantom", 1) for b in model.buffers())
    model.to("phantom:0").half().cpu().float()
    assert _identities(model) == params


def test_assigning_data_across_devices_keeps_the_parameter():
    # Variable::set_data, behind `param.data = x` here and behind LibTorch's
    # torch::nn::Module::to, refuses tensors it deems incompatible.
    param = nn.Parameter(torch.arange(4.0))
    param.data = param.data.to("phantom")
    assert param.device.type == "phantom" and param.requires_grad
    param.data = param.data.cpu()
    assert torch.equal(param.detach(), torch.arange(4.0))


class TinyGPT(nn.Module):
    """A GPT-2 shaped decoder block whose output projection shares the token
    embedding's weight, as GPT-2's lm_head does (tied by identity). The
    attention has no input bias: the key bias's true gradient is zero, and
    AdamW would turn its rounding noise into full-size steps."""

    def __init__(self, vocab=32, dim=16, context=8, heads=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, bias=False, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        mask = torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask)

    def forward(self, ids):
        length = ids.shape[1]
        h = self.wte(ids) + self.wpe(torch.arange(length, device=ids.device))
        x = self.ln_1(h)
        mask = self.causal_mask[:length, :length]
        h = h + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        h = h + self.mlp(self.ln_2(h))
        return self.lm_head(self.ln_f(h))


def _adamw_steps(model, ids, targets, steps=2):
    device = next(model.parameters()).device
    ids, targets = ids.to(device), targets.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    grads = []
    for _ in range(steps):
        optimizer.zero_grad()
        logits = model(ids)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        grads.append({n: p.grad.cpu() for n, p in model.named_parameters()})
        optimizer.step()
    return grads


def test_tied_weights_stay_tied_and_train_like_the_cpu():
    torch.manual_seed(0)
    cpu_model = TinyGPT()
    phantom_model = copy.deepcopy(cpu_model).to("phantom")
    tied = phantom_model.lm_head.weight is phantom_model.wte.weight
    assert tied, "the move untied lm_head.weight from wte.weight"
    assert len(list(phantom_model.parameters())) == len(list(cpu_model.parameters()))

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 32, (3, 8), generator=gen)
    targets = torch.randint(0, 32, (3, 8), generator=gen)
    cpu_grads = _adamw_steps(cpu_model, ids, targets)
    phantom_grads = _adamw_steps(phantom_model, ids, targets)
    for step, (actual, expected) in enumerate(zip(phantom_grads, cpu_grads)):
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], msg=f"step {step}: {name}")
    for name, p in cpu_model.named_parameters():
        torch.testing.assert_close(
            phantom_model.get_parameter(name).cpu(), p.detach(), msg=name
        )


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _train(model, optimizer, steps=3, scaler=None):
    gen = torch.Generator().manual_seed(2)
    device = next(model.parameters()).device
    for _ in range(steps):
        x = torch.randn(8, 6, generator=gen).to(device)
        y = torch.randn(8, 3, generator=gen).to(device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16, enabled=scaler is not None):
            loss = F.mse_loss(model(x).float(), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    return [p.detach().cpu() for p in model.parameters()]


def test_an_optimizer_built_before_the_move_trains_the_moved_model():
    model = _mlp()
    initial = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.to("phantom")
    trained = _train(model, optimizer)

    reference = _mlp()
    expected = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9))
    for actual, wanted, before in zip(trained, expected, initial):
        assert not torch.equal(actual, before)
        torch.testing.assert_close(actual, wanted)


def test_grad_scaler_steps_an_optimizer_built_before_the_move():
    model = _mlp()
    initial = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.to("phantom")
    trained = _train(model, optimizer, scaler=torch.amp.GradScaler("phantom"))

    reference = _mlp().to("phantom")  # optimizer built after the move
    expected = _train(
        reference,
        torch.optim.Adam(reference.parameters(), lr=1e-2),
        scaler=torch.amp.GradScaler("phantom"),
    )
    for actual, wanted, before in zip(trained, expected, initial):
        assert not torch.equal(actual, before)
        assert torch.equal(actual, wanted)


def test_lazy_linear_moved_before_its_first_forward_initialises_on_phantom():
    x = torch.randn(5, 3)
    torch.manual_seed(0)
    cpu_lazy = nn.LazyLinear(4)
    expected = cpu_lazy(x)

    torch.manual_seed(0)
    lazy = nn.LazyLinear(4).to("phantom")
    actual = lazy(x.to("phantom"))
    assert lazy.in_features == 3
    assert type(lazy.weight) is nn.Parameter and type(lazy.bias) is nn.Parameter
    assert lazy.weight.device.type == "phantom" and lazy.weight.shape == (4, 3)
    # Initialised from the device's generator, which draws the CPU's numbers.
    assert torch.equal(lazy.weight.cpu(), cpu_lazy.weight.detach())
    assert torch.equal(actual.cpu(), expected.detach())


LAZY_CONVOLUTIONS = [
    (nn.LazyConv1d, nn.Conv1d, 1),
    (nn.LazyConv2d, nn.Conv2d, 2),
    (nn.LazyConv3d, nn.Conv3d, 3),
    (nn.LazyConvTranspose1d, nn.ConvTranspose1d, 1),
    (nn.LazyConvTranspose2d, nn.ConvTranspose2d, 2),
    (nn.LazyConvTranspose3d, nn.ConvTranspose3d, 3),
]


@pytest.mark.parametrize(
    "lazy_class,eager_class,dims", LAZY_CONVOLUTIONS, ids=[c[0].__name__ for c in LAZY_CONVOLUTIONS]
)
def test_lazy_convolution_moved_to_phantom_loads_a_state_dict(lazy_class, eager_class, dims):
    torch.manual_seed(0)
    eager = eager_class(3, 4, kernel_size=3)
    lazy = lazy_class(4, kernel_size=3).to("phantom")
    lazy.load_state_dict(eager.state_dict())
    for name, expected in eager.state_dict().items():
        actual = lazy.get_parameter(name)
        assert type(actual) is nn.Parameter and actual.device.type == "phantom", name
        assert torch.equal(actual.cpu(), expected), name
    x = torch.randn(2, 3, *([6] * dims))
    torch.testing.assert_close(lazy(x.to("phantom")).cpu(), eager(x), rtol=0, atol=0)


# The same probe runs here (phantom loaded) and in an interpreter where
# phantom is not loaded: for modules that stay off phantom, whether each move
# keeps the Parameter (and its grad) and what torch._has_compatible_shallow_
# copy_type answers must not depend on phantom being there.
_CPU_ONLY_PROBE = r"""
import warnings
import torch
from torch import nn

def identity_after(move):
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    model(torch.randn(4, 3)).sum().backward()
    params = [(p, p.grad) for p in model.parameters()]
    buffers = list(model.buffers())
    move(model)
    return {
        "params": [a is b for (a, _), b in zip(params, model.parameters())],
        "grads": [g is p.grad for (_, g), p in zip(params, model.parameters())],
        "buffers": [a is b for a, b in zip(buffers, model.buffers())],
    }

moves = {
    "to-cpu": lambda m: m.to("cpu"),
    "double": lambda m: m.double(),
    "half-then-float": lambda m: m.half().float(),
    "to-meta": lambda m: m.to("meta"),
    "to-empty-meta": lambda m: m.to_empty(device="meta"),
}
dense = torch.zeros(2)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "nested tensors are a prototype"
    nested = torch.nested.nested_tensor([dense])
pairs = {
    "cpu-float/cpu-double": (dense, dense.double()),
    "cpu/meta": (dense, dense.to("meta")),
    "meta/cpu": (dense.to("meta"), dense),
    "cpu/sparse": (dense, dense.to_sparse()),
    "sparse/sparse-double": (dense.to_sparse(), dense.double().to_sparse()),
    "cpu/nested": (dense, nested),
    "parameter/tensor": (nn.Parameter(dense), dense),
}
result = {
    "moves": {name: identity_after(move) for name, move in moves.items()},
    "compatible": {
        name: torch._has_compatible_shallow_copy_type(a, b) for name, (a, b) in pairs.items()
    },
}
"""


def _probe_without_phantom():
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    code = _CPU_ONLY_PROBE + (
        "import sys, json\n"
        "assert 'torch_phantom' not in sys.modules\n"
        "print(json.dumps(result))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_modules_that_never_touch_phantom_move_as_in_stock_torch():
    namespace = {}
    exec(_CPU_ONLY_PROBE, namespace)
    with_phantom = json.loads(json.dumps(namespace["result"]))
    assert with_phantom == _probe_without_phantom()
    # The probe covers both answers: some moves keep Parameters, some do not.
    kept = [all(r["params"]) for r in with_phantom["moves"].values()]
    assert True in kept and False in kept
