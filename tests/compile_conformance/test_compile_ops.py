"""PyTorch's OpInfo database through ``torch.compile`` on phantom.

The approach of PyTorch's own Inductor OpInfo test
(``test/inductor/test_torchinductor_opinfo.py``): for each OpInfo, its
first float32 sample goes through ``torch.compile(fullgraph=True)`` with
Inductor, and the compiled result is compared with the op run eagerly on
the CPU. It is done twice, on the CPU and on phantom, from the same sample
(generated on phantom and copied to the CPU with the same memory layout). Only ops the CPU compiles and gets
right count: phantom must do the same for each of them, or be listed with
its reason in ``expected_failures.json`` (docs/compile.md). An op the CPU
does not compile correctly is reported (with the CPU's error) and
skipped: it says nothing about phantom.

By default a fixed, evenly spread sample of the database runs (every
``PHANTOM_COMPILE_CONFORMANCE_STRIDE``-th op by name; compiling is slow);
``PHANTOM_COMPILE_CONFORMANCE=full`` runs every op.
"""

import os

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

from _compile_conformance import (
    EXPECTED,
    RECORDER,
    Mismatch,
    compare,
    shape_check,
)

DEVICE = "phantom"
DTYPE = torch.float32
SEED = 1234
FULL = os.environ.get("PHANTOM_COMPILE_CONFORMANCE", "") == "full"
# About 40 ops by default: a few minutes on two cores.
STRIDE = int(os.environ.get("PHANTOM_COMPILE_CONFORMANCE_STRIDE", "17"))

# Ops whose values are undefined (uninitialised memory): shape, dtype and
# device are compared.
UNDEFINED_VALUES = {
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
    "new_empty_strided",
}

ALL_OPS = sorted(
    (op for op in op_db if DTYPE in op.supported_dtypes("cpu")),
    key=lambda op: op.full_name,
)
OPS = ALL_OPS if FULL else ALL_OPS[::STRIDE]


def _cpu_same_layout(t):
    """A CPU copy of the phantom tensor ``t`` with the same sizes, strides
    and storage offset over a copy of its whole storage: the compiled code
    sees the same memory layout on both devices. Tensors the sample put on
    the CPU (indices some ops require there) stay as they are."""
    if not isinstance(t, torch.Tensor) or t.device.type != DEVICE or t.layout != torch.strided:
        return t
    t = t.detach()
    storage = t.untyped_storage()
    flat = t.new_empty(0).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    return flat.cpu().as_strided(t.shape, t.stride(), t.storage_offset())


def _names_phantom(value):
    if isinstance(value, torch.device):
        return value.type == DEVICE
    if isinstance(value, str):
        try:
            return torch.device(value).type == DEVICE
        except (RuntimeError, ValueError):
            return False
    return False


def _arguments(sample):
    return [sample.input, *sample.args], dict(sample.kwargs)


def _on_cpu(sample):
    """The sample's arguments for the CPU: phantom tensors copied (same
    layout), device arguments naming phantom (a factory's ``device=``)
    naming the CPU."""
    def move(value):
        if _names_phantom(value):
            return torch.device("cpu") if isinstance(value, torch.device) else "cpu"
        return _cpu_same_layout(value)

    return tree_map(move, _arguments(sample))


def _names_a_device(sample):
    leaves = tree_flatten((sample.args, sample.kwargs))[0]
    return any(isinstance(x, torch.device) or _names_phantom(x)
               or (isinstance(x, str) and x.startswith("cpu")) for x in leaves)


def _describe(error):
    lines = str(error).strip().splitlines()
    first = next((line for line in lines if line.strip()), "")
    return f"{type(error).__name__}: {first}"[:300]


def _compiled(op, args, kwargs):
    """The op compiled by Inductor (whole graph, static shapes), called."""
    torch._dynamo.reset()
    func = op.get_op()

    def fn(*a, **k):
        return func(*a, **k)

    compiled = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False)
    torch.manual_seed(SEED)
    result = compiled(*args, **kwargs)
    if any(isinstance(t, torch.Tensor) and t.device.type == DEVICE
           for t in tree_flatten(result)[0]):
        torch.phantom.synchronize()  # a kernel's error surfaces here
    return result


def _verdict(op, args, kwargs, device, expected, strict_device):
    """None if the op, compiled, ran on ``device``'s arguments and matched
    the CPU's eager result, else the reason."""
    try:
        actual = _compiled(op, args, kwargs)
    except Exception as error:  # noqa: BLE001 - the verdict
        return f"compile or run: {_describe(error)}"
    check = shape_check if op.name in UNDEFINED_VALUES else compare
    try:
        check(actual, expected, device, strict_device=strict_device)
    except Mismatch as error:
        return f"mismatch: {str(error).splitlines()[0][:300]}"
    return None


def _first_sample(op, device):
    """The first float32 sample, generated on ``device`` (phantom, as the
    eager suite does) from a fixed seed."""
    torch.manual_seed(0)
    return next(iter(op.sample_inputs(device, DTYPE, requires_grad=False)))


@pytest.mark.parametrize("op", OPS, ids=[op.full_name for op in OPS])
def test_compiled_op(op):
    key = op.full_name
    entry = EXPECTED.lookup(key)
    if entry is not None and entry["kind"] == "skip":
        RECORDER.record(key, "skipped", reason=entry["reason"])
        pytest.skip(f"listed in expected_failures.json: {entry['reason']}")
    no_phantom_sample = None
    try:
        sample = _first_sample(op, DEVICE)
    except StopIteration:
        RECORDER.record(key, "not-applicable", reason="the OpInfo has no float32 sample")
        pytest.skip("the OpInfo has no float32 sample")
    except Exception as error:  # noqa: BLE001 - phantom cannot make the inputs
        # Judged on the CPU's sample: if the CPU compiles the op correctly,
        # phantom failing to even hold its inputs is phantom's failure.
        no_phantom_sample = f"the sample cannot be made on phantom: {_describe(error)}"
        sample = _first_sample(op, "cpu")
    cpu_args, cpu_kwargs = _on_cpu(sample)
    torch.manual_seed(SEED)
    try:
        expected = op.get_op()(*cpu_args, **cpu_kwargs)
    except Exception as error:  # noqa: BLE001
        RECORDER.record(key, "not-applicable", reason=f"eager CPU raises {_describe(error)}")
        pytest.skip(f"the sample raises on the CPU: {_describe(error)}")
    strict = not _names_a_device(sample)

    cpu = _verdict(op, cpu_args, cpu_kwargs, "cpu", expected, strict)
    if cpu is not None:
        RECORDER.record(key, "cpu-fails", reason=cpu)
        pytest.skip(f"not counted: the CPU does not compile it correctly either ({cpu})")

    if no_phantom_sample is None:
        args, kwargs = _arguments(sample)
        phantom = _verdict(op, args, kwargs, DEVICE, expected, strict)
    else:
        phantom = no_phantom_sample
    if entry is not None:  # kind == "xfail"
        if phantom is not None:
            RECORDER.record(key, "xfailed", reason=entry["reason"], error=phantom)
            pytest.xfail(f"listed in expected_failures.json: {entry['reason']}")
        RECORDER.record(key, "xpassed", reason=entry["reason"])
        pytest.fail(f"{key} is listed in expected_failures.json as failing "
                    f"({entry['reason']!r}) but passed: remove the entry")
    if phantom is not None:
        RECORDER.record(key, "failed", reason=phantom, error=phantom)
        pytest.fail(f"{key}: the CPU compiles it and matches eager, phantom does not "
                    f"(not listed in expected_failures.json): {phantom}")
    RECORDER.record(key, "passed")

