"""torch.compile on phantom (docs/compile.md).

Dynamo's device interface and Inductor's backend for phantom: compiled
functions give the CPU's results, their kernels run as device work on the
current stream (queued, never waited for), and what torch.compile offers
(graph breaks, dynamic shapes, recompiles, autograd, modules, optimizers,
autocast, streams and events, max-autotune) works. Registration is lazy:
``import torch_phantom`` imports nothing of torch.compile.

The example models, compiled, are in test_compile_models.py.
"""

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch._inductor.config
import torch_phantom
from torch._inductor.utils import run_and_get_code

from conftest import run_python, slow_kernel_on

pytestmark = pytest.mark.requires_kernel_view("torch.compile's kernels run over the kernel view")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch, in this process (Inductor's worker
    pool would only compete for the cores)."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(compile_threads=1):
        yield
    torch._dynamo.reset()


def _phantom(t):
    return t.to("phantom")


def _close(actual, expected, **tolerances):
    torch.testing.assert_close(actual.cpu(), expected, **tolerances)


def _pointwise(x, y):
    return (torch.nn.functional.gelu(x) * y + 1).sum(0)


# --- registration -----------------------------------------------------------


def test_is_compile_supported():
    from torch._dynamo.utils import is_compile_supported

    assert is_compile_supported("phantom")
    assert is_compile_supported(torch.device("phantom:1"))
    assert is_compile_supported("cpu")  # other devices keep torch's answer
    assert not is_compile_supported("meta")


def test_device_interface_is_registered():
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device("phantom")
    assert get_interface_for_device(torch.device("phantom:1")) is interface
    assert get_interface_for_device("phantom:1") is interface
    assert interface.device_count() == torch.phantom.device_count()
    assert interface.is_available()
    props = interface.get_device_properties("phantom:0")
    assert props.multi_processor_count >= 1 and props.total_memory > 0
    assert interface.Worker.get_device_properties(0) == props
    # Compile workers answer from what the parent recorded.
    from torch._dynamo import device_interface

    interface.Worker.set_device(1)
    try:
        assert interface.Worker.current_device() == 1
    finally:
        device_interface.caching_worker_current_devices.pop("phantom")
    assert interface.Worker.current_device() == torch.phantom.current_device()
    assert interface.is_bf16_supported() and interface.is_dtype_supported(torch.float64)
    assert not interface.is_triton_capable()
    with pytest.raises(RuntimeError, match="C\\+\\+ backend"):
        interface.raise_if_triton_unavailable()


def test_device_interface_drives_devices_and_streams():
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device("phantom")
    assert interface.exchange_device(1) == 0
    assert interface.current_device() == 1
    assert interface.maybe_exchange_device(0) == 1
    side = interface.Stream()
    assert isinstance(side, torch.Stream)
    with interface.stream(side):
        assert interface.current_stream() == side
        assert interface.get_raw_stream(0) != get_raw_default_stream()
    interface._set_stream_by_id(side.stream_id, side.device_index, side.device_type)
    assert interface.current_stream() == side
    interface.set_stream(torch.phantom.default_stream())
    assert interface.get_raw_stream(0) == get_raw_default_stream()
    event = interface.Event()
    event.record()
    interface.synchronize()
    assert event.query()
    before = interface.memory_allocated()
    keep = torch.empty(1 << 20, device="phantom")
    assert interface.memory_allocated() >= before + keep.numel() * 4


def get_raw_stream_of(stream):
    from torch._dynamo.device_interface import get_interface_for_device

    with torch.phantom.stream(stream):
        return get_interface_for_device("phantom").get_raw_stream(stream.device_index)


def get_raw_default_stream():
    return get_raw_stream_of(torch.phantom.default_stream())


def test_nothing_of_torch_compile_is_imported_until_used():
    """``import torch`` (which autoloads phantom) imports neither Dynamo nor
    Inductor; importing Dynamo registers phantom, whichever came first."""
    result = run_python(
        "import sys, torch\n"
        "assert 'torch_phantom' in sys.modules\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor')))\n"
        "assert not loaded, loaded\n"
        "import torch._dynamo\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "from torch._dynamo.utils import is_compile_supported\n"
        "print(get_interface_for_device('phantom').__name__, is_compile_supported('phantom'))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["PhantomInterface", "True"]


def test_registration_when_torch_compile_was_imported_first():
    result = run_python(
        "import torch, torch._dynamo, torch._inductor.codegen.wrapper\n"
        "import torch._inductor.codegen.cpp\n"
        "import torch_phantom\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "from torch._inductor.codegen.common import get_scheduling_for_device\n"
        "print(get_interface_for_device('phantom').__name__,\n"
        "      get_scheduling_for_device('phantom').__name__)\n",
        extra_env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["PhantomInterface", "PhantomCppScheduling"]


# --- kernels as device work ---------------------------------------------------


def test_compiled_function_matches_the_cpu_and_runs_phantom_kernels():
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    compiled = torch.compile(_pointwise)
    result, (code,) = run_and_get_code(compiled, _phantom(x), _phantom(y))
    assert result.device.type == "phantom"
    _close(result, _pointwise(x, y))
    # One fused C++ kernel, allocated and called as phantom's backend does.
    assert "cpp_fused_" in code and "empty_strided_phantom(" in code
    assert "PhantomAsyncCompile()" in code


def test_kernels_are_queued_not_waited_for():
    x, y = torch.randn(1000, 16), torch.randn(1000, 16)
    compiled = torch.compile(_pointwise)
    px, py = _phantom(x), _phantom(y)
    compiled(px, py)  # compiles
    torch.phantom.synchronize()
    stream = torch.phantom.current_stream()
    slow_kernel_on(stream, microseconds=400_000)
    result = compiled(px, py)
    # The call returned while its kernels wait behind the slow one.
    assert not stream.query()
    _close(result, _pointwise(x, y))


def test_kernels_run_on_the_current_stream():
    """Called under a side stream, the compiled kernels run there: a copy
    ordered after that stream's work sees their result, while the default
    stream is still busy (nothing waited for it)."""
    x, y = torch.randn(1000, 16), torch.randn(1000, 16)
    compiled = torch.compile(_pointwise)
    px, py = _phantom(x), _phantom(y)
    compiled(px, py)
    torch.phantom.synchronize()
    side = torch.phantom.Stream()
    slow_kernel_on(torch.phantom.default_stream(), microseconds=400_000)
    with torch.phantom.stream(side):
        result = compiled(px, py).cpu()
    assert not torch.phantom.default_stream().query()
    torch.testing.assert_close(result, _pointwise(x, y))


def test_a_kernel_error_is_a_device_error_reported_at_the_next_sync():
    """Integer division by zero raises at the call on the CPU; on phantom
    the kernel fails on the stream, and the next sync reports it naming
    the kernel. The process and the stream go on."""
    floor_div = torch.compile(lambda a, b: a // b + 1)
    a, b = torch.tensor([4, 5, 6]), torch.tensor([2, 0, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        floor_div(a, b)
    floor_div(a.to("phantom"), b.to("phantom"))  # queued, no error yet
    with pytest.raises(torch.AcceleratorError,
                       match="work 'cpp_fused_.*floor_divide.*' failed.*ZeroDivisionError"):
        torch.phantom.synchronize()
    _close(floor_div(a.to("phantom"), b.to("phantom") + 1), a // (b + 1) + 1)


def test_a_cpu_scalar_tensor_is_read_by_value_at_the_call():
    """Inductor reads 0-dim CPU tensors inside device kernels (an
    optimizer's step count): the value at the call is what the kernel
    uses, even if the CPU tensor changes before the kernel runs."""
    scale = torch.tensor(3.0)
    compiled = torch.compile(lambda x, s: x * s + 1)
    x = torch.randn(256)
    px = _phantom(x)
    compiled(px, scale)
    torch.phantom.synchronize()
    slow_kernel_on(torch.phantom.current_stream(), microseconds=200_000)
    result = compiled(px, scale)
    scale.fill_(100.0)
    _close(result, x * 3 + 1)


def test_the_launcher_refuses_wrong_arguments_clearly():
    """A compiled kernel's launcher (what the generated code calls) checks
    what it is given before queueing anything."""
    from torch._inductor.codecache import PyCodeCache

    from torch_phantom import _C

    compiled = torch.compile(lambda x: x.sin() + 1)
    x = torch.randn(16, device="phantom")
    _, (code,) = run_and_get_code(compiled, x)
    name = "cpp_fused_" + code.split("cpp_fused_")[1].split(" ")[0]
    kernel = next(getattr(module, name) for module in PyCodeCache.modules
                  if isinstance(getattr(module, name, None), _C._CompiledKernel))
    out = torch.empty(16, device="phantom")
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        kernel(x)
    with pytest.raises(TypeError, match="argument 1 must be a tensor, got int"):
        kernel(x, 3)
    with pytest.raises(ValueError, match="argument 1 is a tensor on cpu, but the kernel runs on phantom:0"):
        kernel(x, torch.empty(16))
    with pytest.raises(ValueError, match="argument 1 is a tensor on phantom:1, but the kernel runs on phantom:0"):
        kernel(x, torch.empty(16, device="phantom:1"))
    kernel(x, out)  # and it still works
    _close(out, x.cpu().sin() + 1)


def _kernel_sources(code):
    """The C++ of each kernel in generated wrapper code, without phantom's
    trampoline and its preamble."""
    import re

    from torch_phantom._inductor_backend import ENTRY_MARK, _PREAMBLE

    sources = re.findall(r"cpp_pybinding\(\[.*?\], r\'\'\'(.*?)\'\'\'\)", code, re.DOTALL)
    return sorted(source.replace(_PREAMBLE, "").split(ENTRY_MARK)[0].strip()
                  for source in sources)


@pytest.mark.parametrize("name", ["softmax_times_mean", "max_pool_padded", "reused_heavy"])
def test_phantom_kernels_are_the_cpus_kernels(name, request):
    """Inductor generates phantom's kernels as the C++ backend's, under its
    rules (not Triton's): the same kernels as for the CPU, fused the same
    way. Without that, a softmax times a mean fails to compile (loop
    reindexing), max_pool2d's padding fails (the CSE takes masked loads for
    Triton's), and a reused expensive result is recomputed rather than
    stored."""
    functions = {
        "softmax_times_mean": lambda x: torch.nn.functional.softmax(x, -1) * x.mean(),
        "max_pool_padded": lambda x: torch.nn.functional.max_pool2d(x[None, None], 3, 2, 1),
        "reused_heavy": lambda x: [(y := x.exp().log1p().sin()).sum(0), y.sum(1)],
    }
    fn = functions[name]
    x = torch.randn(16, 16)
    # Generated now, not from Inductor's cache of an earlier run.
    cache_off = torch._inductor.config.patch(fx_graph_cache=False)
    cache_off.__enter__()
    request.addfinalizer(lambda: cache_off.__exit__(None, None, None))
    expected, (cpu_code,) = run_and_get_code(torch.compile(fn), x)
    torch._dynamo.reset()
    result, (phantom_code,) = run_and_get_code(torch.compile(fn), _phantom(x))
    torch.testing.assert_close([t.cpu() for t in result] if isinstance(result, list)
                               else result.cpu(), expected)
    assert _kernel_sources(phantom_code) == _kernel_sources(cpu_code)
    assert len(_kernel_sources(cpu_code)) >= 1


def test_inductors_cache_key_covers_phantoms_code_generator(tmp_path, monkeypatch):
    """Phantom's backend registers a pass whose uuid (part of the key of
    Inductor's FX graph cache) hashes phantom's code generator: code
    generated by another version of it is never taken from the cache."""
    from torch._inductor.codegen.common import custom_backend_passes

    from torch_phantom import _inductor_backend

    identity = custom_backend_passes["phantom"]
    assert isinstance(identity, _inductor_backend.PhantomCodegenIdentity)
    assert identity.uuid() == identity.uuid()

    def uuid_of(version):
        folder = tmp_path / version
        folder.mkdir()
        for name in _inductor_backend.PhantomCodegenIdentity.FILES:
            (folder / name).write_text(version if name == "_inductor_kernels.py" else "")
        monkeypatch.setattr(_inductor_backend, "__file__", str(folder / "_inductor_backend.py"))
        return _inductor_backend.PhantomCodegenIdentity().uuid()

    assert uuid_of("one version") != uuid_of("another version")


def test_convolution_strides_are_what_fake_tensors_say():
    """Compiled code asserts that an extern kernel's output has the strides
    its fake tensor had when traced. For a phantom convolution that is
    ATen's rule for a PrivateUse1 device (contiguous), also for a
    channels-last input, whose format the CPU's kernel would keep."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last)
    px, pw = _phantom(x).requires_grad_(), _phantom(w).requires_grad_()
    out = torch.nn.functional.conv2d(px, pw, padding=1)
    grad_x, grad_w = torch.autograd.grad(out.sum(), (px, pw))
    mode = FakeTensorMode()
    fx, fw = mode.from_tensor(px), mode.from_tensor(pw)
    with mode:
        fake_out = torch.nn.functional.conv2d(fx, fw, padding=1)
        fake_grads = torch.ops.aten.convolution_backward(
            torch.ones_like(fake_out), fx, fw, None, [1, 1], [1, 1], [1, 1], False,
            [0, 0], 1, [True, True, False])
    assert out.stride() == fake_out.stride()
    assert (grad_x.stride(), grad_w.stride()) == (fake_grads[0].stride(), fake_grads[1].stride())
    compiled = torch.compile(lambda a, b: torch.nn.functional.conv2d(a, b, padding=1).relu())
    _close(compiled(_phantom(x), _phantom(w)),
           torch.nn.functional.conv2d(x, w, padding=1).relu(), rtol=1e-5, atol=1e-5)


def test_kernels_are_generated_for_the_current_thread_count():
    """Inductor's C++ kernels are generated for torch.get_num_threads()
    (per-thread accumulators, the summation's structure), and a new count
    recompiles. The kernel generated for 1 thread must not come from the
    cache of the one generated for 2: the sum then matches the CPU's bit
    for bit under both counts."""
    torch.manual_seed(4)
    x = torch.randn(4_000_000)
    compiled = torch.compile(lambda t: (t * 1.5).sum())
    threads = torch.get_num_threads()
    try:
        for count in (2, 1):
            torch.set_num_threads(count)
            assert torch.equal(compiled(_phantom(x)).cpu(), compiled(x)), count
    finally:
        torch.set_num_threads(threads)


def test_second_device():
    x = torch.randn(8, 5)
    compiled = torch.compile(lambda t: (t.sin() * 3).sum(1))
    result = compiled(x.to("phantom:1"))
    assert result.device == torch.device("phantom:1")
    _close(result, (x.sin() * 3).sum(1))


# --- what torch.compile offers ----------------------------------------------


def test_fullgraph():
    def softmax_times_mean(x):
        return torch.nn.functional.softmax(x, -1) * x.mean()

    x = torch.randn(6, 7)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(softmax_times_mean, backend=counter, fullgraph=True)
    _close(compiled(_phantom(x)), softmax_times_mean(x))
    assert counter.frame_count == 1


def test_graph_break():
    def with_break(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos() + 1

    x = torch.randn(10)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    _close(torch.compile(with_break, backend=counter)(_phantom(x)), with_break(x))
    assert counter.frame_count == 2


def test_dynamic_shapes_compile_once():
    def fn(x):
        return (x * 2).relu().sum(0)

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    for rows in (5, 7, 9):
        x = torch.randn(rows, 3)
        _close(compiled(_phantom(x)), fn(x))
    assert counter.frame_count == 1


def test_automatic_dynamic_and_recompiles():
    def fn(x):
        return (x * 2).tanh() + x.sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter)
    for n in (5, 7, 9, 11):
        x = torch.randn(n)
        _close(compiled(_phantom(x)), fn(x))
    # Static first, then one dynamic recompile that serves every later size.
    assert counter.frame_count == 2
    static_counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    static = torch.compile(fn, backend=static_counter, dynamic=False)
    for n in (5, 7):
        x = torch.randn(n)
        _close(static(_phantom(x)), fn(x))
    assert static_counter.frame_count == 2  # a recompile per new shape


def test_autograd_forward_and_backward():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    phantom = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    phantom.load_state_dict(cpu.state_dict())
    phantom.to("phantom")
    compiled = torch.compile(phantom)
    x = torch.randn(5, 8)
    expected = cpu(x).pow(2).sum()
    expected.backward()
    loss = compiled(_phantom(x)).pow(2).sum()
    loss.backward()
    _close(loss, expected.detach())
    for mine, theirs in zip(phantom.parameters(), cpu.parameters()):
        assert mine.grad.device.type == "phantom"
        _close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6)


def test_compiled_optimizer_step():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 4)
    phantom = torch.nn.Linear(8, 4)
    phantom.load_state_dict(cpu.state_dict())
    phantom.to("phantom")
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (cpu, phantom)]

    @torch.compile
    def step(optimizer):
        optimizer.step()

    for _ in range(3):
        x = torch.randn(4, 8)
        for model, optimizer, data in zip((cpu, phantom), optimizers, (x, _phantom(x))):
            optimizer.zero_grad()
            model(data).sum().backward()
            step(optimizer)
    _close(phantom.weight, cpu.weight.detach(), rtol=1e-5, atol=1e-6)
    # Adam's step counts stay on the CPU and were read by the device kernels.
    state = optimizers[1].state[phantom.weight]
    assert state["step"].device.type == "cpu" and state["step"].item() == 3


def test_autocast_inside_the_compiled_region():
    def fn(a, b):
        with torch.autocast(a.device.type, dtype=torch.bfloat16):
            return (a @ b).relu()

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    result = torch.compile(fn)(_phantom(a), _phantom(b))
    assert result.dtype == torch.bfloat16
    _close(result, fn(a, b))


def test_streams_and_events_inside_the_compiled_region():
    side = torch.phantom.Stream()

    def fn(x):
        done = torch.phantom.Event()
        with torch.phantom.stream(side):
            y = x * 2
            done.record()
        done.wait()
        return y + 1

    x = torch.randn(100)
    compiled = torch.compile(fn, fullgraph=True)
    result, (code,) = run_and_get_code(compiled, _phantom(x))
    torch.phantom.synchronize()
    _close(result, x * 2 + 1)
    # The graph switches to the side stream and orders the streams by the
    # event, inside the compiled code.
    assert "with stream1:" in code
    assert "torch.ops.streams.record_event" in code and "torch.ops.streams.wait_event" in code


def test_each_kernel_runs_on_its_stream():
    """The C++ backend gathers nodes into one kernel; phantom must not
    gather across streams, and each kernel is called inside its stream's
    block: the multiplication runs on the side stream (stuck behind a slow
    kernel there), the cosine on the default one."""
    side = torch.phantom.Stream()

    def fn(x):
        z = x.cos()
        with torch.phantom.stream(side):
            y = x * 2
        return y, z

    x = torch.randn(100)
    compiled = torch.compile(fn, fullgraph=True)
    (y, z), (code,) = run_and_get_code(compiled, _phantom(x))
    torch.phantom.synchronize()
    on_side = code.split("with stream1:")[1].split("with default_stream:")[0]
    assert "cpp_fused_mul" in on_side and "cos" not in on_side
    slow_kernel_on(side, microseconds=300_000)
    y, z = compiled(_phantom(x))
    assert not side.query()
    torch.phantom.synchronize()
    _close(y, x * 2)
    _close(z, x.cos())


def test_max_autotune_no_cudagraphs():
    def fn(a, b):
        return (a @ b).relu() + 1

    a, b = torch.randn(32, 32), torch.randn(32, 32)
    compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs")
    _close(compiled(_phantom(a), _phantom(b)), fn(a, b), rtol=1e-5, atol=1e-5)


def test_aot_inductor_is_refused_clearly_and_exported_programs_compile():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU()).to("phantom")
    x = torch.randn(3, 8, device="phantom")
    exported = torch.export.export(model, (x,))
    with pytest.raises(torch._inductor.exc.InductorError,
                       match="C\\+\\+ wrapper .* cannot target the phantom "
                             "device: AOTInductor's model runtime accepts only"):
        torch._inductor.aoti_compile_and_package(exported)
    compiled = torch.compile(exported.module())
    _close(compiled(x), model(x).detach().cpu())
