"""Bad arguments raise at the call, as on the CPU.

PyTorch's OpInfo database lists, for many ops, inputs that must raise
(`error_inputs`), each with the message it must raise (`error_regex`). On
phantom each must raise at the call, with exactly the CPU's exception type
and a message that matches the OpInfo's regex (or, where the CPU's own
message does not, the CPU's message), and leave nothing queued that fails
later: a Python Meta kernel or a native kernel that misses a check must not
turn an argument error into a stream error at the next sync
(docs/operators.md, "trial run", "Native kernels"). Inputs the CPU
accepts (some error inputs are for other devices) are skipped."""
import re
import warnings

import pytest
import torch

import torch_phantom  # noqa: F401
from torch.testing._internal.common_methods_invocations import op_db

P = torch.phantom
OPS = [op for op in op_db if op.error_inputs_func is not None]
# Ops whose error on an accelerator is another than the CPU's (type and
# message), for a reason outside phantom, and the reason; they must still
# raise at the call.
OTHER_ERROR_THAN_CPU = {
    "narrow_copy": (
        "every device but the CPU runs narrow_copy as narrow().clone(): its "
        "dimension check raises IndexError('Dimension out of range ...') where "
        "the CPU kernel's raises RuntimeError('Expected dim < ...'), as on CUDA"),
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
        return error
    return None


def _message_problem(error_regex, cpu, phantom):
    """Why phantom's message is not the expected one, or None."""
    expected = error_regex or ""
    if re.search(expected, str(cpu)):
        if re.search(expected, str(phantom)):
            return None
        return f"{str(phantom)!r} does not match the OpInfo's {expected!r}"
    # The CPU raises for another reason than the OpInfo names (an error
    # input written for another device): phantom must give the CPU's.
    if str(phantom) == str(cpu):
        return None
    return f"{str(phantom)!r} is not the CPU's {str(cpu)!r}"


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
        if op.name not in OTHER_ERROR_THAN_CPU:
            assert type(phantom) is type(cpu), (
                f"{op.name}: phantom raised {type(phantom).__name__}({phantom}), "
                f"the CPU {type(cpu).__name__}({cpu})")
            problem = _message_problem(error_input.error_regex, cpu, phantom)
            assert problem is None, f"{op.name}: {problem}"
        P.synchronize()  # nothing queued that fails later
        checked += 1
    if checked == 0:
        pytest.skip("no error input raises on the CPU")
