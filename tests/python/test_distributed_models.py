"""Training with pccl matches training on the CPU.

DDP trains examples/train_models.py's MLP, CNN, Transformer and DLRM on
phantom (with small buckets as gradient views, no_sync and
find_unused_parameters too) and compares with one CPU process on the
concatenated batch (distributed_workers/ddp.py). FSDP2 (fully_shard on a
phantom DeviceMesh), DTensor redistribution and a 2-D data x tensor
parallel mesh are compared with CPU references the same way
(distributed_workers/fsdp.py). DISTRIBUTED_FULL=1 also runs DDP at world 3.
"""

import pytest

from distributed_harness import FULL, check_named, run_group


# FSDP2 and DTensor first: without a kernel view the suite's sample runs the
# first two tests of each file (conftest.py), and these are the ones whose
# DTensor ops wait for the stream holding the GIL while the stream's worker
# frees a finished collective.
@pytest.fixture(scope="module")
def fsdp():
    return run_group("fsdp", 3, timeout=300, args=("fsdp",))


@pytest.mark.parametrize("name", ["fsdp2", "dtensor"])
def test_fsdp2_and_dtensor_match_cpu(fsdp, name):
    check_named(fsdp, name)


DDP_CHECKS = ["mlp", "cnn", "transformer", "dlrm", "small_buckets_as_views", "no_sync",
              "find_unused_parameters", "runtime_stats"]


@pytest.fixture(scope="module", params=[2, 3] if FULL else [2], ids=lambda w: f"world{w}")
def ddp(request):
    return run_group("ddp", request.param, timeout=300, args=(5 if FULL else 3,))


@pytest.mark.parametrize("name", DDP_CHECKS)
def test_ddp_matches_cpu_on_the_whole_batch(ddp, name):
    check_named(ddp, name)


def test_ddp_leaves_no_device_memory(ddp):
    assert [o.results["memory_allocated"] for o in ddp] == [0] * len(ddp)


def test_2d_mesh_data_and_tensor_parallel_matches_cpu():
    # Four ranks: a (2, 2) mesh made by split_group from a group bound to
    # its device, tensor parallel inside each data-parallel replica.
    check_named(run_group("fsdp", 4, timeout=300, args=("mesh2d",)), "mesh2d")
