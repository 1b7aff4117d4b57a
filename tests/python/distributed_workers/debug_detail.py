"""TORCH_DISTRIBUTED_DEBUG=DETAIL (set by the test): torch wraps pccl in its
ProcessGroupWrapper, which checks every collective's shapes across ranks
with a Gloo helper group before pccl runs it."""

import datetime

from common import RANK, WORLD, Checks, assert_equal, device, dist, raises, torch

dist.init_process_group("pccl", device_id=device(), timeout=datetime.timedelta(seconds=60))
DEV = device()
checks = Checks()


def check_wrapped():
    backend = dist.group.WORLD._get_backend(torch.device("phantom"))
    assert "Wrapper" in type(backend).__name__, type(backend).__name__


def check_collectives_work():
    t = torch.full((4,), float(RANK + 1), device=DEV)
    dist.all_reduce(t)
    assert_equal(t, torch.full((4,), float(sum(range(1, WORLD + 1)))), "all_reduce")
    out = torch.empty(4 * WORLD, device=DEV)
    dist.all_gather_into_tensor(out, t)
    dist.barrier()


def check_mismatch_found_by_the_wrapper():
    t = torch.ones(3 if RANK == 0 else 5, device=DEV)
    raises(lambda: dist.all_reduce(t), "Detected mismatch between collectives on ranks")


checks.run("wrapped", check_wrapped)
checks.run("collectives_work", check_collectives_work)
checks.run("mismatch_found_by_the_wrapper", check_mismatch_found_by_the_wrapper)
checks.report()
