"""Device arguments: every function of ``torch.phantom`` that takes a device
reads it by one rule, torch.cuda's (python/torch_phantom/_device_index.py).

``None``, ``"phantom"`` and ``torch.device("phantom")`` name the current
device; ``i``, ``"phantom:i"``, ``torch.device("phantom", i)`` and the
``privateuseone`` spellings name device ``i``; a wrong type is a TypeError,
another device type a ValueError, a device that does not exist the
runtime's out-of-range error, each the same whichever function was called.
A negative index is torch.cuda's "no device": the setters (``set_device``,
``device``) change nothing and the other functions use the current
device. The table below lists every public function with a device
argument; a new one fails the first test until it is added, so it cannot
grow a rule of its own.
"""

import inspect

import pytest
import torch
import torch_phantom

from conftest import DEVICE_COUNT, run_python

P = torch.phantom
# The deprecated memory names are in the table too; their warning is theirs.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
BAD = DEVICE_COUNT + 5
OUT_OF_RANGE = rf"phantom device index {BAD} is out of range"


def _handle():
    return P.current_stream(0).native_handle


# name -> a call of it with `d` as the device argument.
CALLS = {
    "synchronize": lambda d: P.synchronize(d),
    "set_device": lambda d: P.set_device(d),
    "device": lambda d: P.device(d).__enter__(),
    "get_device_properties": lambda d: P.get_device_properties(d),
    "get_device_name": lambda d: P.get_device_name(d),
    "get_device_capability": lambda d: P.get_device_capability(d),
    "can_device_access_peer": lambda d: P.can_device_access_peer(d, 0),
    "can_device_access_peer(peer)": lambda d: P.can_device_access_peer(0, d),
    "Stream": lambda d: P.Stream(d),
    "ExternalStream": lambda d: P.ExternalStream(_handle(), d),
    "get_stream_from_external": lambda d: P.get_stream_from_external(_handle(), d),
    "Event.from_ipc_handle": lambda d: P.Event.from_ipc_handle(d, b"not a handle"),
    "current_stream": lambda d: P.current_stream(d),
    "default_stream": lambda d: P.default_stream(d),
    "default_generator": lambda d: P.random.default_generator(d),
    "get_rng_state": lambda d: P.get_rng_state(d),
    "set_rng_state": lambda d: P.set_rng_state(P.get_rng_state(0), d),
    "memory_stats": lambda d: P.memory_stats(d),
    "memory_stats_as_nested_dict": lambda d: P.memory_stats_as_nested_dict(d),
    "memory_summary": lambda d: P.memory_summary(d),
    "memory_allocated": lambda d: P.memory_allocated(d),
    "max_memory_allocated": lambda d: P.max_memory_allocated(d),
    "memory_reserved": lambda d: P.memory_reserved(d),
    "max_memory_reserved": lambda d: P.max_memory_reserved(d),
    "memory_cached": lambda d: P.memory_cached(d),
    "max_memory_cached": lambda d: P.max_memory_cached(d),
    "reset_peak_memory_stats": lambda d: P.reset_peak_memory_stats(d),
    "reset_accumulated_memory_stats": lambda d: P.reset_accumulated_memory_stats(d),
    "reset_max_memory_allocated": lambda d: P.reset_max_memory_allocated(d),
    "reset_max_memory_cached": lambda d: P.reset_max_memory_cached(d),
    "mem_get_info": lambda d: P.mem_get_info(d),
    "list_gpu_processes": lambda d: P.list_gpu_processes(d),
    "set_per_process_memory_fraction": lambda d: P.set_per_process_memory_fraction(1.0, d),
    "get_per_process_memory_fraction": lambda d: P.get_per_process_memory_fraction(d),
    "caching_allocator_alloc": lambda d: P.caching_allocator_alloc(0, d),
    "device_memory_used": lambda d: P.device_memory_used(d),
    "memory_usage": lambda d: P.memory_usage(d),
    "utilization": lambda d: P.utilization(d),
    "temperature": lambda d: P.temperature(d),
    "power_draw": lambda d: P.power_draw(d),
    "clock_rate": lambda d: P.clock_rate(d),
}


def _use_mem_pool(d):
    with P.use_mem_pool(P.MemPool(), d):
        pass


if hasattr(P, "use_mem_pool"):  # memory pools (torch.phantom.MemPool)
    CALLS["use_mem_pool"] = _use_mem_pool

# Where torch.cuda lets a negative index select nothing.
SELECT_NOTHING = {"set_device", "device"}


def _public_functions_with_a_device_argument():
    found = set()
    modules = [P] + [getattr(P, name) for name in ("memory", "streams", "random", "graphs")
                     if hasattr(P, name)]
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            members = [(name, value)]
            if inspect.isclass(value):
                members += [(f"{name}.{attr}", getattr(value, attr)) for attr in vars(value)
                            if not attr.startswith("_") and callable(getattr(value, attr))]
            for label, member in members:
                try:
                    parameters = inspect.signature(member).parameters
                except (TypeError, ValueError):
                    continue
                if any("device" in parameter for parameter in parameters):
                    found.add(label)
    return found


def test_the_table_names_every_public_function_with_a_device_argument():
    listed = {name.split("(")[0] for name in CALLS}
    found = _public_functions_with_a_device_argument()
    assert found == listed, (
        f"not in CALLS: {sorted(found - listed)}; no longer public: {sorted(listed - found)}")


@pytest.fixture
def current_is_1(two_devices):
    P.set_device(1)
    yield
    P.set_device(0)


# (argument, the device it names while device 1 is current)
FORMS = [
    (None, 1),
    ("phantom", 1),
    (torch.device("phantom"), 1),
    ("privateuseone", 1),
    (-1, 1),
    (0, 0),
    ("phantom:0", 0),
    (torch.device("phantom", 0), 0),
    ("privateuseone:0", 0),
    (torch.device("privateuseone", 0), 0),
]
FORM_IDS = [repr(form) for form, _ in FORMS]

# Calls whose result shows which device they resolved.
OBSERVED = {
    "Stream": lambda d: P.Stream(d).device_index,
    "current_stream": lambda d: P.current_stream(d).device_index,
    "default_stream": lambda d: P.default_stream(d).device_index,
    "default_generator": lambda d: P.random.default_generator(d).device.index,
    "device": lambda d: _inside_device(d),
    "set_device": lambda d: _after_set_device(d),
}


def _inside_device(d):
    with P.device(d):
        return P.current_device()


def _after_set_device(d):
    P.set_device(d)
    return P.current_device()


@pytest.mark.parametrize("call", sorted(OBSERVED))
@pytest.mark.parametrize("form,expected", FORMS, ids=FORM_IDS)
def test_each_form_names_the_device_cuda_would(current_is_1, call, form, expected):
    assert OBSERVED[call](form) == expected


@pytest.mark.parametrize("form,expected", FORMS, ids=FORM_IDS)
def test_each_form_reads_the_memory_of_the_device_it_names(current_is_1, form, expected):
    keep = torch.empty(1 << 20, dtype=torch.uint8, device="phantom:0")
    by_index = {0: P.memory_allocated(0), 1: P.memory_allocated(1)}
    assert by_index[0] != by_index[1]
    assert P.memory_allocated(form) == by_index[expected]
    del keep


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("wrong,kind", [(1.5, "float"), (True, "bool"), ([0], "list"),
                                        (object(), "object")],
                         ids=["float", "bool", "list", "object"])
def test_a_wrong_type_is_a_type_error_saying_what_is_accepted(name, wrong, kind):
    with pytest.raises(TypeError, match=rf"expected a phantom device as an int, str or "
                                        rf"torch.device, got {kind}; pass an index, "
                                        rf"'phantom:<index>' or None for the current device"):
        CALLS[name](wrong)


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("other", ["cpu", torch.device("cpu"), "meta", "cuda:0"],
                         ids=["'cpu'", "device('cpu')", "'meta'", "'cuda:0'"])
def test_another_device_type_is_a_value_error(name, other):
    with pytest.raises(ValueError, match=rf"expected a phantom device, got "
                                         rf"'{torch.device(other)}'; pass an index"):
        CALLS[name](other)


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("missing", [BAD, f"phantom:{BAD}", torch.device("phantom", BAD)],
                         ids=["int", "str", "torch.device"])
def test_a_device_that_does_not_exist_is_out_of_range(name, missing):
    with pytest.raises(RuntimeError, match=OUT_OF_RANGE):
        CALLS[name](missing)


@pytest.mark.parametrize("name", sorted(SELECT_NOTHING))
def test_a_negative_index_selects_nothing_and_starts_nothing(name):
    # As torch.cuda.set_device(-1): no device is chosen, so nothing is
    # initialised (a process that forks later must not have started the
    # device because it asked for "no device").
    code = f"""
import torch, torch_phantom
call = {{"set_device": lambda: torch.phantom.set_device(-1),
        "device": lambda: torch.phantom.device(-1).__enter__()}}[{name!r}]
call()
print(torch.phantom.is_initialized())
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_an_index_beyond_any_device_index_is_out_of_range_not_an_overflow():
    # c10's device index is 8 bits; a larger int still gets the sentence.
    with pytest.raises(RuntimeError, match=r"phantom device index 1000 is out of range: "
                                           r"valid indices are 0\.\."):
        P.synchronize(1000)


def test_a_malformed_device_string_is_torchs_own_error():
    with pytest.raises(RuntimeError, match=r"Invalid device string: 'phantom:x'"):
        P.synchronize("phantom:x")


def test_the_rule_follows_the_backend_name():
    # Messages and accepted strings use the name the build chose, not a
    # hard-coded "phantom" (scripts/test_rename.sh builds another name).
    assert torch_phantom.BACKEND_NAME == torch._C._get_privateuse1_backend_name()
    from torch_phantom import _device_index

    assert _device_index.parse(f"{torch_phantom.BACKEND_NAME}:1") == 1
    assert _device_index.parse(torch_phantom.BACKEND_NAME) is None
