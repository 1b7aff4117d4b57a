"""``python -m torch_phantom``: what phantom is, how it is set up, and whether
it works here.

In the spirit of ``python -m torch.utils.collect_env``, for a bug report or
a first check of a new machine or driver. It prints, in order:

- versions: Python, torch, torch_phantom, the HAL ABI the driver was built
  for next to the one the runtime needs, and the driver library;
- devices and their properties, as the driver reports them;
- settings: every PHANTOM_* variable phantom reads, with the value in force
  (or its default) and, where the runtime holds it, the parsed value; any
  other PHANTOM_* variable is flagged as unknown (a typo is otherwise
  silently ignored);
- a self-test of a few seconds on each device: an allocation round trip,
  copies each way (pageable and pinned) and between devices, an op on the
  default stream and one on a side stream ordered behind a slow kernel, an
  event timing, and one training step compared with the CPU;
- the ops report of the self-test: which ops took native kernels, which the
  generic path queued, and which made the host wait, and why.

Each check runs even if an earlier one failed, and ends by synchronizing its
device, so a queued failure is charged to the check that caused it. The exit
status is 1 if any check failed (no device counts as a failure), else 0.
"""

import os
import platform
import sys
import time
from typing import Callable, List, Optional, Tuple

import torch

import torch_phantom
from torch_phantom import _C, _settings
from torch_phantom import device_module as _dm  # torch.<name>
from torch_phantom._name import BACKEND_NAME

def _size(nbytes: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _versions(hal: dict) -> List[Tuple[str, str]]:
    abi = f"driver {hal['abi_version']}, runtime {hal['runtime_abi_version']}"
    if hal["abi_version"] // 1000 != hal["runtime_abi_version"] // 1000:
        abi += "  (MISMATCH: the runtime refuses this driver)"
    library = hal["driver_library"]
    return [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("torch", f"{torch.__version__} ({os.path.dirname(torch.__file__)})"),
        ("torch_phantom", f"{torch_phantom.__version__} ({os.path.dirname(torch_phantom.__file__)})"),
        ("HAL ABI", abi),
        ("driver", f"{os.path.basename(library)} ({library})" if library else "(unknown)"),
    ]


def _device_lines(hal: dict) -> List[str]:
    if not hal["devices"]:
        return [f"none: {_dm._no_device_reason()}"]
    lines = []
    for index, props in enumerate(hal["devices"]):
        free, _ = _dm.mem_get_info(index)
        lines.append(
            f"{BACKEND_NAME}:{index}  {props['name']}: {_size(props['total_memory'])} "
            f"({_size(free)} free), {props['multi_processor_count']} compute units, "
            f"stream priorities {props['stream_priority_high']} (high) to "
            f"{props['stream_priority_low']} (low)")
    return lines


def _parsed(name: str, hal: dict) -> str:
    """The value the runtime holds for `name`, where it holds one."""
    if name == "PHANTOM_DEVICE_COUNT":
        return f"{_C._device_count()} devices"
    if name == "PHANTOM_DEVICE_MEMORY" and hal["devices"]:
        return _size(hal["devices"][0]["total_memory"]) + " per device"
    if name == "PHANTOM_ALLOC_CONF":
        conf = _C._check_allocator_settings()
        split = conf["max_split_size"]
        return (f"max_split_size={'none' if split is None else _size(split)}, "
                f"garbage_collection_threshold={conf['garbage_collection_threshold']}")
    return ""


def _setting_lines(hal: dict) -> List[str]:
    """Every setting in phantom's one catalogue (torch_phantom._settings),
    then torch's autoload switch, then any PHANTOM_* variable phantom does
    not read (a typo is otherwise silently ignored)."""
    lines = []
    catalogue = _settings.catalogue()
    for spec in catalogue:
        name = spec["name"]
        value = os.environ.get(name)
        shown = f"{value!r} (set)" if value is not None else f"default {spec['default']}"
        parsed = _parsed(name, hal)
        lines.append(f"{name:<30} {shown:<20} {spec['meaning']}"
                     + (f"; in force: {parsed}" if parsed else ""))
    autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    lines.append(f"{'TORCH_DEVICE_BACKEND_AUTOLOAD':<30} "
                 f"{(repr(autoload) + ' (set)') if autoload is not None else 'default 1':<20} "
                 f"0 stops `import torch` from loading {BACKEND_NAME}")
    known = {spec["name"] for spec in catalogue}
    for name in sorted(os.environ):
        if name.startswith("PHANTOM_") and name not in known:
            lines.append(f"{name:<30} {os.environ[name]!r:<20} UNKNOWN: {BACKEND_NAME} does not read "
                         f"it (a typo?)")
    return lines


# --- Self-test ---------------------------------------------------------------

def _check_allocation(device: torch.device) -> str:
    before = _dm.memory_allocated(device)
    block = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    during = _dm.memory_allocated(device)
    del block
    after = _dm.memory_allocated(device)
    assert during >= before + (1 << 20), f"allocated bytes went from {before} to {during}"
    assert after == before, f"allocated bytes are {after} after the free, {before} before"
    return "1 MiB allocated and freed"


def _check_copies(device: torch.device) -> str:
    host = torch.arange(1 << 16, dtype=torch.float32)
    on_device = host.to(device)
    assert torch.equal(on_device.cpu(), host), "pageable host -> device -> host changed the data"
    pinned = host.pin_memory()
    from_pinned = pinned.to(device, non_blocking=True)
    back = torch.empty_like(pinned).pin_memory()
    back.copy_(from_pinned, non_blocking=True)
    _dm.synchronize(device)
    assert torch.equal(back, host), "pinned host -> device -> host changed the data"
    assert torch.equal(on_device.clone().cpu(), host), "a copy on the device changed the data"
    done = "pageable and pinned, each way, and on the device"
    if _dm.device_count() > 1:
        other = torch.device(BACKEND_NAME, (device.index + 1) % _dm.device_count())
        assert torch.equal(on_device.to(other).cpu(), host), f"{device} -> {other} changed the data"
        done += f", and {device} -> {other}"
    return done


def _operands() -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 64, generator=g), torch.randn(64, generator=g)


def _check_default_stream(device: torch.device) -> str:
    a, b = _operands()
    got = torch.addmm(b.to(device), a.to(device), a.to(device)).relu()
    assert torch.equal(got.cpu(), torch.addmm(b, a, a).relu()), "addmm + relu differ from the CPU"
    return "addmm + relu match the CPU bit for bit"


def _check_side_stream(device: torch.device) -> str:
    a, _ = _operands()
    x = a.to(device)
    side = _dm.Stream(device=device)
    side.wait_stream(_dm.current_stream(device))
    # A slow kernel first: the result is right only if the host and the
    # default stream really wait for the side stream.
    _C._sleep_on_stream(device.index, side.stream_id, 20.0)
    with _dm.stream(side):
        y = x * 3 + 2
    _dm.current_stream(device).wait_stream(side)
    assert torch.equal(y.cpu(), a * 3 + 2), "a side stream's result differs from the CPU's"
    return "mul + add behind a 20 ms kernel, read after wait_stream"


def _check_event_timing(device: torch.device) -> str:
    start = _dm.Event(enable_timing=True)
    end = _dm.Event(enable_timing=True)
    stream = _dm.current_stream(device)
    start.record(stream)
    _C._sleep_on_stream(device.index, stream.stream_id, 10.0)
    end.record(stream)
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert 10.0 <= elapsed < 10_000.0, f"a 10 ms kernel timed at {elapsed} ms"
    return f"a 10 ms kernel timed at {elapsed:.1f} ms"


def _check_training_step(device: torch.device) -> str:
    def train(on):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4)).to(on)
        params = list(model.parameters())
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x.to(on)), y.to(on)).backward()
            with torch.no_grad():
                # SGD's update as torch.optim's foreach path makes it (the
                # first torch.optim step costs seconds of imports).
                torch._foreach_add_(params, [p.grad for p in params], alpha=-0.1)
            model.zero_grad()
        return [p.detach().cpu() for p in params]

    expected = train("cpu")
    assert all(torch.equal(p, e) for p, e in zip(train(device), expected)), \
        "parameters after two SGD steps differ from the CPU's"
    return "two SGD steps of an MLP match the CPU bit for bit"


_CHECKS: Tuple[Tuple[str, Callable[[torch.device], str]], ...] = (
    ("allocation round trip", _check_allocation),
    ("copies", _check_copies),
    ("op on the default stream", _check_default_stream),
    ("op on a side stream", _check_side_stream),
    ("event timing", _check_event_timing),
    ("training step", _check_training_step),
)


def _run_check(name: str, check: Callable[[torch.device], str],
               device: Optional[torch.device]) -> Tuple[bool, str]:
    began = time.perf_counter()
    try:
        detail = check(device)
        if device is not None:
            _dm.synchronize(device)  # a queued failure is this check's
        ok = True
    except Exception as error:  # report it and go on with the other checks
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        detail = f"{type(error).__name__}: {first}"
        ok = False
    ms = (time.perf_counter() - began) * 1000
    label = f"{device}: {name}" if device is not None else name
    print(f"  {'ok  ' if ok else 'FAIL'}  {label:<40} {ms:7.1f} ms  {detail}")
    return ok, label


def _self_test() -> List[str]:
    """Runs every check; returns the labels of those that failed."""
    failed = []

    def available(_device):
        count = _dm.device_count()
        if count == 0:
            raise RuntimeError(f"no {BACKEND_NAME} devices: {_dm._no_device_reason()}")
        return f"{count} device(s)"

    ok, label = _run_check(f"a {BACKEND_NAME} device is available", available, None)
    if not ok:
        return [label]
    for index in range(_dm.device_count()):
        device = torch.device(BACKEND_NAME, index)
        with _dm.device(device):
            for name, check in _CHECKS:
                if name == "training step" and index != 0:
                    continue  # once is enough: it feeds the ops report
                ok, label = _run_check(name, check, device)
                if not ok:
                    failed.append(label)
    return failed


def _ops_report_lines() -> List[str]:
    rows = torch_phantom.ops_report()
    lines = [f"{'op':<44} {'native':>6} {'queued':>6} {'waited':>6}  why it waited"]
    for row in sorted(rows, key=lambda r: (-r["native"], -r["async"], r["op"])):
        lines.append(f"{row['op']:<44} {row['native']:>6} {row['async']:>6} {row['sync']:>6}  "
                     f"{row['sync_reason']}")
    native = sum(1 for r in rows if r["native"])
    lines.append(f"{native} of {len(rows)} ops took native kernels; the others took the "
                 f"generic path (factories, copies and views are not listed)")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv:
        print(f"python -m torch_phantom takes no arguments (got {' '.join(argv)}); "
              f"--help says what it prints", file=sys.stderr)
        return 2
    hal = _C._hal_info()
    print("Phantom diagnostics (python -m torch_phantom)\n\nVersions")
    for key, value in _versions(hal):
        print(f"  {key:<14} {value}")
    print(f"\nDevices ({len(hal['devices'])})")
    for line in _device_lines(hal):
        print("  " + line)
    print("\nSettings (read once, at start-up)")
    for line in _setting_lines(hal):
        print("  " + line)
    print("\nSelf-test")
    torch_phantom.reset_ops_report()
    began = time.perf_counter()
    failed = _self_test()
    seconds = time.perf_counter() - began
    if _dm.device_count():
        print("\nOps report of the self-test (torch_phantom.ops_report())")
        for line in _ops_report_lines():
            print("  " + line)
    print()
    if failed:
        print(f"{BACKEND_NAME} self-test FAILED ({seconds:.1f} s): {', '.join(failed)}")
        return 1
    print(f"{BACKEND_NAME} self-test: all checks passed ({seconds:.1f} s)")
    return 0
