"""torch.phantom.set_sync_debug_mode: every operation that makes the host
wait for the device warns ("warn") or raises ("error"), naming the
operation; queued work and explicit synchronization stay silent.

Each case runs the operation once with the mode at "warn" (one warning,
naming it), once at "error" (raised before anything ran), and the silent
ones are checked to give no warning at all.
"""

import warnings

import pytest
import torch
from torch_phantom.testing import faults


@pytest.fixture(autouse=True)
def _mode_back_to_default():
    yield
    torch.phantom.set_sync_debug_mode(0)


def sync_warnings(fn):
    """The sync-debug warnings `fn()` gives with the mode at "warn"."""
    torch.phantom.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    torch.phantom.set_sync_debug_mode("default")
    return [str(w.message) for w in caught
            if "made the host wait for the device" in str(w.message)]


def test_mode_is_set_by_name_or_number():
    assert torch.phantom.get_sync_debug_mode() == 0
    for name, number in (("warn", 1), ("error", 2), ("default", 0)):
        torch.phantom.set_sync_debug_mode(name)
        assert torch.phantom.get_sync_debug_mode() == number
        torch.phantom.set_sync_debug_mode(number)
        assert torch.phantom.get_sync_debug_mode() == number


def test_bad_modes_are_refused_and_change_nothing():
    with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
        torch.phantom.set_sync_debug_mode("loud")
    with pytest.raises(ValueError, match=r"invalid sync debug mode 3; expected 0"):
        torch.phantom.set_sync_debug_mode(3)
    with pytest.raises(TypeError, match="must be a str or an int"):
        torch.phantom.set_sync_debug_mode(1.5)
    assert torch.phantom.get_sync_debug_mode() == 0


x_host = torch.arange(6.0)

WAITS = {
    # name: (operation, text the message names)
    "item": (lambda x: x.sum().item(), "aten::_local_scalar_dense"),
    "bool": (lambda x: bool(x[0] == 0), "aten::_local_scalar_dense"),
    "cpu": (lambda x: x.cpu(), "aten::copy_ from phantom to host memory"),
    "tolist": (lambda x: x.tolist(), "aten::copy_ from phantom to host memory"),
    "nonzero": (lambda x: torch.nonzero(x), "aten::nonzero"),
    "masked_select": (lambda x: x[x > 2], "aten::"),
    "to_device": (lambda x: x_host.to("phantom"),
                  "aten::copy_ from host memory to phantom made the host wait for "
                  "the device: the source is pageable memory"),
}


@pytest.mark.parametrize("name", sorted(WAITS))
def test_each_wait_warns_once_naming_the_op(name):
    operation, text = WAITS[name]
    x = torch.arange(6.0, device="phantom")
    torch.phantom.synchronize()
    messages = sync_warnings(lambda: operation(x))
    assert messages, f"{name}: no warning"
    assert any(text in m for m in messages), messages


@pytest.mark.parametrize("name", sorted(WAITS))
def test_error_mode_raises_before_waiting(name):
    operation, text = WAITS[name]
    x = torch.arange(6.0, device="phantom")
    torch.phantom.synchronize()
    torch.phantom.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match="would make the host wait for the device"
                                           r".*set_sync_debug_mode\(\"error\"\) forbids"):
        operation(x)
    torch.phantom.set_sync_debug_mode("default")
    # The process goes on, and the operation works again.
    operation(x)


@pytest.mark.requires_kernel_view(
    "without a kernel view every op waits, for that reason")
def test_the_message_says_why_a_generic_op_waits():
    """The reason is the one torch_phantom.ops_report() gives."""
    import torch_phantom

    x = torch.arange(6.0, device="phantom")
    torch_phantom.reset_ops_report()
    (message,) = sync_warnings(lambda: torch.nonzero(x))
    (row,) = [row for row in torch_phantom.ops_report() if row["op"] == "aten::nonzero"]
    assert message.startswith("phantom: aten::nonzero made the host wait for the device: "
                              + row["sync_reason"] + ".")


def test_copies_between_devices_and_blocking_pinned_copies_warn(two_devices):
    x = torch.arange(6.0, device="phantom:0")
    pinned = torch.empty(6, pin_memory=True)
    assert sync_warnings(lambda: x.to("phantom:1"))[0].startswith(
        "phantom: aten::copy_ between two phantom devices")
    assert "non_blocking=False" in sync_warnings(lambda: pinned.copy_(x))[0]


@pytest.mark.requires_kernel_view(
    "without a kernel view every op waits, and says so")
def test_queued_work_and_explicit_synchronization_are_silent():
    x = torch.arange(6.0, device="phantom")
    pinned = torch.arange(6.0).pin_memory()
    stream = torch.phantom.Stream()
    event = torch.phantom.Event()

    def queued_only():
        y = (x * 2 + 1).relu().sum(0)  # native kernels and queued generic ops
        y.add_(torch.ones((), device="phantom"))
        x.clone()
        pinned.to("phantom", non_blocking=True)
        x.to(pinned.device).pin_memory()  # one real wait: counted below
        event.record()
        stream.wait_event(event)
        torch.phantom.synchronize()
        stream.synchronize()
        event.synchronize()

    messages = sync_warnings(queued_only)
    # Only the .to("cpu") above waits.
    assert len(messages) == 1 and "to host memory" in messages[0], messages


@pytest.mark.requires_kernel_view(
    "without a kernel view every op waits, for that reason")
def test_convolution_says_that_phantom_waits_where_a_device_kernel_would_not():
    x = torch.randn(1, 2, 5, 5, device="phantom")
    w = torch.randn(3, 2, 3, 3, device="phantom")
    (message,) = sync_warnings(lambda: torch.nn.functional.conv2d(x, w))
    assert "aten::convolution" in message and "a device kernel would be queued" in message


def test_error_mode_leaves_nothing_counted_or_queued():
    import torch_phantom

    x = torch.arange(6.0, device="phantom")
    torch.phantom.synchronize()
    torch_phantom.reset_ops_report()
    faults.reset()  # counts the kernels launched from here
    torch.phantom.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="aten::nonzero would make the host wait"):
            torch.nonzero(x)
        assert faults.kernel_count() == 0
    finally:
        torch.phantom.set_sync_debug_mode("default")
        faults.reset()
    assert not [row for row in torch_phantom.ops_report() if row["op"] == "aten::nonzero"]
    assert torch.equal(torch.nonzero(x).cpu(), torch.nonzero(x.cpu()))
