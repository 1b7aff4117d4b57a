"""FSDP2, DTensor and a 2-D (data x tensor parallel) mesh on phantom, against
CPU references computed in the same process.

    fsdp.py fsdp     fully_shard on init_device_mesh("phantom", (world,)) and
                     DTensor distribute/redistribute
    fsdp.py mesh2d   a (2, world/2) mesh: tensor parallel (Colwise/Rowwise)
                     inside each data-parallel replica, fully_shard across
"""

import datetime
import sys

from common import RANK, WORLD, Checks, assert_equal, device, dist, torch

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

MODE = sys.argv[1]
STEPS = 3
RTOL, ATOL = 1e-4, 1e-5

torch.phantom.set_device(device())
dist.init_process_group("pccl", device_id=device(), timeout=datetime.timedelta(seconds=120))
DEV = device()
checks = Checks()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 4))


def batch(replica, step):
    g = torch.Generator().manual_seed(1000 * step + replica)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


def train_reference(replicas):
    """One CPU process on every data-parallel replica's batch, concatenated."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        xs, ys = zip(*(batch(r, step) for r in range(replicas)))
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return model.state_dict()


def train_sharded(model, replica):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(replica, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x.to(DEV)), y.to(DEV)).backward()
        opt.step()
    return {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}


def assert_close(got, expected, what):
    for key, value in expected.items():
        if not torch.allclose(got[key], value, rtol=RTOL, atol=ATOL):
            worst = (got[key] - value).abs().max().item()
            raise AssertionError(f"{what}: {key} differs from the CPU by up to {worst:.3g}")


def check_fsdp2():
    mesh = init_device_mesh("phantom", (WORLD,))
    model = mlp().to(DEV)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert_close(train_sharded(model, RANK), train_reference(WORLD), "fully_shard")


def check_dtensor():
    mesh = init_device_mesh("phantom", (WORLD,))
    full = torch.arange(WORLD * 6 * 4, dtype=torch.float32).reshape(WORLD * 6, 4)
    sharded = distribute_tensor(full.to(DEV), mesh, [Shard(0)])
    assert_equal(sharded.to_local(), full.chunk(WORLD)[RANK], "Shard(0) local part")
    assert_equal(sharded.redistribute(mesh, [Replicate()]).to_local(), full, "Shard(0) -> Replicate")
    by_column = sharded.redistribute(mesh, [Shard(1)])
    assert_equal(by_column.full_tensor(), full, "Shard(0) -> Shard(1) -> full")
    # A Partial placement sums over the ranks when made Replicate.
    mine = torch.full((3, 2), float(RANK + 1), device=DEV)
    partial = torch.distributed.tensor.DTensor.from_local(mine, mesh, [Partial()])
    summed = partial.redistribute(mesh, [Replicate()]).to_local()
    assert_equal(summed, torch.full((3, 2), float(sum(range(1, WORLD + 1)))), "Partial -> Replicate")


def check_mesh2d():
    assert WORLD % 2 == 0, "a 2-D mesh needs an even world size"
    mesh = init_device_mesh("phantom", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    model = mlp().to(DEV)
    parallelize_module(
        model,
        mesh["tp"],
        {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel(output_layouts=Replicate())},
    )
    fully_shard(model, mesh=mesh["dp"])
    replica = mesh["dp"].get_local_rank()
    got = train_sharded(model, replica)
    assert_close(got, train_reference(2), "2-D mesh")


if MODE == "fsdp":
    checks.run("fsdp2", check_fsdp2)
    checks.run("dtensor", check_dtensor)
else:
    checks.run("mesh2d", check_mesh2d)
torch.phantom.synchronize()
checks.report()
dist.destroy_process_group()
