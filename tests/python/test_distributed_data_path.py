"""pccl's three data paths: zero-copy over the driver's kernel view, staged
through pinned memory without one, and small jobs carried in their
agreement message (docs/distributed.md, "How it works").

The same worker (distributed_workers/data_path.py) runs with the fake
driver's kernel view and without it (PHANTOM_FAKE_NO_KERNEL_VIEW=1); each
collective must give the right result either way, and take the path the
driver allows: zero-copy whenever there is a view (except a collective
under 64 KiB, reduce, and a group holding one, which always stage), staged
whenever there is none; and with or without a view, a collective moving at
most 8 KiB that has a local form travels in its agreement message.
"""

import os

import pytest

from distributed_harness import check_named, run_group

ZERO_COPY = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
             "all_to_all_single", "send_recv"]
ALWAYS_STAGED = ["reduce", "coalesced_with_reduce", "all_reduce_9KiB", "small_reduce_scatter",
                 "small_all_to_all"]
SMALL = ["small_all_reduce", "small_all_reduce_max", "small_broadcast", "small_all_gather",
         "small_reduce", "small_coalesced", "barrier"]
# Another driver (PHANTOM_DRIVER) decides for itself whether it has a view.
FAKE_DRIVER = "PHANTOM_DRIVER" not in os.environ


@pytest.fixture(scope="module", params=["kernel_view", "no_kernel_view"])
def group(request):
    view = request.param == "kernel_view"
    if view and not FAKE_DRIVER:
        pytest.skip("the fake driver's kernel view: PHANTOM_DRIVER names another driver")
    env = {"PHANTOM_FAKE_NO_KERNEL_VIEW": "0" if view else "1", "PHANTOM_CPU_FALLBACK": "silent"}
    outcomes = run_group("data_path", 2, timeout=120, env=env)
    for o in outcomes:
        assert o.results["kernel_view"] == view, f"rank {o.rank}: the driver's kernel view"
    return view, outcomes


@pytest.mark.parametrize("name", ZERO_COPY + ALWAYS_STAGED + SMALL)
def test_collective_result_on_either_path(group, name):
    check_named(group[1], name)


@pytest.mark.parametrize("name", ZERO_COPY)
def test_zero_copy_exactly_when_the_driver_has_a_kernel_view(group, name):
    view, outcomes = group
    expected = ({"zero_copy": 1, "staged": 0, "small": 0} if view
                else {"zero_copy": 0, "staged": 1, "small": 0})
    for o in outcomes:
        assert o.results["paths"][name] == expected, f"rank {o.rank}"


@pytest.mark.parametrize("name", ALWAYS_STAGED)
def test_small_collectives_and_reduce_always_stage(group, name):
    for o in group[1]:
        assert o.results["paths"][name] == {"zero_copy": 0, "staged": 1, "small": 0}, f"rank {o.rank}"


def test_small_and_larger_collectives_in_flight_together(group):
    view, outcomes = group
    check_named(outcomes, "mixed_sequence")
    larger = {"zero_copy": 2, "staged": 0} if view else {"zero_copy": 0, "staged": 2}
    for o in outcomes:
        assert o.results["paths"]["mixed_sequence"] == {**larger, "small": 3}, f"rank {o.rank}"


def test_each_collective_reads_what_the_one_before_wrote(group):
    outcomes = group[1]
    check_named(outcomes, "dependent_sequence")
    for o in outcomes:
        assert o.results["paths"]["dependent_sequence"] == {"zero_copy": 0, "staged": 1, "small": 3}, \
            f"rank {o.rank}"


@pytest.mark.parametrize("name", SMALL)
def test_small_collectives_travel_in_their_agreement_message(group, name):
    # One Gloo exchange instead of two: no data backend call, either way.
    for o in group[1]:
        assert o.results["paths"][name] == {"zero_copy": 0, "staged": 0, "small": 1}, f"rank {o.rank}"
