"""Fused optimizers (`fused=True`) on phantom.

torch.optim accepts `fused=True` for a device type listed by
`torch.utils._foreach_utils._get_fused_kernels_supported_devices()`, which
in torch 2.13 names the PrivateUse1 backend; the fused kernels
(`_fused_adam_`, ...) take the generic path and run the CPU's. PyTorch's
test metadata (`OptimizerInfo.supports_fused_on`) has no hook for a
backend, so `torch_phantom.testing.declare_fused_optimizers()` declares
phantom wherever the CPU is listed, and the optimizer conformance suite
then runs every fused configuration (tests/conformance/test_optimizers.py)."""
import pytest
import torch

import torch_phantom
from conftest import run_python

FUSED = [
    (torch.optim.Adam, {"lr": 0.05}, "aten::_fused_adam_"),
    (torch.optim.Adam, {"lr": 0.05, "amsgrad": True, "weight_decay": 0.1}, "aten::_fused_adam_"),
    (torch.optim.AdamW, {"lr": 0.05}, "aten::_fused_adamw_"),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, "aten::_fused_sgd_"),
    (torch.optim.Adagrad, {"lr": 0.1}, "aten::_fused_adagrad_"),
]


def _train(optimizer_cls, kwargs, device):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3).to(device)),
              torch.nn.Parameter(torch.randn(3).to(device))]
    optimizer = optimizer_cls(params, fused=True, **kwargs)
    for step in range(3):
        optimizer.zero_grad()
        loss = (torch.tanh(params[0] @ params[1]) ** 2).sum() + (params[1] ** 4).sum()
        loss.backward()
        optimizer.step()
    return [p.detach().cpu() for p in params]


@pytest.mark.requires_kernel_view("checks that the fused kernel is queued on the native path")
@pytest.mark.parametrize("optimizer_cls,kwargs,kernel", FUSED,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(FUSED)])
def test_fused_step_matches_the_cpus_fused_step(optimizer_cls, kwargs, kernel):
    expected = _train(optimizer_cls, kwargs, "cpu")
    torch_phantom.reset_ops_report()
    got = _train(optimizer_cls, kwargs, "phantom")
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    calls = {r["op"]: r for r in torch_phantom.ops_report()}
    assert calls[kernel]["async"] + calls[kernel]["sync"] == 3  # one fused kernel per step


def test_declaration_adds_phantom_where_the_cpu_has_fused_kernels():
    code = """
import torch, torch_phantom.testing
from torch.testing._internal.common_optimizers import (
    optim_db, _get_optim_inputs_including_global_cliquey_kwargs)
def fused_configs():
    return sum(1 for info in optim_db
               for c in _get_optim_inputs_including_global_cliquey_kwargs(
                   "phantom", torch.float32, info, skip=("differentiable",))
               if c.kwargs.get("fused"))
before = fused_configs()
declared = torch_phantom.testing.declare_fused_optimizers()
cpu_fused = sorted(i.name for i in optim_db if "cpu" in i.supports_fused_on)
print(before, fused_configs() > 0, sorted(declared) == cpu_fused, declared)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    before, some_after, same_as_cpu, declared = result.stdout.split(" ", 3)
    assert before == "0"  # PyTorch's metadata alone tests no fused config on phantom
    assert some_after == "True" and same_as_cpu == "True"
    assert "Adam" in declared and "SGD" in declared
