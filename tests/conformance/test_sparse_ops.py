"""The sparse samples of PyTorch's ``op_db`` run on phantom and compared
with the CPU (docs/sparse.md, docs/conformance.md).

Every OpInfo that declares a sparse layout (``supports_sparse``,
``supports_sparse_csr``, ``_csc``, ``_bsr``, ``_bsc``) gives samples in that
layout through its ``sample_inputs_sparse_<layout>`` function (for most
ops torch's own conversion of its dense samples, as torch's test_sparse.py
uses them), or where it has none, its dense samples with the input
converted to the layout, as those tests convert them. One test per (layout, op, dtype), keyed ``(sparse_<layout>,
op, dtype)`` like the other suites' tests, so expected_failures.json lists
its exceptions the same way. A sample is generated on the CPU with a fixed
seed and moved to phantom (sparse tensors and all: moving them is part of
what is tested); the op runs on both, seeded alike, and phantom must give
the CPU's result (same layout, values within assert_close's per-dtype
tolerances), the CPU's warnings, or, where the CPU raises, the same
exception type.

Sampled by default: the first PHANTOM_CONFORMANCE_SAMPLES_SPARSE (else
PHANTOM_CONFORMANCE_SAMPLES, else 6) samples of each test; 0 runs every
sample (the full mode).
"""

import itertools
import unittest
import warnings

import torch
import torch_phantom.testing

torch_phantom.testing.enable_device_type_tests()

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402

from _conformance import compare, conform, describe, dtype_str, sample_limit  # noqa: E402

DEVICE_TYPE = torch_phantom.testing.DEVICE_TYPE
LIMIT = sample_limit("sparse", 6)
SEED = 1234

LAYOUTS = {
    "sparse_coo": ("supports_sparse", torch.sparse_coo),
    "sparse_csr": ("supports_sparse_csr", torch.sparse_csr),
    "sparse_csc": ("supports_sparse_csc", torch.sparse_csc),
    "sparse_bsr": ("supports_sparse_bsr", torch.sparse_bsr),
    "sparse_bsc": ("supports_sparse_bsc", torch.sparse_bsc),
}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.complex64, torch.int64, torch.bool)


def _move(value, device):
    if isinstance(value, torch.Tensor):
        moved = value.detach().to(device)
        return moved.requires_grad_(value.requires_grad) if value.is_leaf else moved
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type == "cpu":
        return torch.device(device)
    if value == "cpu":
        return device
    return value


def _label(sample):
    """SampleInput.summary() asks every tensor is_contiguous(), which CSC,
    BSR and BSC tensors refuse."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return f"{tuple(x.shape)} {str(x.layout)[6:]}"
        return repr(x)[:40]
    return ", ".join([one(sample.input)] + [one(a) for a in sample.args]
                     + [f"{k}={one(v)}" for k, v in sample.kwargs.items()])


def _call(fn, warned):
    torch.manual_seed(SEED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, error = fn(), None
        except Exception as exc:  # noqa: BLE001 - compared with the CPU's
            result, error = None, exc
    warned.extend(str(w.message)[:80] for w in caught)
    return result, error


def _converted(op, layout, dtype):
    """The op's dense samples with the input in `layout`, as torch's
    test_sparse.py and test_sparse_csr.py make them for ops without sparse
    sample functions (compressed layouts need 2 dimensions; blocks of
    1x1)."""
    for sample in op.sample_inputs("cpu", dtype):
        t = sample.input
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            continue
        if layout != torch.sparse_coo and t.dim() != 2:
            continue
        blocksize = (1, 1) if layout in (torch.sparse_bsr, torch.sparse_bsc) else None
        yield sample.transform(lambda x, t=t: x.to_sparse(layout=layout, blocksize=blocksize)
                               if x is t else x)


def _samples(op, layout, dtype):
    try:
        return list(itertools.islice(op.sample_inputs_sparse(layout, "cpu", dtype),
                                     LIMIT or None))
    except (NotImplementedError, unittest.SkipTest):
        # The OpInfo has no sparse sample function, or one that gives no
        # sample (zeros_like, randn_like for COO).
        return list(itertools.islice(_converted(op, layout, dtype), LIMIT or None))


def _check(op, layout, dtype, stats):
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse is beta; invariants are off
        try:
            samples = _samples(op, layout, dtype)
        except Exception as error:  # noqa: BLE001 - the CPU cannot make them
            def fail(error=error):
                raise error
            stats.run("sample generation on the CPU", fail)
            return
    for index, cpu in enumerate(samples):
        def body(cpu=cpu):
            ph_input, ph_args, ph_kwargs = (_move(cpu.input, DEVICE_TYPE),
                                            _move(cpu.args, DEVICE_TYPE),
                                            _move(cpu.kwargs, DEVICE_TYPE))
            ph_warned, ref_warned = [], []
            ph, ph_exc = _call(lambda: op(ph_input, *ph_args, **ph_kwargs), ph_warned)
            ref, ref_exc = _call(lambda: op(cpu.input, *cpu.args, **cpu.kwargs), ref_warned)
            if ref_exc is not None:
                if ph_exc is None or type(ph_exc) is not type(ref_exc):
                    raise AssertionError(
                        f"the CPU raised {describe(ref_exc)}; phantom "
                        + ("did not" if ph_exc is None else f"raised {describe(ph_exc)}"))
                return
            if ph_exc is not None:
                raise ph_exc
            compare(ph, ref, DEVICE_TYPE)
            if ph_warned != ref_warned:
                raise AssertionError(f"warnings differ: the CPU raised {ref_warned}, "
                                     f"phantom {ph_warned}")
        stats.run(f"sample {index} [{_label(cpu)}]", body)


def _plans():
    for check, (flag, layout) in LAYOUTS.items():
        for op in op_db:
            if not getattr(op, flag):
                continue
            for dtype in DTYPES:
                if dtype in op.supported_dtypes("cpu"):
                    yield check, layout, op, dtype


class TestPhantomSparseOps(TestCase):
    pass


TEST_KEYS = {}


def _make_test(check, layout, op, dtype):
    key = (check, op.full_name, dtype_str(dtype))

    def test(self):
        conform(self, key, lambda stats: _check(op, layout, dtype, stats))

    return test


for _check_name, _layout, _op, _dtype in _plans():
    _name = f"test_{_check_name}_{_op.formatted_name}_{DEVICE_TYPE}_{dtype_str(_dtype)}"
    TEST_KEYS[_name] = (_check_name, _op.full_name, dtype_str(_dtype))
    setattr(TestPhantomSparseOps, _name, _make_test(_check_name, _layout, _op, _dtype))
