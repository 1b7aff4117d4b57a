"""Every module of PyTorch's ``module_db`` run on phantom and compared with
the CPU (docs/conformance.md, "Modules").

Each test is ``test_<check>_<module>[_train_mode|_eval_mode]_phantom_<dtype>``
(a mode suffix for modules whose train and eval modes differ); its samples
are the module's ``module_inputs_func`` entries. Each sample builds the
module twice on the CPU from the same seed and moves one copy to phantom
(lazy modules before their first forward), so both start from the same
parameters, generates its inputs on phantom and copies them to the CPU.
Checks:

* ``forward``     the state dict after the move, and the outputs
* ``backward``    gradients of the inputs and of every parameter
* ``state_dict``  the CPU module's state dict loaded into a phantom module
                  built from another seed (and phantom's into a CPU one):
                  state dicts and outputs
* ``train_eval``  train, eval, train again on one module (modules whose
                  modes differ): outputs and buffers at each switch
* ``bfloat16``, ``float16``  forward in reduced precision where the CPU
                  runs it (else phantom must raise the CPU's exception)

Both sides are seeded identically before every call (dropout draws the
same numbers: phantom's generator wraps the CPU's).
"""

import torch
import torch_phantom.testing

torch_phantom.testing.enable_device_type_tests()

from torch.testing._internal.common_device_type import instantiate_device_type_tests  # noqa: E402
from torch.testing._internal.common_modules import (  # noqa: E402
    TrainEvalMode,
    module_db,
    modules,
)
from torch.testing._internal.common_utils import TestCase, run_tests  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

from _conformance import compare, conform, dtype_str, sample_limit  # noqa: E402

DEVICE_TYPE = torch_phantom.testing.DEVICE_TYPE
DTYPES = (torch.float32, torch.float64)
LOW_PRECISION = (torch.bfloat16, torch.float16)
LIMITS = {
    "forward": sample_limit("forward", 4),
    "backward": sample_limit("backward", 2),
    "state_dict": sample_limit("state_dict", 2),
    "train_eval": sample_limit("train_eval", 2),
    "bfloat16": sample_limit("bfloat16", 2),
    "float16": sample_limit("float16", 2),
}
SEED = 1234
MODES_DIFFER = [m for m in module_db if m.train_and_eval_differ]


def _cpu(value):
    """CPU copies of the tensors in ``value``; a tensor passed twice (a
    sample may give the same tensor as input and target) is one copy, so
    gradients accumulate into it as they do on phantom."""
    copies = {}

    def one(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in copies:
            c = t.detach().cpu()
            copies[id(t)] = c.requires_grad_(True) if t.requires_grad else c
        return copies[id(t)]

    return tree_map(one, value)


def _build(module_info, module_input, seed, dtype, device):
    args, kwargs = _cpu((module_input.constructor_input.args, module_input.constructor_input.kwargs))
    torch.manual_seed(seed)
    module = module_info.module_cls(*args, **kwargs)
    return module.to(dtype).to(device)


def _forward(module, inputs):
    args, kwargs = inputs
    torch.manual_seed(SEED)
    return module(*args, **kwargs)


def _differentiable(tensors):
    return [t for t in tree_flatten(tensors)[0]
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


class _Pair:
    """A module and its inputs on phantom and on the CPU."""

    def __init__(self, module_info, module_input, dtype, training):
        self.ph = _build(module_info, module_input, SEED, dtype, DEVICE_TYPE)
        self.cpu = _build(module_info, module_input, SEED, dtype, "cpu")
        self.ph.train(training)
        self.cpu.train(training)
        fi = module_input.forward_input
        self.ph_inputs = (fi.args, fi.kwargs)
        self.cpu_inputs = _cpu((fi.args, fi.kwargs))

    def forward(self):
        """(phantom output, CPU output); a CPU error must be phantom's too
        (then both are None)."""
        ph_error = cpu_error = None
        try:
            ph = _forward(self.ph, self.ph_inputs)
        except Exception as error:  # noqa: BLE001 - compared below
            ph, ph_error = None, error
        try:
            cpu = _forward(self.cpu, self.cpu_inputs)
        except Exception as error:  # noqa: BLE001
            cpu, cpu_error = None, error
        if cpu_error is not None:
            if ph_error is None or type(ph_error) is not type(cpu_error):
                raise AssertionError(f"the CPU raised {cpu_error!r}, phantom "
                                     f"{'returned a result' if ph_error is None else repr(ph_error)}")
            return None, None
        if ph_error is not None:
            raise ph_error
        return ph, cpu


def _samples(module_info, dtype, training, limit, requires_grad=False):
    torch.manual_seed(0)
    inputs = module_info.module_inputs_func(
        module_info, device=DEVICE_TYPE, dtype=dtype, requires_grad=requires_grad,
        training=training)
    return inputs[:limit] if limit else inputs


def _label(index, module_input):
    return f"sample {index} [{module_input.desc or 'default'}]"


class TestPhantomModules(TestCase):
    def _each(self, check, module_info, dtype, training, stats, body, requires_grad=False):
        try:
            samples = _samples(module_info, dtype, training, LIMITS[check], requires_grad)
        except Exception as error:  # noqa: BLE001 - a failed sample
            def fail():
                raise error

            stats.run("sample generation on phantom", fail)
            return
        for index, module_input in enumerate(samples):
            if module_input.forward_input is None:
                continue
            stats.run(_label(index, module_input), lambda mi=module_input: body(mi))

    def _check_forward(self, module_info, dtype, training, stats):
        def body(module_input):
            pair = _Pair(module_info, module_input, dtype, training)
            if not module_info.is_lazy:  # a lazy module has no values before its forward
                compare(pair.ph.state_dict(), pair.cpu.state_dict(), DEVICE_TYPE, "state dict")
            ph, cpu = pair.forward()
            compare(ph, cpu, DEVICE_TYPE, "output")
            # After the forward too: lazy modules materialise their
            # parameters, batch norm updates its running statistics.
            compare(pair.ph.state_dict(), pair.cpu.state_dict(), DEVICE_TYPE,
                    "state dict after forward")

        self._each("forward", module_info, dtype, training, stats, body)

    def _check_backward(self, module_info, dtype, training, stats):
        def body(module_input):
            pair = _Pair(module_info, module_input, dtype, training)
            ph, cpu = pair.forward()
            if cpu is None:
                return None
            cpu_outs, ph_outs = _differentiable(cpu), _differentiable(ph)
            if not cpu_outs:
                return False  # nothing differentiable
            cpu_wrt = _differentiable(pair.cpu_inputs) + list(pair.cpu.parameters())
            ph_wrt = _differentiable(pair.ph_inputs) + list(pair.ph.parameters())
            torch.manual_seed(SEED + 1)
            grads = [torch.randn_like(t) for t in cpu_outs]
            cpu_grads = torch.autograd.grad(cpu_outs, cpu_wrt, grads, allow_unused=True)
            ph_grads = torch.autograd.grad(ph_outs, ph_wrt, [g.to(DEVICE_TYPE) for g in grads],
                                           allow_unused=True)
            compare(list(ph_grads), list(cpu_grads), DEVICE_TYPE, "gradients")
            return None

        self._each("backward", module_info, dtype, training, stats, body, requires_grad=True)

    def _check_state_dict(self, module_info, dtype, training, stats):
        def body(module_input):
            pair = _Pair(module_info, module_input, dtype, training)
            ph, cpu = pair.forward()  # materialises lazy modules on both
            other = _build(module_info, module_input, SEED + 7, dtype, DEVICE_TYPE)
            other.train(training)
            _forward(other, pair.ph_inputs) if cpu is not None else None
            other.load_state_dict(pair.cpu.state_dict())
            compare(other.state_dict(), pair.cpu.state_dict(), DEVICE_TYPE,
                    "the CPU's state dict loaded on phantom")
            back = _build(module_info, module_input, SEED + 7, dtype, "cpu")
            back.train(training)
            _forward(back, pair.cpu_inputs) if cpu is not None else None
            back.load_state_dict(pair.ph.state_dict())
            compare(back.state_dict(), pair.cpu.state_dict(), "cpu",
                    "phantom's state dict loaded on the CPU", strict_device=False)
            if cpu is not None:
                compare(_forward(other, pair.ph_inputs), _forward(pair.cpu, pair.cpu_inputs),
                        DEVICE_TYPE, "output after load_state_dict")
            return None

        self._each("state_dict", module_info, dtype, training, stats, body)

    def _check_train_eval(self, module_info, dtype, training, stats):
        def body(module_input):
            pair = _Pair(module_info, module_input, dtype, True)
            for mode in (True, False, True):
                pair.ph.train(mode)
                pair.cpu.train(mode)
                ph, cpu = pair.forward()
                compare(ph, cpu, DEVICE_TYPE, f"output in {'train' if mode else 'eval'} mode")
                compare(pair.ph.state_dict(), pair.cpu.state_dict(), DEVICE_TYPE,
                        f"state after {'train' if mode else 'eval'} mode")
            return None

        self._each("train_eval", module_info, dtype, training, stats, body)

    def _check_low_precision(self, check, module_info, training, stats):
        dtype = getattr(torch, check)

        def body(module_input):
            pair = _Pair(module_info, module_input, dtype, training)
            ph, cpu = pair.forward()
            compare(ph, cpu, DEVICE_TYPE, "output")
            return None

        self._each(check, module_info, dtype, training, stats, body)

    # -- the tests ---------------------------------------------------------

    def _conform(self, check, module_info, dtype, training, key_dtype=None):
        key = (check, _name(module_info, training), dtype_str(key_dtype or dtype))
        if check in LOW_PRECISION_CHECKS:
            run = lambda stats: self._check_low_precision(check, module_info, training, stats)  # noqa: E731
        else:
            run = lambda stats: getattr(self, f"_check_{check}")(  # noqa: E731
                module_info, dtype, training, stats)
        conform(self, key, run)

    @modules(module_db, allowed_dtypes=DTYPES)
    def test_forward(self, device, dtype, module_info, training):
        self._conform("forward", module_info, dtype, training)

    @modules(module_db, allowed_dtypes=DTYPES)
    def test_backward(self, device, dtype, module_info, training):
        self._conform("backward", module_info, dtype, training)

    @modules(module_db, allowed_dtypes=(torch.float32,))
    def test_state_dict(self, device, dtype, module_info, training):
        self._conform("state_dict", module_info, dtype, training)

    @modules(MODES_DIFFER, allowed_dtypes=(torch.float32,), train_eval_mode=TrainEvalMode.train_only)
    def test_train_eval(self, device, dtype, module_info, training):
        self._conform("train_eval", module_info, dtype, training)

    @modules(module_db, allowed_dtypes=(torch.float32,), train_eval_mode=TrainEvalMode.train_only)
    def test_bfloat16(self, device, dtype, module_info, training):
        self._conform("bfloat16", module_info, dtype, training, torch.bfloat16)

    @modules(module_db, allowed_dtypes=(torch.float32,), train_eval_mode=TrainEvalMode.train_only)
    def test_float16(self, device, dtype, module_info, training):
        self._conform("float16", module_info, dtype, training, torch.float16)


LOW_PRECISION_CHECKS = ("bfloat16", "float16")


def _modes(module_info, train_eval_mode):
    if train_eval_mode is TrainEvalMode.train_only or not module_info.train_and_eval_differ:
        return [True]
    return [True, False]


def _name(module_info, training):
    if not module_info.train_and_eval_differ:
        return module_info.name
    return f"{module_info.name} ({'train' if training else 'eval'})"


instantiate_device_type_tests(TestPhantomModules, globals(), only_for=(DEVICE_TYPE,))


def _test_keys():
    keys = {}
    plans = (
        ("forward", module_db, DTYPES, TrainEvalMode.train_and_eval, None),
        ("backward", module_db, DTYPES, TrainEvalMode.train_and_eval, None),
        ("state_dict", module_db, (torch.float32,), TrainEvalMode.train_and_eval, None),
        ("train_eval", MODES_DIFFER, (torch.float32,), TrainEvalMode.train_only, None),
        ("bfloat16", module_db, (torch.float32,), TrainEvalMode.train_only, torch.bfloat16),
        ("float16", module_db, (torch.float32,), TrainEvalMode.train_only, torch.float16),
    )
    for check, infos, allowed, mode, key_dtype in plans:
        for info in infos:
            modes = _modes(info, mode)
            for dtype in set(info.supported_dtypes(DEVICE_TYPE)) & set(allowed):
                for training in modes:
                    suffix = ""
                    if len(modes) > 1:
                        suffix = "_train_mode" if training else "_eval_mode"
                    name = (f"test_{check}_{info.formatted_name}{suffix}_{DEVICE_TYPE}_"
                            f"{dtype_str(dtype)}")
                    keys[name] = (check, _name(info, training), dtype_str(key_dtype or dtype))
    return keys


TEST_KEYS = _test_keys()


if __name__ == "__main__":
    run_tests()
