"""How a program gets pccl: init_process_group's forms, torchrun, and
TORCH_DISTRIBUTED_DEBUG=DETAIL."""

import pytest

from distributed_harness import check_named, run_group


@pytest.fixture(scope="module")
def registration():
    return run_group("registration", 2, timeout=120)


@pytest.mark.parametrize(
    "name",
    ["default", "device_id", "cpu_gloo_phantom_pccl", "pccl", "default_backend_for_phantom"],
)
def test_init_process_group_forms(registration, name):
    check_named(registration, name)


@pytest.fixture(scope="module")
def detail():
    return run_group("debug_detail", 2, timeout=120, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})


@pytest.mark.parametrize("name", ["wrapped", "collectives_work", "mismatch_found_by_the_wrapper"])
def test_debug_detail_wraps_pccl(detail, name):
    check_named(detail, name)
