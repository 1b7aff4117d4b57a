"""A rank that dies, hangs or hits a device error: the others raise, naming
the collective and the rank at fault, and nothing hangs or leaks.

Each case is one process group (distributed_workers/failures.py). For a
dead rank and a device fault the group's timeout is 60 s and the harness
kills the group after 45 s: passing shows the survivors did not wait for
the timeout. For a hung rank the timeout is 3 s. Each case runs with
256 KiB all_reduces and with small ones (64 bytes, carried in the
agreement message).
"""

import pytest

from distributed_harness import run_group


@pytest.fixture(scope="module", params=["large", "small"])
def size(request):
    return request.param


def survivors(outcomes, exclude):
    return [o for o in outcomes if o.rank not in exclude]


@pytest.fixture(scope="module")
def dead(size):
    return run_group("failures", 3, timeout=45, args=("dead", size), expect_success=False)


@pytest.fixture(scope="module")
def hung(size):
    return run_group("failures", 3, timeout=45, args=("hung", size))


@pytest.fixture(scope="module")
def fault(size):
    return run_group("failures", 2, timeout=45, args=("fault", size))


def test_a_dead_rank_makes_the_others_raise_naming_it(dead):
    assert dead[2].returncode == 3  # it died as planned
    for o in survivors(dead, {2}):
        assert o.returncode == 0, o.stderr[-3000:]
        error = o.results["error"]
        assert "all_reduce #2" in error, error
        assert "rank 2 (pid" in error and "has exited before calling it" in error, error


def test_a_hung_rank_makes_the_others_time_out_naming_it(hung):
    for o in survivors(hung, {2}):
        error = o.results["error"]
        assert "all_reduce #2" in error and "Timed out" in error, error
        assert "rank 2 has not called it (its last collective is all_reduce #1" in error, error


def test_an_injected_device_fault_surfaces_on_every_rank(fault):
    assert "injected device fault" in fault[0].results["error"], fault[0].results
    peer = fault[1].results["error"]
    assert "all_reduce #2" in peer, peer
    assert "it failed first on rank 0" in peer and "injected device fault" in peer, peer


@pytest.mark.parametrize("case", ["dead", "hung", "fault"])
def test_after_a_failure_the_group_refuses_and_no_device_memory_leaks(case, size, request):
    outcomes = request.getfixturevalue(case)
    at_fault = {"dead": {2}, "hung": {2}, "fault": set()}[case]
    for o in survivors(outcomes, at_fault):
        assert "broken by an earlier failure" in o.results["later"], o.results
        assert o.results["leaked"] == 0, o.results
