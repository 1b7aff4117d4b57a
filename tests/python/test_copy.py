"""Copies between the host and phantom devices and between phantom devices.

Every ``copy_``, ``.to()`` and ``.cpu()`` goes through phantom's
``_copy_from``; users rely on it to move data faithfully in every direction,
with dtype conversion, arbitrary strides on either side, broadcasting,
conjugate views, 0-dim and empty tensors, and asynchronous copies from and
to pinned memory. The CPU's own ``copy_`` is the oracle throughout.
"""

import pytest
import torch
from torch_phantom import _C

from conftest import assert_case_passed, run_cases_forked

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.complex64,
]

CONVERSIONS = [
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
    (torch.float32, torch.int64),
    (torch.float32, torch.bool),
    (torch.int64, torch.float32),
    (torch.float32, torch.float16),
    (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.complex64),
    (torch.complex64, torch.complex128),
    (torch.bool, torch.float32),
]


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 5
    if dtype.is_complex:
        return torch.complex(x, torch.randn(shape, generator=g)).to(dtype)
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


def assert_equal(actual, expected):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


# --------------------------------------------------------------------------
# Round trips, same dtype
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_host_device_host(dtype):
    cpu = make((3, 17), dtype)
    x = cpu.to("phantom")
    assert x.dtype == dtype and x.is_phantom
    assert_equal(x.cpu(), cpu)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_between_devices_and_back(dtype, two_devices):
    cpu = make((5, 7), dtype)
    x0 = cpu.to("phantom:0")
    x1 = x0.to("phantom:1")
    assert x1.device == torch.device("phantom:1")
    back = x1.to("phantom:0")
    assert back.device == torch.device("phantom:0")
    assert_equal(x1.cpu(), cpu)
    assert_equal(back.cpu(), cpu)


# --------------------------------------------------------------------------
# Dtype conversion in every direction
# --------------------------------------------------------------------------


@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS, ids=str)
def test_convert_host_to_device(src_dtype, dst_dtype):
    cpu = make((4, 6), src_dtype)
    assert_equal(cpu.to("phantom", dst_dtype).cpu(), cpu.to(dst_dtype))


@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS, ids=str)
def test_convert_device_to_host(src_dtype, dst_dtype):
    cpu = make((4, 6), src_dtype)
    x = cpu.to("phantom")
    dst = torch.empty(4, 6, dtype=dst_dtype)
    dst.copy_(x)
    assert_equal(dst, cpu.to(dst_dtype))
    assert_equal(x.to("cpu", dst_dtype), cpu.to(dst_dtype))


@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS, ids=str)
def test_convert_on_device(src_dtype, dst_dtype):
    cpu = make((4, 6), src_dtype)
    x = cpu.to("phantom")
    assert_equal(x.to(dst_dtype).cpu(), cpu.to(dst_dtype))


@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS, ids=str)
def test_convert_across_devices(src_dtype, dst_dtype, two_devices):
    cpu = make((4, 6), src_dtype)
    x = cpu.to("phantom:0")
    y = x.to("phantom:1", dst_dtype)
    assert y.device == torch.device("phantom:1")
    assert_equal(y.cpu(), cpu.to(dst_dtype))


# --------------------------------------------------------------------------
# Strides and broadcasting
# --------------------------------------------------------------------------

SOURCE_VIEWS = {
    "transpose": lambda t: t.t(),
    "step_slice": lambda t: t[::2, 1::3],
    "column": lambda t: t[:, 3],
    "permute3d": lambda t: t.reshape(2, 4, 9).permute(2, 0, 1),
    "negative_offset_slice": lambda t: t[1:, 2:7],
}


@pytest.mark.parametrize("view", SOURCE_VIEWS, ids=str)
def test_non_contiguous_source_host_to_device(view):
    cpu = make((8, 9), torch.float32)
    src = SOURCE_VIEWS[view](cpu)
    assert_equal(src.to("phantom").cpu(), src.contiguous())


@pytest.mark.parametrize("view", SOURCE_VIEWS, ids=str)
def test_non_contiguous_source_device_to_host(view):
    cpu = make((8, 9), torch.float32)
    x = cpu.to("phantom")
    assert_equal(SOURCE_VIEWS[view](x).cpu(), SOURCE_VIEWS[view](cpu))


@pytest.mark.parametrize("view", SOURCE_VIEWS, ids=str)
def test_non_contiguous_source_on_device_and_across(view, two_devices):
    cpu = make((8, 9), torch.float32)
    x = cpu.to("phantom:0")
    expected = SOURCE_VIEWS[view](cpu).contiguous()
    assert_equal(SOURCE_VIEWS[view](x).contiguous().cpu(), expected)
    assert_equal(SOURCE_VIEWS[view](x).to("phantom:1").cpu(), expected)


@pytest.mark.parametrize("src_kind", ["cpu", "phantom:0", "phantom:1"])
def test_copy_into_non_contiguous_phantom_destination(src_kind, two_devices):
    base_cpu = make((6, 8), torch.float32, seed=1)
    src_cpu = make((3, 4), torch.float64, seed=2)  # dtype conversion as well
    base = base_cpu.to("phantom:0")
    dst = base[::2, 1::2]
    assert not dst.is_contiguous()
    dst.copy_(src_cpu.to(src_kind))
    expected = base_cpu.clone()
    expected[::2, 1::2].copy_(src_cpu)
    # Only the view's elements changed; the rest of the base is untouched.
    assert_equal(base.cpu(), expected)


def test_copy_into_transposed_phantom_destination():
    src = make((5, 3), torch.float32)
    dst = torch.zeros(3, 5, device="phantom").t()
    dst.copy_(src)
    assert_equal(dst.cpu(), src)
    assert_equal(dst.t().contiguous().cpu(), src.t().contiguous())


def test_copy_into_non_contiguous_cpu_destination():
    src_cpu = make((4, 5), torch.float32)
    x = src_cpu.to("phantom")
    dst = torch.zeros(5, 4).t()
    dst.copy_(x)
    assert_equal(dst, src_cpu)
    dst2 = torch.zeros(4, 10)[:, ::2]
    dst2.copy_(x)
    assert_equal(dst2, src_cpu)


@pytest.mark.parametrize("src_kind", ["cpu", "phantom:0", "phantom:1"])
def test_broadcasting_copy(src_kind, two_devices):
    row = make((1, 5), torch.float32)
    dst = torch.zeros(4, 5, device="phantom:0")
    dst.copy_(row.to(src_kind))
    assert_equal(dst.cpu(), row.expand(4, 5).contiguous())
    col = make((4, 1), torch.float32, seed=3)
    dst.copy_(col.to(src_kind).expand(4, 5))
    assert_equal(dst.cpu(), col.expand(4, 5).contiguous())


def test_expanded_phantom_source_to_host():
    v = make((5,), torch.float32)
    x = v.to("phantom").expand(3, 5)
    assert x.stride() == (0, 1)
    assert_equal(x.cpu(), v.expand(3, 5).contiguous())


def test_same_device_copy_between_views_of_one_storage():
    cpu = torch.arange(20.0)
    x = cpu.to("phantom")
    x[10:].copy_(x[:10])
    cpu[10:].copy_(cpu[:10])
    assert_equal(x.cpu(), cpu)
    m_cpu = torch.arange(16.0).reshape(4, 4)
    m = m_cpu.to("phantom")
    m[:2].copy_(m[2:].flip(0))
    m_cpu[:2].copy_(m_cpu[2:].flip(0))
    assert_equal(m.cpu(), m_cpu)


# --------------------------------------------------------------------------
# Special tensors
# --------------------------------------------------------------------------


def test_zero_dim_tensors(two_devices):
    s = torch.tensor(3.25)
    x = s.to("phantom")
    assert x.dim() == 0 and x.is_phantom
    assert_equal(x.cpu(), s)
    assert_equal(x.to("phantom:1").cpu(), s)
    assert_equal(x.to(torch.int64).cpu(), s.to(torch.int64))
    assert x.item() == 3.25


def test_empty_tensors(two_devices):
    for shape in [(0,), (3, 0), (0, 4, 5)]:
        cpu = torch.empty(shape)
        x = cpu.to("phantom")
        assert x.shape == cpu.shape and x.is_phantom
        assert x.cpu().shape == cpu.shape
        assert x.to("phantom:1").shape == cpu.shape
        assert x.to(torch.float64).cpu().shape == cpu.shape


CONJ_COPIES = {
    "h2d": "out = cpu.conj().to('phantom').cpu()",
    "d2h": "out = cpu.to('phantom').conj().cpu()",
    "d2h_into_existing": "out = torch.empty(3, 4, dtype=torch.complex64); out.copy_(cpu.to('phantom').conj())",
    "d2d": "dst = torch.empty(3, 4, dtype=torch.complex64, device='phantom'); "
    "dst.copy_(cpu.to('phantom').conj()); out = dst.cpu()",
    "cross_device": "out = cpu.to('phantom:0').conj().to('phantom:1').cpu()",
    "resolve_conj": "out = cpu.to('phantom').conj().resolve_conj().cpu()",
    "neg_view": "out = cpu.to('phantom').conj().imag.cpu(); expected = cpu.conj().imag.resolve_neg()",
}


CONJ_PRELUDE = """
g = torch.Generator().manual_seed(0)
cpu = torch.complex(torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g))
expected = cpu.conj().resolve_conj()
"""
CONJ_CHECK = "\ntorch.testing.assert_close(out.resolve_conj().resolve_neg(), expected, rtol=0, atol=0)\n"


@pytest.fixture(scope="module")
def conj_results():
    # Each case runs in its own process: a conjugate view reaching
    # _copy_from has crashed the process (unbounded recursion) instead of
    # raising, which would take the whole suite down.
    return run_cases_forked({k: v + CONJ_CHECK for k, v in CONJ_COPIES.items()}, CONJ_PRELUDE)


@pytest.mark.parametrize("case", CONJ_COPIES, ids=str)
def test_conj_and_neg_views(case, conj_results, two_devices):
    assert_case_passed(conj_results, case)


# --------------------------------------------------------------------------
# Pinned memory and non_blocking
# --------------------------------------------------------------------------


def test_pin_memory_and_is_pinned():
    cpu = torch.randn(100)
    assert not cpu.is_pinned()
    pinned = cpu.pin_memory()
    assert pinned.is_pinned()
    assert pinned.device.type == "cpu"
    assert_equal(pinned, cpu)
    also = torch.empty(10, pin_memory=True)
    assert also.is_pinned()


def test_non_blocking_host_to_device_from_pinned():
    cpu = torch.randn(1 << 16)
    pinned = cpu.pin_memory()
    x = torch.empty_like(cpu, device="phantom")
    x.copy_(pinned, non_blocking=True)
    torch.phantom.synchronize()
    assert_equal(x.cpu(), cpu)
    y = pinned.to("phantom", non_blocking=True)
    torch.phantom.synchronize()
    assert_equal(y.cpu(), cpu)


def test_non_blocking_device_to_pinned_host():
    cpu = torch.randn(1 << 16)
    x = cpu.to("phantom")
    dst = torch.empty(1 << 16).pin_memory()
    dst.copy_(x, non_blocking=True)
    torch.phantom.synchronize()
    assert_equal(dst, cpu)
    out = x.to("cpu", non_blocking=True)
    torch.phantom.synchronize()
    assert_equal(out, cpu)


def test_non_blocking_round_trip_source_freed_early():
    # The source of a non_blocking copy may be dropped by the caller right
    # after the call; the device must still receive the right bytes, even
    # when the host asks for a pinned block of that size again before the
    # copy has run (the stream is held, so it has not).
    expected = torch.randn(1 << 16)
    x = torch.empty(1 << 16, device="phantom")
    torch.phantom.synchronize()
    pinned = expected.pin_memory()
    stream = torch.phantom.current_stream()
    _C._sleep_on_stream(stream.device_index, stream.stream_id, 300)
    x.copy_(pinned, non_blocking=True)
    del pinned
    reused = torch.full((1 << 16,), -1.0).pin_memory()  # the freed block, if it were free
    assert not stream.query(), "the copy ran before the block could be reused"
    torch.phantom.synchronize()
    assert_equal(x.cpu(), expected)
    del reused


def test_blocking_copy_from_pinned_is_complete_on_return():
    cpu = torch.randn(1 << 16)
    pinned = cpu.pin_memory()
    x = torch.empty(1 << 16, device="phantom")
    x.copy_(pinned)  # blocking: host may overwrite the source at once
    pinned.zero_()
    assert_equal(x.cpu(), cpu)
