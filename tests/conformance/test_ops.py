"""Every OpInfo of PyTorch's ``op_db`` run on phantom and compared with the CPU.

Built on PyTorch's device-generic test framework: the tests below are
templates, ``@ops`` parametrizes them over OpInfos and dtypes, and
``instantiate_device_type_tests(..., only_for=("phantom",))`` turns them
into ``TestPhantomOpsPHANTOM.test_<check>_<op>_phantom_<dtype>`` through
``PrivateUse1TestBase``. See docs/conformance.md.

Checks, each a separate test per (op, dtype):

* ``forward``       the op on the first samples, phantom vs CPU
* ``noncontiguous`` the same samples made non-contiguous (``sample.noncontiguous()``)
* ``inplace``       the in-place variant (``op.inplace_variant``): the mutated
                    input, the result, and that the result *is* the input
* ``out``           ``out=`` with correctly sized outputs, and (first sample)
                    with empty outputs that the kernel must resize
* ``backward``      gradients of every differentiable input (float32/float64)

``forward``, ``noncontiguous``, ``inplace`` and ``out`` also compare the
warnings each call raised with the CPU's (a kernel's warning comes once, at
the call).

Samples are generated on phantom (so sample generation itself exercises the
device) with a fixed seed and copied to the CPU; both sides are seeded
identically before each call, so random ops draw the same numbers (phantom
draws the CPU's). A sample on which the CPU raises passes if phantom raises
the same exception type.
"""

import itertools
import os
import unittest
import warnings

import pytest
import torch
import torch_phantom.testing

# Must precede every torch.testing._internal import (see torch_phantom/testing.py).
torch_phantom.testing.enable_device_type_tests()

from torch.testing._internal.common_device_type import (  # noqa: E402
    OpDTypes,
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_utils import TestCase, run_tests  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

from _conformance import (  # noqa: E402
    EXPECTED,
    RECORDER,
    compare,
    dtype_str,
    shape_check,
)

DEVICE_TYPE = torch_phantom.testing.DEVICE_TYPE

FORWARD_DTYPES = (
    torch.float32,
    torch.float64,
    torch.int64,
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    # Where an OpInfo lists them for the CPU (eye, _scaled_mm): most ops
    # do not compute in float8, and tests/python/test_layouts.py checks that
    # phantom refuses those at the call, as the CPU does.
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
)
BACKWARD_DTYPES = (torch.float32, torch.float64)


def _limit(name, default):
    value = os.environ.get("PHANTOM_CONFORMANCE_SAMPLES")
    value = os.environ.get(f"PHANTOM_CONFORMANCE_SAMPLES_{name.upper()}", value)
    return default if value is None else int(value)  # 0: every sample


# First N samples of each (op, dtype) per check.
SAMPLE_LIMITS = {
    "forward": _limit("forward", 8),
    "noncontiguous": _limit("noncontiguous", 4),
    "inplace": _limit("inplace", 4),
    "out": _limit("out", 4),
    "backward": _limit("backward", 4),
}

# Ops whose output values are undefined (uninitialised memory): only shape,
# dtype and device are compared.
UNDEFINED_VALUES = {
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
}

SEED = 1234

INPLACE_OPS = [op for op in op_db if op.inplace_variant is not None]
OUT_OPS = [op for op in op_db if op.supports_out]
AUTOGRAD_OPS = [op for op in op_db if op.supports_autograd]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _is_phantom_device(value):
    if isinstance(value, torch.device):
        return value.type == DEVICE_TYPE
    if isinstance(value, str):
        try:
            return torch.device(value).type == DEVICE_TYPE
        except (RuntimeError, ValueError):
            return False
    return False


def _cpu_devices(obj):
    """Replaces phantom device arguments (``device="phantom:0"`` of factory
    samples, ``.to(device)``) by the CPU."""
    if _is_phantom_device(obj):
        return torch.device("cpu") if isinstance(obj, torch.device) else "cpu"
    if isinstance(obj, list):
        return [_cpu_devices(x) for x in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_cpu_devices(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _cpu_devices(v) for k, v in obj.items()}
    return obj


def _names_a_device(sample):
    """True when the sample passes a device explicitly (``device="cpu"``,
    ``.to("cpu")``): the result may then rightly live off phantom, so the
    "a phantom op returns phantom tensors" check is relaxed."""
    leaves = tree_flatten((sample.args, sample.kwargs))[0]
    for leaf in leaves:
        if isinstance(leaf, torch.device):
            return True
        if isinstance(leaf, str):
            try:
                torch.device(leaf)
                return True
            except (RuntimeError, ValueError):
                pass
    return False


def _cpu_same_layout(t):
    """A CPU copy of ``t`` with the same sizes, strides and storage offset
    over a copy of its whole storage, so the CPU kernel sees the same memory
    layout (and takes the same code path, contiguous or not) as phantom's,
    and storage-relative ops (``as_strided``) mean the same thing."""
    t = t.detach()
    if (
        t.layout != torch.strided
        or t.device.type != DEVICE_TYPE
        or t.is_conj()
        or t.is_neg()
        or t.is_quantized
    ):
        return t.cpu()
    storage = t.untyped_storage()
    flat = t.new_empty(0).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    return flat.cpu().as_strided(t.shape, t.stride(), t.storage_offset())


def _to_cpu_sample(sample, keep_grad=False):
    def f(t):
        if isinstance(t, torch.dtype):
            return t
        c = _cpu_same_layout(t)
        if keep_grad and t.requires_grad:
            c.requires_grad_(True)
        return c

    cpu = sample.transform(f)
    cpu.args = _cpu_devices(cpu.args)
    cpu.kwargs = _cpu_devices(cpu.kwargs)
    return cpu


def _call(fn, warned=None):
    """(result, None) or (None, exception) of ``fn()``, seeded; the warnings
    it raised, as (category, message), are appended to ``warned``."""
    torch.manual_seed(SEED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(), None
        except Exception as error:  # noqa: BLE001 - compared with the CPU's
            return None, error
        finally:
            if warned is not None:
                warned.extend((w.category.__name__, str(w.message)) for w in caught)


# Warnings phantom does not raise as the CPU does yet, each with its reason;
# they are left out of the comparison (and listed in docs/conformance.md).
KNOWN_WARNING_DIFFERENCES = {
    # ATen's copy_ raises it in the part of copy_impl that phantom's copies
    # (_copy_from) do not go through.
    "Casting complex values to real discards the imaginary part":
        "phantom's dtype-converting copies do not raise it",
    # Raised when a complex32 tensor is allocated: a Python Meta kernel
    # allocates meta tensors through Python bindings, whose own warning
    # handler sends it to Python directly, past the generic path's capture.
    "ComplexHalf support is experimental":
        "Python Meta kernels allocating complex32 meta tensors raise it",
}


def _same_warnings(phantom, cpu):
    """A kernel's warnings come once, at the call, as on the CPU
    (device/hostexec/KernelWarnings.cpp); conftest.py turns TORCH_WARN_ONCE into
    per-call warnings so that the order of the tests does not matter."""
    def compared(warned):
        return [w for w in warned
                if not any(w[1].startswith(k) for k in KNOWN_WARNING_DIFFERENCES)]

    phantom, cpu = compared(phantom), compared(cpu)
    if phantom != cpu:
        raise AssertionError(
            f"warnings differ: the CPU raised {len(cpu)} {[m[:80] for _, m in cpu]}, "
            f"phantom {len(phantom)} {[m[:80] for _, m in phantom]}"
        )


def _describe(error):
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}"[:400]


def _summary(sample):
    try:
        text = sample.summary()
    except Exception:  # noqa: BLE001
        text = repr(sample)
    return " ".join(text.split())[:300]


class _Stats:
    def __init__(self):
        self.samples = 0
        self.matched = 0
        self.failures = []


def _match(ph, ph_exc, cpu, cpu_exc, check_fn=compare, strict_device=True):
    """Compares one phantom call with the same CPU call (values or raised
    exception type)."""
    if cpu_exc is not None:
        if ph_exc is None:
            raise AssertionError(
                f"the CPU raised {_describe(cpu_exc)} but phantom returned a result"
            )
        if type(ph_exc) is not type(cpu_exc):
            raise AssertionError(
                f"phantom raised {_describe(ph_exc)}, the CPU raised {_describe(cpu_exc)}"
            )
        return
    if ph_exc is not None:
        raise AssertionError(f"phantom raised {_describe(ph_exc)}; the CPU succeeded")
    check_fn(ph, cpu, DEVICE_TYPE, strict_device=strict_device)


# --------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------


class TestPhantomOps(TestCase):
    # The framework's own per-test precision overrides do not apply: tensors
    # are compared with torch.testing.assert_close's per-dtype defaults.

    def _samples(self, make, limit, stats):
        """Yields up to ``limit`` (0: all) samples; a failure to generate
        them on phantom counts as a failed sample."""
        torch.manual_seed(0)
        try:
            iterator = iter(make())
            for index in itertools.count():
                if limit and index >= limit:
                    return
                try:
                    sample = next(iterator)
                except StopIteration:
                    return
                yield index, sample
        except Exception as error:  # noqa: BLE001
            stats.samples += 1
            stats.failures.append(f"sample generation on phantom: {_describe(error)}")

    def _sample_loop(self, check, device, dtype, op, body, requires_grad=False):
        stats = _Stats()
        samples = self._samples(
            lambda: op.sample_inputs(device, dtype, requires_grad=requires_grad),
            SAMPLE_LIMITS[check],
            stats,
        )
        for index, sample in samples:
            try:
                counted = body(sample, index)
            except Exception as error:  # noqa: BLE001
                stats.samples += 1
                stats.failures.append(
                    f"sample {index} [{_summary(sample)}]: {_describe(error)}"
                )
                continue
            if counted is not False:
                stats.samples += 1
                stats.matched += 1
        return stats

    # -- checks ------------------------------------------------------------

    def _values_check(self, op):
        return shape_check if op.name in UNDEFINED_VALUES else compare

    def _check_forward(self, device, dtype, op, noncontiguous=False):
        check = "noncontiguous" if noncontiguous else "forward"
        values = self._values_check(op)

        def body(sample, index):
            if noncontiguous:
                sample = sample.noncontiguous()
            cpu = _to_cpu_sample(sample)
            ph_warned, ref_warned = [], []
            ph, ph_exc = _call(lambda: op(sample.input, *sample.args, **sample.kwargs), ph_warned)
            ref, ref_exc = _call(lambda: op(cpu.input, *cpu.args, **cpu.kwargs), ref_warned)
            _match(ph, ph_exc, ref, ref_exc, values, not _names_a_device(sample))
            _same_warnings(ph_warned, ref_warned)

        return self._sample_loop(check, device, dtype, op, body)

    def _check_noncontiguous(self, device, dtype, op):
        return self._check_forward(device, dtype, op, noncontiguous=True)

    def _check_inplace(self, device, dtype, op):
        variant = op.inplace_variant
        values = self._values_check(op)

        def body(sample, index):
            if not isinstance(sample.input, torch.Tensor):
                return False  # not applicable: nothing to modify in place
            cpu = _to_cpu_sample(sample)
            ph_in = sample.input.clone()
            ref_in = cpu.input.clone()
            ph_warned, ref_warned = [], []
            ph, ph_exc = _call(lambda: variant(ph_in, *sample.args, **sample.kwargs), ph_warned)
            ref, ref_exc = _call(lambda: variant(ref_in, *cpu.args, **cpu.kwargs), ref_warned)
            _match(ph, ph_exc, ref, ref_exc, values, not _names_a_device(sample))
            _same_warnings(ph_warned, ref_warned)
            if ref_exc is None:
                values(ph_in, ref_in, DEVICE_TYPE, "input (modified in place)")
                if (ref is ref_in) != (ph is ph_in):
                    raise AssertionError(
                        "in-place identity differs: the CPU variant returns "
                        f"{'its input' if ref is ref_in else 'a new tensor'}, phantom's "
                        f"{'its input' if ph is ph_in else 'a new tensor'}"
                    )

        return self._sample_loop("inplace", device, dtype, op, body)

    def _check_out(self, device, dtype, op):
        values = self._values_check(op)

        def make_out(expected, dev, empty):
            def one(t):
                if empty:
                    return torch.empty(0, dtype=t.dtype, device=dev)
                return torch.zeros(t.shape, dtype=t.dtype, device=dev)

            if isinstance(expected, torch.Tensor):
                return one(expected)
            if isinstance(expected, (tuple, list)) and expected and all(
                isinstance(t, torch.Tensor) for t in expected
            ):
                return tuple(one(t) for t in expected)
            return None

        def body(sample, index):
            cpu = _to_cpu_sample(sample)
            expected, exc = _call(lambda: op(cpu.input, *cpu.args, **cpu.kwargs))
            if exc is not None:
                return False  # not applicable: the functional form fails on CPU
            for empty in (False, True) if index == 0 else (False,):
                ref_out = make_out(expected, "cpu", empty)
                if ref_out is None:
                    return False  # not applicable: no tensor output
                ph_out = make_out(expected, device, empty)
                ph_warned, ref_warned = [], []
                ph, ph_exc = _call(
                    lambda: op(sample.input, *sample.args, **sample.kwargs, out=ph_out),
                    ph_warned,
                )
                ref, ref_exc = _call(
                    lambda: op(cpu.input, *cpu.args, **cpu.kwargs, out=ref_out), ref_warned
                )
                _match(ph, ph_exc, ref, ref_exc, values, not _names_a_device(sample))
                _same_warnings(ph_warned, ref_warned)
                if ref_exc is None:
                    what = "out= (empty, resized)" if empty else "out="
                    values(ph_out, ref_out, DEVICE_TYPE, what)

        return self._sample_loop("out", device, dtype, op, body)

    def _check_backward(self, device, dtype, op):
        def differentiable(s):
            out = op(s.input, *s.args, **s.kwargs)
            out = s.output_process_fn_grad(out)
            outs = [
                t for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor) and t.requires_grad
            ]
            ins = [
                t for t in tree_flatten((s.input, s.args, s.kwargs))[0]
                if isinstance(t, torch.Tensor) and t.requires_grad
            ]
            return outs, ins

        def body(sample, index):
            cpu = _to_cpu_sample(sample, keep_grad=True)
            ref, ref_exc = _call(lambda: differentiable(cpu))
            ph, ph_exc = _call(lambda: differentiable(sample))
            _match(ph, ph_exc, ref, ref_exc, lambda a, e, d, strict_device: None)
            if ref_exc is not None:
                return None
            ref_outs, ref_ins = ref
            ph_outs, ph_ins = ph
            if not ref_outs or not ref_ins:
                return False  # not applicable: nothing differentiable
            strict = not _names_a_device(sample)
            compare(ph_outs, ref_outs, DEVICE_TYPE, "output", strict)
            torch.manual_seed(SEED + 1)
            grad_outputs = [torch.randn_like(t) for t in ref_outs]
            ref_grads, ref_exc = _call(
                lambda: torch.autograd.grad(ref_outs, ref_ins, grad_outputs, allow_unused=True)
            )
            ph_grads, ph_exc = _call(
                lambda: torch.autograd.grad(
                    ph_outs, ph_ins, [g.to(device) for g in grad_outputs],
                    allow_unused=True,
                )
            )
            _match(ph_grads, ph_exc, ref_grads, ref_exc,
                   lambda a, e, d, strict_device: compare(a, e, d, "grad", strict_device),
                   strict)

        return self._sample_loop("backward", device, dtype, op, body, requires_grad=True)

    # -- the driver --------------------------------------------------------

    def _conform(self, check, device, dtype, op):
        key = (check, op.full_name, dtype_str(dtype))
        nodeid = self.id()
        entry = EXPECTED.lookup(*key)
        if entry is not None and entry["kind"] == "skip":
            RECORDER.record(key, "skipped", reason=entry["reason"], nodeid=nodeid)
            raise unittest.SkipTest(f"listed in expected_failures.json: {entry['reason']}")

        stats = getattr(self, f"_check_{check}")(device, dtype, op)
        try:
            torch.phantom.synchronize()
        except Exception as error:  # noqa: BLE001 - a sticky stream error
            stats.failures.append(f"synchronize after the test: {_describe(error)}")

        error = stats.failures[0] if stats.failures else ""
        if entry is not None:  # kind == "xfail"
            if stats.failures:
                RECORDER.record(key, "xfailed", stats.samples, stats.matched,
                                entry["reason"], nodeid, error)
                pytest.xfail(f"listed in expected_failures.json: {entry['reason']}")
            if not entry.get("strict", True):  # the machine decides
                RECORDER.record(key, "passed", stats.samples, stats.matched,
                                entry["reason"], nodeid)
                return
            RECORDER.record(key, "xpassed", stats.samples, stats.matched,
                            entry["reason"], nodeid)
            self.fail(
                f"{'/'.join(key)} is listed in expected_failures.json as failing "
                f"({entry['reason']!r}) but passed on {stats.samples} samples: "
                "remove the entry"
            )
        if stats.failures:
            RECORDER.record(key, "failed", stats.samples, stats.matched, error, nodeid, error)
            shown = "\n  ".join(stats.failures[:3])
            more = len(stats.failures) - 3
            self.fail(
                f"{'/'.join(key)}: {len(stats.failures)} of {stats.samples} samples "
                f"differ from the CPU (not listed in expected_failures.json):\n  {shown}"
                + (f"\n  ... and {more} more" if more > 0 else "")
            )
        if stats.samples == 0:
            reason = "no applicable sample (nothing compared)"
            RECORDER.record(key, "unlisted-skip", 0, 0, reason, nodeid)
            self.fail(
                f"{'/'.join(key)}: {reason}; list it as a skip in "
                "expected_failures.json"
            )
        RECORDER.record(key, "passed", stats.samples, stats.matched, "", nodeid)

    @ops(op_db, allowed_dtypes=FORWARD_DTYPES)
    def test_forward(self, device, dtype, op):
        self._conform("forward", device, dtype, op)

    @ops(op_db, allowed_dtypes=FORWARD_DTYPES)
    def test_noncontiguous(self, device, dtype, op):
        self._conform("noncontiguous", device, dtype, op)

    @ops(INPLACE_OPS, allowed_dtypes=FORWARD_DTYPES)
    def test_inplace(self, device, dtype, op):
        self._conform("inplace", device, dtype, op)

    @ops(OUT_OPS, allowed_dtypes=FORWARD_DTYPES)
    def test_out(self, device, dtype, op):
        self._conform("out", device, dtype, op)

    @ops(AUTOGRAD_OPS, dtypes=OpDTypes.supported_backward, allowed_dtypes=BACKWARD_DTYPES)
    def test_backward(self, device, dtype, op):
        self._conform("backward", device, dtype, op)


instantiate_device_type_tests(TestPhantomOps, globals(), only_for=(DEVICE_TYPE,))


def _test_keys():
    """{instantiated test name: (check, op, dtype)}: lets conftest.py name a
    test the framework skipped before its body ran."""
    keys = {}
    plans = (
        ("forward", op_db, FORWARD_DTYPES, False),
        ("noncontiguous", op_db, FORWARD_DTYPES, False),
        ("inplace", INPLACE_OPS, FORWARD_DTYPES, False),
        ("out", OUT_OPS, FORWARD_DTYPES, False),
        ("backward", AUTOGRAD_OPS, BACKWARD_DTYPES, True),
    )
    for check, op_list, allowed, backward in plans:
        for op in op_list:
            supported = (
                op.supported_backward_dtypes(DEVICE_TYPE)
                if backward
                else op.supported_dtypes(DEVICE_TYPE)
            )
            for dtype in set(supported) & set(allowed):
                name = f"test_{check}_{op.formatted_name}_{DEVICE_TYPE}_{dtype_str(dtype)}"
                keys[name] = (check, op.full_name, dtype_str(dtype))
    return keys


TEST_KEYS = _test_keys()


if __name__ == "__main__":
    run_tests()
