"""Random number generation on phantom devices (docs/random.md).

A phantom generator wraps a CPU generator and the generic path hands it to
the CPU's random kernels, so with the same seed a phantom device draws
exactly the numbers the CPU draws. Every test here compares with the CPU
bit for bit.
"""

import pytest
import torch
import torch.nn.functional as F

SEED = 1234

# Each draws on `device` from the default generator of that device.
DRAWS = {
    "randn": lambda d: torch.randn(4, 37, device=d),
    "randn_float64": lambda d: torch.randn(50, device=d, dtype=torch.float64),
    "rand": lambda d: torch.rand(3, 5, device=d),
    "randint": lambda d: torch.randint(-5, 100, (64,), device=d),
    "normal_": lambda d: torch.empty(40, device=d).normal_(2.0, 3.0),
    "normal_tensor_mean": lambda d: torch.normal(torch.arange(6.0, device=d), 0.5),
    "uniform_": lambda d: torch.empty(40, device=d).uniform_(-2, 2),
    "exponential_": lambda d: torch.empty(40, device=d).exponential_(),
    "bernoulli": lambda d: torch.bernoulli(torch.linspace(0, 1, 50, device=d)),
    "bernoulli_p": lambda d: torch.empty(50, device=d).bernoulli_(0.3),
    "dropout": lambda d: F.dropout(torch.ones(8, 16, device=d), p=0.4),
    "randperm": lambda d: torch.randperm(1000, device=d),
    "multinomial": lambda d: torch.multinomial(
        torch.arange(1.0, 11.0, device=d), 6, replacement=False
    ),
    "multinomial_replacement": lambda d: torch.multinomial(
        torch.arange(1.0, 21.0, device=d).reshape(2, 10), 15, replacement=True
    ),
}


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_same_seed_draws_the_cpus_numbers(name):
    draw = DRAWS[name]
    torch.manual_seed(SEED)
    phantom = draw("phantom").cpu()
    torch.manual_seed(SEED)
    cpu = draw("cpu")
    assert torch.equal(phantom, cpu), name


def test_consecutive_draws_advance_the_device_generator_like_cpu():
    torch.manual_seed(SEED)
    phantom = [torch.rand(7, device="phantom").cpu() for _ in range(3)]
    torch.manual_seed(SEED)
    cpu = [torch.rand(7) for _ in range(3)]
    for p, c in zip(phantom, cpu):
        assert torch.equal(p, c)
    assert not torch.equal(phantom[0], phantom[1])


def test_explicit_generator_on_each_device(two_devices):
    for index in (0, 1):
        generator = torch.Generator(device=f"phantom:{index}")
        assert generator.device == torch.device("phantom", index)
        generator.manual_seed(77)
        drawn = torch.randn(10, device=f"phantom:{index}", generator=generator)
        expected = torch.randn(10, generator=torch.Generator().manual_seed(77))
        assert drawn.device == torch.device("phantom", index)
        assert torch.equal(drawn.cpu(), expected)


def test_explicit_generator_does_not_touch_the_default_generator():
    torch.phantom.manual_seed(5)
    state = torch.phantom.get_rng_state()
    generator = torch.Generator(device="phantom").manual_seed(6)
    torch.rand(100, device="phantom", generator=generator)
    assert torch.equal(torch.phantom.get_rng_state(), state)


def test_manual_seed_is_per_device_and_manual_seed_all_seeds_every_device(two_devices):
    torch.phantom.manual_seed_all(1)
    with torch.phantom.device(1):
        torch.phantom.manual_seed(2)  # the current device only
    assert torch.phantom.initial_seed() == 1
    with torch.phantom.device(1):
        assert torch.phantom.initial_seed() == 2
    a = torch.rand(5, device="phantom:0").cpu()
    b = torch.rand(5, device="phantom:1").cpu()
    assert torch.equal(a, torch.rand(5, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(b, torch.rand(5, generator=torch.Generator().manual_seed(2)))


def test_torch_manual_seed_seeds_phantom_devices():
    torch.manual_seed(99)
    for index in range(torch.phantom.device_count()):
        with torch.phantom.device(index):
            assert torch.phantom.initial_seed() == 99


def test_seed_picks_a_fresh_nondeterministic_seed():
    torch.phantom.manual_seed(3)
    torch.phantom.seed()
    first = torch.phantom.initial_seed()
    torch.phantom.seed()
    assert torch.phantom.initial_seed() != first
    assert first != 3
    # The draws follow the new seed, as on the CPU.
    drawn = torch.rand(4, device="phantom").cpu()
    assert torch.equal(drawn, torch.rand(4, generator=torch.Generator().manual_seed(torch.phantom.initial_seed())))


def test_seed_all_gives_every_device_the_same_fresh_seed(two_devices):
    torch.phantom.seed_all()
    seeds = []
    for index in range(torch.phantom.device_count()):
        with torch.phantom.device(index):
            seeds.append(torch.phantom.initial_seed())
    assert len(set(seeds)) == 1


def test_get_and_set_rng_state_replays_draws():
    torch.phantom.manual_seed(SEED)
    torch.rand(3, device="phantom")
    state = torch.phantom.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    first = torch.randn(20, device="phantom").cpu()
    torch.phantom.set_rng_state(state)
    assert torch.equal(torch.randn(20, device="phantom").cpu(), first)


def test_rng_state_is_the_cpu_generators_state():
    # The state format is the CPU's (mt19937), so a CPU state can be loaded
    # and then the phantom device continues exactly as the CPU would.
    cpu_generator = torch.Generator().manual_seed(42)
    torch.rand(11, generator=cpu_generator)
    torch.phantom.set_rng_state(cpu_generator.get_state())
    assert torch.equal(
        torch.rand(9, device="phantom").cpu(), torch.rand(9, generator=cpu_generator)
    )


def test_set_rng_state_rejects_a_state_of_the_wrong_size():
    with pytest.raises(RuntimeError, match="size"):
        torch.phantom.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_get_and_set_rng_state_all(two_devices):
    torch.phantom.manual_seed_all(8)
    states = torch.phantom.get_rng_state_all()
    assert len(states) == torch.phantom.device_count()
    first = [torch.rand(4, device=f"phantom:{i}").cpu() for i in range(len(states))]
    torch.phantom.set_rng_state_all(states)
    again = [torch.rand(4, device=f"phantom:{i}").cpu() for i in range(len(states))]
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_rng_state_of_another_device(two_devices):
    torch.phantom.manual_seed_all(0)
    state = torch.phantom.get_rng_state("phantom:1")
    torch.rand(5, device="phantom:1")
    assert not torch.equal(torch.phantom.get_rng_state(1), state)
    torch.phantom.set_rng_state(state, "phantom:1")
    assert torch.equal(torch.phantom.get_rng_state(1), state)
    # Device 0 was never touched.
    assert torch.equal(
        torch.phantom.get_rng_state(0), torch.Generator().manual_seed(0).get_state()
    )


def test_generator_state_and_clone_state(two_devices):
    generator = torch.Generator(device="phantom:1").manual_seed(4)
    state = generator.get_state()
    clone = generator.clone_state()
    assert clone.device == torch.device("phantom", 1)
    a = torch.rand(6, device="phantom:1", generator=generator).cpu()
    b = torch.rand(6, device="phantom:1", generator=clone).cpu()
    generator.set_state(state)
    c = torch.rand(6, device="phantom:1", generator=generator).cpu()
    assert torch.equal(a, b) and torch.equal(a, c)


def test_fork_rng_restores_phantom_state():
    torch.phantom.manual_seed(SEED)
    with torch.random.fork_rng(devices=[0], device_type="phantom"):
        torch.phantom.manual_seed(0)
        inside = torch.rand(5, device="phantom").cpu()
    after = torch.rand(5, device="phantom").cpu()
    assert torch.equal(after, torch.rand(5, generator=torch.Generator().manual_seed(SEED)))
    assert not torch.equal(inside, after)


def test_fork_rng_restores_every_device_by_default(two_devices):
    torch.manual_seed(SEED)
    states = torch.phantom.get_rng_state_all()
    with pytest.warns(UserWarning, match="fork_rng"):
        with torch.random.fork_rng(device_type="phantom"):
            for index in range(torch.phantom.device_count()):
                torch.randn(10, device=f"phantom:{index}")
    for before, after in zip(states, torch.phantom.get_rng_state_all()):
        assert torch.equal(before, after)


def test_a_generator_of_another_device_type_is_rejected():
    with pytest.raises(RuntimeError, match="generator"):
        torch.rand(2, device="phantom", generator=torch.Generator())


def test_dropout_draws_from_the_phantom_generator_not_the_cpus():
    torch.manual_seed(SEED)
    cpu_state = torch.get_rng_state()
    torch.phantom.manual_seed(SEED + 1)
    phantom = F.dropout(torch.ones(64, device="phantom"), p=0.5).cpu()
    assert torch.equal(torch.get_rng_state(), cpu_state)  # CPU stream untouched
    torch.manual_seed(SEED + 1)
    assert torch.equal(phantom, F.dropout(torch.ones(64), p=0.5))


def test_default_generators_has_one_generator_per_device():
    generators = torch.phantom.default_generators
    assert [g.device for g in generators] == [
        torch.device("phantom", i) for i in range(torch.phantom.device_count())
    ]
    generators[1].manual_seed(5)
    assert torch.phantom.default_generators[1].initial_seed() == 5


def test_a_phantom_generator_for_a_cpu_op_is_a_clear_error():
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator"):
        torch.rand(2, generator=torch.Generator(device="phantom"))


# --- Queued draws (phantom/Generator.h) ---------------------------------
# Random ops are queued like any other op; the generator is advanced by the
# stream's worker. These tests hold a stream back with injected latency so
# that the host is well ahead of the device when it checks.

import torch_phantom  # noqa: E402
from conftest import slow_kernel_on  # noqa: E402

P = torch.phantom


def _async_count(op):
    return sum(r["async"] for r in torch_phantom.ops_report() if r["op"] == op)


@pytest.mark.requires_kernel_view(
    "checks work left queued on the stream; without a kernel view the op runs at the call")
def test_a_draw_is_queued_and_still_draws_the_cpus_numbers():
    x = torch.empty(1000, device="phantom")
    x.normal_()
    P.synchronize()
    stream = P.Stream()
    torch.manual_seed(SEED)
    slow_kernel_on(stream)
    before = _async_count("aten::normal_")
    with P.stream(stream):
        x.normal_()
        pending = not stream.query()
    assert pending, "normal_ waited for the device instead of queueing"
    assert _async_count("aten::normal_") == before + 1
    torch.manual_seed(SEED)
    stream.synchronize()  # x is read on the default stream
    assert torch.equal(x.cpu(), torch.empty(1000).normal_())


def test_draws_on_two_streams_happen_in_the_order_the_host_called_them():
    slow, fast = P.Stream(), P.Stream()
    a = torch.empty(500, device="phantom")
    b = torch.empty(500, device="phantom")
    a.uniform_(), b.uniform_()  # signatures checked once, outside the test
    P.synchronize()
    torch.manual_seed(SEED)
    slow_kernel_on(slow)
    with P.stream(slow):
        a.uniform_()  # behind 30 ms of work
    with P.stream(fast):
        b.uniform_()  # an idle stream: without ordering it would draw first
    P.synchronize()
    torch.manual_seed(SEED)
    first, second = torch.empty(500).uniform_(), torch.empty(500).uniform_()
    assert torch.equal(a.cpu(), first)
    assert torch.equal(b.cpu(), second)


@pytest.mark.requires_kernel_view(
    "checks work left queued on the stream; without a kernel view the op runs at the call")
def test_a_waiting_random_op_draws_after_the_queued_ones():
    # A random op whose output shape depends on the data waits (its Meta
    # kernel raises); a draw queued before it on a slower stream must come
    # first.
    lib = torch.library.Library("phantom_test_draws", "DEF")
    lib.define("draw_n(Tensor n, Generator? generator=None) -> Tensor")

    def draw_n(n, generator=None):
        return torch.empty(int(n.item())).uniform_(generator=generator)

    def data_dependent(n, generator=None):
        raise RuntimeError("the output's shape depends on the data")

    lib.impl("draw_n", draw_n, "CPU")
    lib.impl("draw_n", data_dependent, "Meta")
    slow = P.Stream()
    a = torch.empty(300, device="phantom")
    a.exponential_()
    P.synchronize()
    torch.manual_seed(SEED)
    slow_kernel_on(slow)
    with P.stream(slow):
        a.exponential_()
    torch_phantom.reset_ops_report()
    drawn = torch.ops.phantom_test_draws.draw_n(torch.tensor(257, device="phantom"))
    assert [r["sync"] for r in torch_phantom.ops_report()
            if r["op"] == "phantom_test_draws::draw_n"] == [1]
    torch.manual_seed(SEED)
    cpu_a = torch.empty(300).exponential_()
    slow.synchronize()  # a is read on the default stream
    assert torch.equal(a.cpu(), cpu_a)
    assert torch.equal(drawn.cpu(), torch.empty(257).uniform_())
    del lib


def test_rng_state_read_while_draws_are_queued_includes_them():
    x = torch.empty(200, device="phantom")
    x.normal_()
    P.synchronize()
    stream = P.Stream()
    P.manual_seed(SEED)
    slow_kernel_on(stream)
    with P.stream(stream):
        x.normal_()
        state = P.get_rng_state()  # the host is ~30 ms ahead here
    torch.manual_seed(SEED)
    torch.empty(200).normal_()
    assert torch.equal(state, torch.get_rng_state())


def test_reseeding_while_draws_are_queued_does_not_change_them():
    x = torch.empty(200, device="phantom")
    x.bernoulli_(0.5)
    P.synchronize()
    stream = P.Stream()
    P.manual_seed(SEED)
    slow_kernel_on(stream)
    with P.stream(stream):
        x.bernoulli_(0.5)
        P.manual_seed(SEED + 7)
        y = torch.empty(200, device="phantom").bernoulli_(0.5)
    stream.synchronize()  # x and y are read on the default stream
    torch.manual_seed(SEED)
    assert torch.equal(x.cpu(), torch.empty(200).bernoulli_(0.5))
    torch.manual_seed(SEED + 7)
    assert torch.equal(y.cpu(), torch.empty(200).bernoulli_(0.5))


@pytest.mark.requires_kernel_view(
    "without a kernel view the op runs at the call on host copies, so its error is raised there, not by a later sync")
def test_a_failed_queued_draw_is_reported_by_the_next_sync_not_by_get_rng_state():
    probabilities = torch.tensor([0.5, 0.5], device="phantom")
    torch.multinomial(probabilities, 1)  # signature checked, then queued
    bad = torch.tensor([0.5, -1.0], device="phantom")  # same signature
    stream = P.Stream()
    with P.stream(stream):
        torch.multinomial(bad, 1)
        P.get_rng_state()  # the draw's state is final; no error here
        with pytest.raises(RuntimeError, match="multinomial"):
            stream.synchronize()
    P.manual_seed(SEED)  # the generator stays usable
    assert torch.multinomial(probabilities, 1).cpu().item() in (0, 1)


def test_the_first_call_of_a_new_shape_draws_the_devices_numbers_only():
    # The first call with a signature learns its outputs from a trial run
    # of the CPU kernel on the host: that run must draw neither from the
    # phantom generator nor from the CPU's default one.
    torch.manual_seed(SEED)
    cpu_state = torch.get_rng_state()
    torch.phantom.manual_seed(SEED + 2)
    x = torch.empty(37, 3, device="phantom").normal_()
    y = torch.rand(5, 41, device="phantom")
    assert torch.equal(torch.get_rng_state(), cpu_state)
    torch.manual_seed(SEED + 2)
    assert torch.equal(x.cpu(), torch.empty(37, 3).normal_())
    assert torch.equal(y.cpu(), torch.rand(5, 41))
