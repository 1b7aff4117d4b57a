"""pccl's collectives at world sizes 2 and 3, against Gloo on CPU tensors.

Each world size is one process group (distributed_workers/collectives.py)
that runs every check and reports it by name; the tests below assert on
those names. A check compares the phantom result with Gloo's result on the
same CPU tensors, bit for bit, or that a bad call is refused at the call
with a message saying why.
"""

import pytest

from distributed_harness import check_named, run_group

FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTEGERS = ["int8", "uint8", "int32", "int64", "bool"]
OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]


def _reduction_checks():
    names = []
    for dtype in FLOATS + INTEGERS + ["int16", "float8_e4m3fn"]:
        for op in OPS:
            ok = (dtype in FLOATS and op in OPS[:5]) or (dtype in INTEGERS and op != "avg")
            names.append(f"all_reduce[{dtype}-{op}]" if ok else f"all_reduce_refused[{dtype}-{op}]")
    return names


REDUCTIONS = _reduction_checks() + [
    "all_reduce[complex64-sum]",
    "all_reduce[order-float32-sum]",
    "all_reduce[order-bfloat16-avg]",
    "all_reduce[order-float64-product]",
    "all_reduce[empty]",
    "all_reduce[chunked-sum]",
    "all_reduce[chunked-avg-bf16]",
    "all_reduce[chunked-max-int64]",
]

COLLECTIVES = [
    "broadcast[root0]",
    "broadcast[root1]",
    "broadcast[chunked-int16]",
    "reduce[sum]",
    "reduce[max]",
    "all_gather[separate]",
    "all_gather[adjacent]",
    "all_gather_into_tensor",
    "reduce_scatter[sum]",
    "reduce_scatter[max]",
    "reduce_scatter_tensor[sum]",
    "reduce_scatter_tensor[avg]",
    "all_to_all_single[equal]",
    "all_to_all_single[uneven]",
    "all_to_all[list]",
    "gather[root0]",
    "gather[last]",
    "scatter[root0]",
    "scatter[last]",
    "barrier",
    "send_recv",
    "isend_irecv",
    "batch_isend_irecv",
    "coalesced",
]

SEMANTICS = [
    "async_work",
    "future",
    "wait_timeout_blocks_the_host",
    pytest.param("wait_timeout_expires", marks=pytest.mark.requires_kernel_view(
        "needs a collective still waiting for queued work when the timeout ends; "
        "without a kernel view that work runs at the call")),
    "wait_does_not_block_the_host",
    "ordered_after_queued_work",
    "side_stream",
    "list_forms_after_queued_work",
    "staging_memory_is_bounded",
    "refusals",
]

DISAGREEMENTS = [
    "mismatch_size",
    "mismatch_small_and_large",
    "mismatch_dtype",
    "mismatch_op",
    "mismatch_splits",
    "world_group_unaffected",
]


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def group(request):
    return run_group("collectives", request.param, timeout=240)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_all_reduce_matches_gloo_or_is_refused_at_the_call(group, name):
    check_named(group, name)


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_matches_gloo(group, name):
    check_named(group, name)


@pytest.mark.parametrize("name", SEMANTICS)
def test_work_and_stream_semantics(group, name):
    check_named(group, name)


@pytest.mark.parametrize("name", DISAGREEMENTS)
def test_ranks_that_disagree_get_an_error_not_a_crash(group, name):
    check_named(group, name)


def test_no_device_memory_left_allocated(group):
    # Every collective's tensors, staging and temporaries are freed, the
    # broken groups' included.
    assert [o.results["memory_allocated"] for o in group] == [0] * len(group)
