"""What the driver reports about a device's state (torch.cuda's NVML calls):
memory in use, utilization, memory activity, and the sensors the fake
driver does not have.

Utilization is measured by the fake driver as the time its stream workers
spend running work (device/fake/activity.h). The tests keep a stream busy
with work of known length (a sleep queued on the stream, which takes that
long however loaded the machine is) or leave the device idle, over more
than one sample period (100 ms), and check the reading on each side of
50 %.
"""

import gc
import time

import pytest
import torch

MiB = 1 << 20


def busy_for(milliseconds, stream=None):
    """Queues work that keeps `stream` (the current stream) busy for
    `milliseconds`, and waits for it."""
    stream = stream or torch.phantom.current_stream()
    torch.phantom._C._sleep_on_stream(stream.device_index, stream.stream_id, milliseconds)
    stream.synchronize()


def test_device_memory_used_is_the_drivers_count():
    gc.collect()
    torch.phantom.synchronize()
    torch.phantom.empty_cache()
    used = torch.phantom.device_memory_used()
    free, total = torch.phantom.mem_get_info()
    assert used == total - free
    x = torch.empty(32 * MiB, dtype=torch.uint8, device="phantom")
    assert torch.phantom.device_memory_used() >= used + 32 * MiB
    del x
    torch.phantom.empty_cache()
    assert torch.phantom.device_memory_used() == used


NEEDS_TELEMETRY = pytest.mark.requires_fake_driver(
    "utilization, memory activity and sensors are the driver's telemetry "
    "(ph_device_get_telemetry), which the remote driver does not offer")


@NEEDS_TELEMETRY
def test_utilization_follows_the_work_on_the_devices_streams():
    torch.phantom.utilization()  # the first reading starts a period
    busy_for(300)
    assert torch.phantom.utilization() >= 50
    time.sleep(0.3)  # the device idles
    assert torch.phantom.utilization() < 50


@NEEDS_TELEMETRY
def test_utilization_counts_any_stream_and_only_its_device(two_devices):
    torch.phantom.utilization(0)
    torch.phantom.utilization(1)
    busy_for(300, torch.phantom.Stream(1, priority=-1))
    assert torch.phantom.utilization(1) >= 50
    assert torch.phantom.utilization(0) < 50


@NEEDS_TELEMETRY
def test_two_readings_in_a_row_cover_the_same_period():
    torch.phantom.utilization()
    busy_for(200)
    first = torch.phantom.utilization()
    second = torch.phantom.utilization()  # a moment later, same period
    assert first >= 50
    assert abs(first - second) <= 1


@NEEDS_TELEMETRY
@pytest.mark.requires_kernel_view(
    "a device-to-device copy is a compute task (the copy kernel) only over the kernel view; without one it is the driver's copy")
def test_memory_usage_follows_copies():
    source = torch.empty(64 * MiB, dtype=torch.uint8, device="phantom")
    target = torch.empty_like(source)
    torch.phantom.memory_usage()
    start = time.perf_counter()
    while time.perf_counter() - start < 0.3:
        target.copy_(source)  # 64 MiB: the copy kernel, a compute task
        torch.phantom.synchronize()
    compute = torch.phantom.utilization()
    host = torch.empty(64 * MiB, dtype=torch.uint8)
    torch.phantom.memory_usage()
    start = time.perf_counter()
    while time.perf_counter() - start < 0.3:
        host.copy_(source)  # device to host: the copy engine
    assert torch.phantom.memory_usage() >= 50
    assert compute >= 50
    del source, target


@NEEDS_TELEMETRY
@pytest.mark.parametrize("name, what", [
    ("temperature", "temperature"),
    ("power_draw", "power draw"),
    ("clock_rate", "clock rate"),
])
def test_sensors_the_fake_does_not_have_raise_saying_so(name, what):
    with pytest.raises(NotImplementedError,
                       match=f"phantom:0 cannot report its {what}: its driver has "
                             "no such sensor"):
        getattr(torch.phantom, name)()
    # A RuntimeError too, as torch.cuda's NVML errors are.
    with pytest.raises(RuntimeError):
        getattr(torch.phantom, name)(0)


def test_device_state_rejects_a_bad_device():
    count = torch.phantom.device_count()
    with pytest.raises(RuntimeError, match=f"device index {count}"):
        torch.phantom.utilization(count)
    with pytest.raises(RuntimeError, match=f"device index {count}"):
        torch.phantom.device_memory_used(count)
