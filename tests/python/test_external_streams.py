"""Driver streams created outside torch, used as torch streams
(torch.phantom.ExternalStream, get_stream_from_external).

Another library that drives the device itself creates its stream with the
HAL (ph_stream_create); the tests do the same through ctypes, on the
driver library torch_phantom loaded, and check that torch's work on the
wrapped stream runs in that stream's order, that torch waits for it where
it waits for its own streams, and that bad handles are refused clearly.
"""

import ctypes

import pytest
import torch
import torch_phantom
from torch_phantom.testing import faults

_loaded_driver = None


def driver_library():
    """The driver library torch_phantom loaded (the same handle, so the same
    device), opened on first use."""
    global _loaded_driver
    if _loaded_driver is None:
        _loaded_driver = ctypes.CDLL(torch_phantom._C._hal_info()["driver_library"])
        _loaded_driver.ph_last_error_message.restype = ctypes.c_char_p
    return _loaded_driver


class DriverStream:
    """A stream made with ph_stream_create, destroyed on close()."""

    def __init__(self, device=0):
        handle = ctypes.c_void_p()
        status = driver_library().ph_stream_create(device, 0, ctypes.byref(handle))
        assert status == 0, driver_library().ph_last_error_message()
        self.handle = handle.value

    def query(self):
        return driver_library().ph_stream_query(ctypes.c_void_p(self.handle))

    def close(self):
        assert driver_library().ph_stream_destroy(ctypes.c_void_p(self.handle)) == 0


@pytest.fixture
def driver_stream():
    stream = DriverStream()
    yield stream
    torch.phantom.synchronize()
    stream.close()


@pytest.mark.requires_kernel_view("checks that an op's kernel is queued on the external stream")
def test_torch_work_runs_on_the_external_stream(driver_stream):
    stream = torch.phantom.ExternalStream(driver_stream.handle)
    assert isinstance(stream, torch.phantom.Stream)
    assert stream.device == torch.device("phantom:0")
    assert stream.native_handle == driver_stream.handle
    # Held busy by "the other library's" work, queued on the driver stream.
    torch.phantom._C._sleep_on_stream(0, stream.stream_id, 200)
    with torch.phantom.stream(stream):
        assert torch.phantom.current_stream() == stream
        x = torch.arange(4.0, device="phantom") * 3
    assert driver_stream.query() == 1  # PH_NOT_READY: torch's work queued behind
    stream.synchronize()
    assert driver_stream.query() == 0
    torch.phantom.current_stream().wait_stream(stream)
    assert x.tolist() == [0.0, 3.0, 6.0, 9.0]


def test_the_same_handle_is_the_same_stream(driver_stream):
    a = torch.phantom.ExternalStream(driver_stream.handle)
    b = torch.phantom.get_stream_from_external(driver_stream.handle)
    assert a == b and hash(a) == hash(b)
    assert type(b) is torch.phantom.Stream
    assert torch.Stream(stream_id=a.stream_id, device_index=0, device_type=a.device_type) == a
    # A handle of one of torch's own streams is that stream.
    own = torch.phantom.Stream()
    assert torch.phantom.get_stream_from_external(own.native_handle) == own


def test_device_synchronize_waits_for_external_streams(driver_stream):
    stream = torch.phantom.get_stream_from_external(driver_stream.handle)
    torch.phantom._C._sleep_on_stream(0, stream.stream_id, 200)
    assert not stream.query()
    torch.phantom.synchronize()
    assert stream.query()


def test_memory_allocated_on_an_external_stream_is_reused_on_it(driver_stream):
    stream = torch.phantom.ExternalStream(driver_stream.handle)
    with torch.phantom.stream(stream):
        x = torch.empty(1 << 20, dtype=torch.uint8, device="phantom")
        address = x.data_ptr()
        del x
        y = torch.empty(1 << 20, dtype=torch.uint8, device="phantom")
        assert y.data_ptr() == address  # the block stayed with its stream
    segments = [s for s in torch.phantom.memory_snapshot()
                if any(b["address"] == address for b in s["blocks"])]
    assert segments[0]["stream"] == stream.stream_id
    del y


def test_external_streams_of_the_second_device(two_devices):
    other = DriverStream(device=1)
    try:
        stream = torch.phantom.ExternalStream(other.handle)
        assert stream.device == torch.device("phantom:1")
        assert torch.phantom.ExternalStream(other.handle, device="phantom:1") == stream
        with pytest.raises(RuntimeError, match=r"belongs to phantom:1, not phantom:0; "
                                               r"pass device=1 or leave device unset"):
            torch.phantom.ExternalStream(other.handle, device=0)
    finally:
        torch.phantom.synchronize(1)
        other.close()


def test_bad_handles_are_refused_clearly():
    with pytest.raises(RuntimeError, match="0x3039 is not a live phantom driver stream"):
        torch.phantom.ExternalStream(12345)
    with pytest.raises(RuntimeError, match="must not be null"):
        torch.phantom.get_stream_from_external(0)
    with pytest.raises(TypeError, match="as an int, got str"):
        torch.phantom.ExternalStream("0x15")
    gone = DriverStream()
    gone.close()
    with pytest.raises(RuntimeError, match="is not a live phantom driver stream"):
        torch.phantom.ExternalStream(gone.handle)


def test_a_forged_stream_id_is_refused():
    with pytest.raises(RuntimeError, match="not an external stream of phantom:0"):
        torch.Stream(stream_id=-12345, device_index=0, device_type=20).query()


@pytest.mark.requires_kernel_view(
    "without a kernel view the op runs at the call on host copies, so its error is raised there, not by a later sync")
def test_a_failure_on_an_external_stream_is_reported_and_the_stream_kept():
    owned = DriverStream()
    stream = torch.phantom.ExternalStream(owned.handle)
    with faults.inject(kernel=1):
        with torch.phantom.stream(stream):
            torch.empty(4, device="phantom").fill_(1)  # one kernel: it fails
    with pytest.raises(torch.AcceleratorError, match="injected"):
        stream.synchronize()
    # Not torch's to replace: the owner's stream keeps its error, and every
    # sync reports it, until the owner destroys it.
    assert owned.query() == 6  # PH_ERROR_DEVICE
    assert stream.native_handle == owned.handle
    with pytest.raises(torch.AcceleratorError, match="injected"):
        torch.phantom.synchronize()
    owned.close()
    torch.phantom.synchronize()  # a destroyed external stream is skipped
