"""Every optimizer of PyTorch's ``optim_db`` run on phantom and compared
with the CPU (docs/conformance.md, "Optimizers").

Each test is ``test_<check>_<Optimizer>_phantom_<dtype>``; its samples are
the optimizer's configurations: every ``optim_inputs_func`` entry, each as
the for-loop, foreach and fused implementations the optimizer has
(``_get_optim_inputs_including_global_cliquey_kwargs``; fused wherever the
CPU has it, which ``torch_phantom.testing.declare_fused_optimizers()``
declares for phantom). Checks:

* ``steps``       3 steps from the same parameters and gradients: the
                  parameters after each step and the optimizer's state
* ``state_dict``  2 steps, the state dict loaded into a new optimizer (on
                  phantom, and the CPU's into a phantom one), 2 more steps
* ``scheduler``   3 steps under each of the optimizer's LR schedulers:
                  parameters and learning rates

Both sides compute the same loss from identical parameters, so the
gradients are the CPU's (sparse COO ones for an optimizer that takes only
those, SparseAdam); a configuration the CPU refuses must be refused
on phantom with the same exception type.
"""

import copy

import torch
import torch_phantom.testing

torch_phantom.testing.enable_device_type_tests()
FUSED = torch_phantom.testing.declare_fused_optimizers()

from torch.testing._internal.common_device_type import instantiate_device_type_tests  # noqa: E402
from torch.testing._internal.common_optimizers import (  # noqa: E402
    _get_optim_inputs_including_global_cliquey_kwargs,
    optim_db,
    optims,
)
from torch.testing._internal.common_utils import TestCase, run_tests  # noqa: E402

from _conformance import compare, conform, dtype_str, sample_limit  # noqa: E402

DEVICE_TYPE = torch_phantom.testing.DEVICE_TYPE
DTYPES = (torch.float32, torch.float64)
CHECKS = ("steps", "state_dict", "scheduler")
LIMITS = {
    "steps": sample_limit("steps", 0),  # every configuration: they are cheap
    "state_dict": sample_limit("state_dict", 6),
    "scheduler": sample_limit("scheduler", 3),
}
STEPS = 3


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _params(device, dtype):
    g = torch.Generator().manual_seed(7)
    return [
        torch.nn.Parameter(torch.randn(4, 3, generator=g, dtype=dtype).to(device)),
        torch.nn.Parameter(torch.randn(4, generator=g, dtype=dtype).to(device)),
    ]


def _loss(params):
    """A fixed, non-quadratic objective: the gradients differ per element
    and per step."""
    weight, bias = params
    x = torch.linspace(-1.0, 1.0, 3, dtype=weight.dtype, device=weight.device)
    return (torch.tanh(weight @ x + bias) ** 2).sum() + 0.1 * (weight ** 4).sum()


class _Run:
    """One optimizer on one device: params, optimizer, and its steps."""

    def __init__(self, optim_info, kwargs, device, dtype, params=None):
        self.params = params if params is not None else _params(device, dtype)
        self.optim_info = optim_info
        self.optimizer = optim_info.optim_cls(self.params, **kwargs)

    def closure(self):
        self.optimizer.zero_grad()
        loss = _loss(self.params)
        loss.backward()
        if self.optim_info.only_supports_sparse_grads:
            # SparseAdam takes sparse COO gradients only, as torch's own
            # optimizer tests give it.
            for param in self.params:
                param.grad = param.grad.to_sparse()
        return loss

    def step(self):
        if self.optim_info.step_requires_closure:
            return self.optimizer.step(self.closure)
        loss = self.closure()
        self.optimizer.step()
        return loss


def _configs(optim_info, dtype):
    return _get_optim_inputs_including_global_cliquey_kwargs(
        DEVICE_TYPE, dtype, optim_info, skip=("differentiable",))


def _both(optim_info, config, dtype):
    """(phantom run, CPU run), or raises AssertionError unless both refuse
    the configuration with the same exception type (then returns None)."""
    runs, errors = [], []
    for device, kwargs in ((DEVICE_TYPE, config.kwargs), ("cpu", _to(config.kwargs, "cpu"))):
        try:
            runs.append(_Run(optim_info, copy.copy(kwargs), device, dtype))
            errors.append(None)
        except Exception as error:  # noqa: BLE001 - compared below
            runs.append(None)
            errors.append(error)
    if errors[1] is not None:
        if errors[0] is None or type(errors[0]) is not type(errors[1]):
            raise AssertionError(f"the CPU refused the configuration ({errors[1]!r}), "
                                 f"phantom {'accepted it' if errors[0] is None else repr(errors[0])}")
        return None
    if errors[0] is not None:
        raise errors[0]
    return runs


def _state(optimizer):
    return optimizer.state_dict()


def _compare_runs(ph, cpu, what):
    compare([p.detach() for p in ph.params], [p.detach() for p in cpu.params],
            DEVICE_TYPE, f"{what}: parameters")
    compare(_state(ph.optimizer), _state(cpu.optimizer), DEVICE_TYPE,
            f"{what}: optimizer state", strict_device=False)


def _configurations(optim_info, dtype, limit):
    configs = _configs(optim_info, dtype)
    return configs[:limit] if limit else configs


def _label(index, config):
    return f"config {index} [{config.desc}: {config.kwargs}]"[:300]


class TestPhantomOptimizers(TestCase):
    def _check_steps(self, optim_info, dtype, stats):
        for index, config in enumerate(_configurations(optim_info, dtype, LIMITS["steps"])):
            def body(config=config):
                runs = _both(optim_info, config, dtype)
                if runs is None:
                    return None
                ph, cpu = runs
                for step in range(STEPS):
                    torch.manual_seed(step)
                    ph.step()
                    torch.manual_seed(step)
                    cpu.step()
                    _compare_runs(ph, cpu, f"step {step + 1}")
                return None

            stats.run(_label(index, config), body)

    def _check_state_dict(self, optim_info, dtype, stats):
        for index, config in enumerate(_configurations(optim_info, dtype, LIMITS["state_dict"])):
            def body(config=config):
                runs = _both(optim_info, config, dtype)
                if runs is None:
                    return None
                ph, cpu = runs
                for _ in range(2):
                    ph.step()
                    cpu.step()
                # Each side reloads its own state into a new optimizer, and
                # phantom also reloads the CPU's (load_state_dict moves it).
                def reload(source, device):
                    params = [torch.nn.Parameter(p.detach().to(device).clone()) for p in source.params]
                    kwargs = config.kwargs if device == DEVICE_TYPE else _to(config.kwargs, "cpu")
                    run = _Run(optim_info, copy.copy(kwargs), device, dtype, params)
                    run.optimizer.load_state_dict(copy.deepcopy(source.optimizer.state_dict()))
                    return run

                ph_own, cpu_own, ph_from_cpu = reload(ph, DEVICE_TYPE), reload(cpu, "cpu"), \
                    reload(cpu, DEVICE_TYPE)
                compare(_state(ph_own.optimizer), _state(cpu_own.optimizer), DEVICE_TYPE,
                        "state dict after load_state_dict", strict_device=False)
                for _ in range(2):
                    for run in (ph, cpu, ph_own, cpu_own, ph_from_cpu):
                        run.step()
                _compare_runs(ph, cpu, "after 4 steps")
                _compare_runs(ph_own, cpu_own, "reloaded from its own state dict")
                _compare_runs(ph_from_cpu, cpu_own, "phantom reloaded from the CPU's state dict")
                return None

            stats.run(_label(index, config), body)

    def _check_scheduler(self, optim_info, dtype, stats):
        configs = _configurations(optim_info, dtype, LIMITS["scheduler"])
        for index, config in enumerate(configs):
            for s_index, schedulers in enumerate(optim_info.scheduler_inputs):
                def body(config=config, schedulers=schedulers):
                    runs = _both(optim_info, config, dtype)
                    if runs is None:
                        return None
                    ph, cpu = runs
                    ph_s = [make(ph.optimizer) for make in schedulers]
                    cpu_s = [make(cpu.optimizer) for make in schedulers]
                    for step in range(STEPS):
                        for run, scheds in ((ph, ph_s), (cpu, cpu_s)):
                            loss = run.step()
                            for s in scheds:
                                if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):
                                    s.step(float(loss))
                                else:
                                    s.step()
                        _compare_runs(ph, cpu, f"step {step + 1}")
                        compare([g["lr"] for g in ph.optimizer.param_groups],
                                [g["lr"] for g in cpu.optimizer.param_groups],
                                DEVICE_TYPE, "learning rates", strict_device=False)
                    return None

                stats.run(f"{_label(index, config)} schedulers {s_index}", body)

    def _conform(self, check, optim_info, dtype):
        key = (check, optim_info.name, dtype_str(dtype))
        conform(self, key, lambda stats: getattr(self, f"_check_{check}")(optim_info, dtype, stats))

    @optims(optim_db, dtypes=DTYPES)
    def test_steps(self, device, dtype, optim_info):
        self._conform("steps", optim_info, dtype)

    @optims(optim_db, dtypes=DTYPES)
    def test_state_dict(self, device, dtype, optim_info):
        self._conform("state_dict", optim_info, dtype)

    @optims(optim_db, dtypes=DTYPES)
    def test_scheduler(self, device, dtype, optim_info):
        self._conform("scheduler", optim_info, dtype)


instantiate_device_type_tests(TestPhantomOptimizers, globals(), only_for=(DEVICE_TYPE,))

TEST_KEYS = {
    f"test_{check}_{info.name}_{DEVICE_TYPE}_{dtype_str(dtype)}": (check, info.name, dtype_str(dtype))
    for check in CHECKS for info in optim_db for dtype in DTYPES
}


if __name__ == "__main__":
    run_tests()
