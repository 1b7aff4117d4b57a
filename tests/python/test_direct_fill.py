"""The direct fill of fill_ and zero_ (ops/Scalars.cpp): a dense tensor of
a common dtype, up to the CPU kernel's grain size, gets the value's bytes
written over its range of the storage on the worker, the value converted
on the host as the CPU's fill converts it. Every dtype it takes, values
that round, saturate, wrap or are not finite, dense layouts that are not
contiguous (permuted, offset into a larger storage), the bytes around the
range left alone, and the cases it leaves to the CPU kernel (strided
views with gaps, sizes past the grain, complex) must all give the CPU's
bits."""
import pytest
import torch

pytestmark = pytest.mark.requires_kernel_view(
    "the direct fill writes through the kernel view")

GRAIN = 32768  # at::internal::GRAIN_SIZE: above it the CPU kernel is used

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool]

VALUES = [0, 1, -1, 7, 0.5, -2.75, 1e-8, 65504.0, 1e5, float("inf"),
          float("-inf"), float("nan"), True]


def _same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.stride() == want.stride()
    if want.is_floating_point():
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        got, want = got[~nan], want[~nan]
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.element_size()]
        assert torch.equal(got.contiguous().view(bits), want.contiguous().view(bits))
    else:
        assert torch.equal(got, want)


def _fill_both(make, value):
    """make(device) -> (storage owner, view to fill); fills the view on
    both devices with `value` and returns the owners, or the CPU's error."""
    cpu_owner, cpu_view = make("cpu")
    dev_owner, dev_view = make("phantom")
    try:
        cpu_view.fill_(value)
    except (RuntimeError, OverflowError) as error:
        with pytest.raises(type(error)):
            dev_view.fill_(value)
        return None
    dev_view.fill_(value)
    return dev_owner.cpu(), cpu_owner


def _contiguous(dtype):
    def make(device):
        t = torch.full((37,), 3, dtype=dtype, device=device)
        return t, t
    return make


def _permuted(dtype):
    def make(device):
        t = torch.full((4, 5, 6), 3, dtype=dtype, device=device)
        return t, t.permute(2, 0, 1)
    return make


def _offset_inside_a_larger_storage(dtype):
    # The middle rows of a matrix: dense, starting past the storage's
    # first element, with bytes on both sides the fill must not touch.
    def make(device):
        t = torch.full((6, 8), 3, dtype=dtype, device=device)
        return t, t[2:4]
    return make


LAYOUTS = [_contiguous, _permuted, _offset_inside_a_larger_storage]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_value_gives_the_cpus_bits(dtype, layout):
    for value in VALUES:
        result = _fill_both(layout(dtype), value)
        if result is not None:
            _same_bits(*result)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_gives_the_cpus_bits_and_leaves_the_rest(dtype):
    result = _fill_both(_offset_inside_a_larger_storage(dtype), 0)
    got, want = result
    _same_bits(got, want)
    assert (got[:2] != 0).all() and (got[4:] != 0).all()
    t = torch.full((5, 3), 9, dtype=dtype, device="phantom").t()
    t.zero_()
    assert torch.equal(t.cpu(), torch.zeros(3, 5, dtype=dtype))


def test_minus_zero_keeps_its_sign_bit():
    t = torch.ones(16, device="phantom")
    t.fill_(-0.0)
    assert torch.equal(t.cpu().view(torch.int32), torch.full((16,), -0.0).view(torch.int32))


def test_a_value_that_does_not_fit_the_dtype_raises_the_cpus_error_at_the_call():
    t = torch.zeros(8, dtype=torch.int8, device="phantom")
    with pytest.raises(RuntimeError) as cpu_error:
        torch.zeros(8, dtype=torch.int8).fill_(300)
    with pytest.raises(RuntimeError) as error:
        t.fill_(300)
    assert str(error.value) == str(cpu_error.value)
    assert torch.equal(t.cpu(), torch.zeros(8, dtype=torch.int8))  # nothing written
    t.fill_(5)  # the stream goes on
    assert torch.equal(t.cpu(), torch.full((8,), 5, dtype=torch.int8))


@pytest.mark.parametrize("make", [
    # A view with gaps: only its elements, not its span, may be written.
    lambda d: (lambda t: (t, t[:, ::2]))(torch.full((4, 10), 3.0, device=d)),
    # Past the grain: the CPU kernel over aliases.
    lambda d: (lambda t: (t, t))(torch.full((GRAIN + 5,), 3.0, device=d)),
    # Complex: the CPU kernel over aliases.
    lambda d: (lambda t: (t, t))(torch.full((10,), 3 + 1j, device=d)),
    # Overlapping (expanded): the CPU refuses to write it.
    lambda d: (lambda t: (t, t.expand(4, 6)))(torch.full((6,), 3.0, device=d)),
], ids=["gaps", "past-the-grain", "complex", "overlapping"])
def test_layouts_the_direct_fill_does_not_take_still_give_the_cpus_result(make):
    for value in [0, 2.5]:
        result = _fill_both(make, value)
        if result is not None:
            _same_bits(*result)


def test_a_fill_queued_behind_other_work_is_ordered_on_its_stream():
    s = torch.phantom.Stream()
    t = torch.zeros(1000, device="phantom")
    s.wait_stream(torch.phantom.current_stream())
    with torch.phantom.stream(s):
        t.fill_(1.0)
        t.add_(1.0)
        t.fill_(7.0)
        t.mul_(2.0)
    s.synchronize()
    assert torch.equal(t.cpu(), torch.full((1000,), 14.0))
