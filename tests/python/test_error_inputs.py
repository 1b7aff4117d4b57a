"""Bad arguments raise at the call, as on the CPU.

PyTorch's OpInfo database lists, for many ops, inputs that must raise
(`error_inputs`). On phantom each must raise at the call, with the CPU's
exception type, and leave nothing queued that fails later: a Python Meta
kernel that misses a check must not turn an argument error into a stream
error at the next sync (docs/architecture.md, "trial run"). Inputs the CPU
accepts (some error inputs are for other devices) are skipped."""
import warnings

import pytest
import torch

import torch_phantom  # noqa: F401
from torch.testing._internal.common_methods_invocations import op_db

P = torch.phantom
OPS = [op for op in op_db if op.error_inputs_func is not None]
# Ops whose error on an accelerator is of another type than the CPU's, for
# a reason outside phantom; they must still raise at the call.
OTHER_TYPE_THAN_CPU = {
    # Every device but the CPU runs narrow_copy as narrow().clone(): its
    # dimension check raises IndexError where the CPU kernel's raises
    # RuntimeError (the same on CUDA).
    "narrow_copy",
}


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value if value.is_meta else value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type == "phantom":
        return torch.device("cpu")
    return value


def _outcome(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except Exception as error:  # noqa: BLE001 - any exception is the outcome
        return type(error)
    return None


@pytest.mark.parametrize("op", OPS, ids=[f"{op.name}.{op.variant_test_name}" for op in OPS])
def test_error_inputs_raise_at_the_call_like_the_cpu(op):
    checked = 0
    for error_input in op.error_inputs("phantom"):
        sample = error_input.sample_input
        cpu_args = _to_cpu([sample.input, *sample.args])
        cpu_kwargs = _to_cpu(dict(sample.kwargs))
        cpu = _outcome(lambda: op.op(*cpu_args, **cpu_kwargs))
        if cpu is None:
            continue  # an error input for another device
        phantom = _outcome(lambda: op.op(sample.input, *sample.args, **sample.kwargs))
        assert phantom is not None, (
            f"{op.name}: {error_input.error_regex!r} was not raised at the call")
        if op.name not in OTHER_TYPE_THAN_CPU:
            assert issubclass(phantom, cpu) or issubclass(cpu, phantom), (
                f"{op.name}: phantom raised {phantom.__name__}, the CPU {cpu.__name__}")
        P.synchronize()  # nothing queued that fails later
        checked += 1
    if checked == 0:
        pytest.skip("no error input raises on the CPU")
