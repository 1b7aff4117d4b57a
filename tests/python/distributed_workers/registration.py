"""The ways a program asks for pccl, one after another in one process:

    init_process_group()                                  the accelerator's default
    init_process_group(device_id=torch.device("phantom", i))
    init_process_group("cpu:gloo,phantom:pccl")           CPU tensors to Gloo too
    init_process_group("pccl")

Each must give a group whose collectives work on phantom tensors.
"""

import datetime
import os

from common import RANK, WORLD, Checks, assert_equal, device, dist, raises, torch

DEV = device()
TOTAL = float(sum(range(1, WORLD + 1)))
checks = Checks()


def round_trip(make, cpu_too=False, bound=False):
    def check():
        make()
        try:
            t = torch.full((3,), float(RANK + 1), device=DEV)
            dist.all_reduce(t)
            assert_equal(t, torch.full((3,), TOTAL), "phantom all_reduce")
            dist.barrier()
            pg = dist.group.WORLD
            assert pg._get_backend(torch.device("phantom")).name() == "pccl"
            if bound:
                assert_equal(pg.bound_device_id, DEV, "bound device")
            if cpu_too:
                c = torch.full((3,), float(RANK + 1))
                dist.all_reduce(c)
                assert_equal(c, torch.full((3,), TOTAL), "cpu all_reduce")
            else:
                raises(lambda: dist.all_reduce(torch.ones(2)), "No backend type associated with device type cpu")
        finally:
            dist.destroy_process_group()

    return check


timeout = datetime.timedelta(seconds=60)
# One store for the explicit rounds, each under its own prefix: making a
# fresh store on one port per round races with the last round's teardown.
store = dist.TCPStore("127.0.0.1", int(os.environ["SPARE_PORT"]), WORLD, RANK == 0)


def explicit(round_name, **kwargs):
    prefix = dist.PrefixStore(round_name, store)
    return lambda: dist.init_process_group(
        store=prefix, rank=RANK, world_size=WORLD, timeout=timeout, **kwargs)


checks.run("device_id", round_trip(explicit("device_id", device_id=DEV), bound=True))
checks.run("cpu_gloo_phantom_pccl", round_trip(
    explicit("both", backend="cpu:gloo,phantom:pccl"), cpu_too=True))
checks.run("pccl", round_trip(explicit("pccl", backend="pccl")))
# Last, as the only round on MASTER_PORT (env://, as torchrun sets it up).
checks.run("default", round_trip(lambda: dist.init_process_group(timeout=timeout)))
checks.run("default_backend_for_phantom", lambda: assert_equal(
    dist.Backend.default_device_backend_map.get("phantom"), "pccl", "default backend"))
checks.report()
