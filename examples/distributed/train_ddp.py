"""Data-parallel training on phantom devices with torch.distributed.

Each rank trains a DistributedDataParallel replica of one of
examples/train_models.py's models on its own slice of every batch; pccl
(torch_phantom's c10d backend) averages the gradients. Rank 0 then trains
the same model in one CPU process on all the slices together and checks
that the parameters agree, so the run shows that the distributed training
computed what single-process training computes. It exits with status 1 if
they do not.

One machine, two processes:

    torchrun --standalone --nproc-per-node=2 examples/distributed/train_ddp.py

Two machines (here both on 127.0.0.1; use the first machine's address):

    torchrun --nnodes=2 --nproc-per-node=1 --node-rank=0 \\
        --master-addr=127.0.0.1 --master-port=29500 examples/distributed/train_ddp.py
    torchrun --nnodes=2 --nproc-per-node=1 --node-rank=1 \\
        --master-addr=127.0.0.1 --master-port=29500 examples/distributed/train_ddp.py

Options: --model mlp|cnn|transformer|dlrm (default mlp), --steps N,
--bind-cores (each rank of a machine on cores of its own,
torch_phantom.distributed.bind_to_cores; every rank prints its CPUs).
Set GLOO_SOCKET_IFNAME to pick the network interface between machines.
"""

import argparse
import copy
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_phantom  # noqa: F401  (registers the device and the pccl backend)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_models  # noqa: E402

MODELS = {"mlp": "mlp", "cnn": "cnn", "transformer": "transformer", "dlrm": "dlrm-sgd"}


def prepare(model):
    """Dropout off (each rank would draw its own masks) and batch norm on
    its running statistics (each rank would normalise by its own slice):
    then the replicas compute exactly what one process does on the whole
    batch."""
    model.train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        elif isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
    return model


def whole_batch(name, slices):
    if not name.startswith("dlrm"):
        inputs = tuple(torch.cat(parts) for parts in zip(*(b.inputs for b in slices)))
        return inputs, torch.cat([b.target for b in slices])
    dense = torch.cat([b.inputs[0] for b in slices])
    sparse = []
    for table in range(len(train_models._DLRM.TABLES)):
        shift, parts = 0, ([], [], [])
        for b in slices:
            indices, offsets, weights = b.inputs[1 + 3 * table: 4 + 3 * table]
            parts[0].append(indices)
            parts[1].append(offsets + shift)
            parts[2].append(weights)
            shift += indices.numel()
        sparse += [torch.cat(p) for p in parts]
    return (dense, *sparse), torch.cat([b.target for b in slices])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="mlp")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bind-cores", action="store_true")
    args = parser.parse_args()
    if args.bind_cores:
        cpus = torch_phantom.distributed.bind_to_cores()
        print(f"local rank {os.environ.get('LOCAL_RANK')} runs on CPUs {sorted(cpus)}", flush=True)
    name = MODELS[args.model]
    spec = train_models.MODELS[name]

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("phantom", local_rank % torch.phantom.device_count())
    torch.phantom.set_device(device)
    dist.init_process_group(device_id=device)  # pccl, the phantom default
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    reference = prepare(spec.make_model())
    model = DDP(prepare(copy.deepcopy(reference)).to(device), device_ids=[device.index])
    optimizer = spec.optimizer(list(model.parameters()))
    # Every rank can make every rank's batches: rank r trains on slice r.
    batches = [spec.make_batches(args.steps, torch.Generator().manual_seed(100 + r))
               for r in range(world)]

    for step in range(args.steps):
        mine = batches[rank][step]
        optimizer.zero_grad()
        loss = spec.loss(model(*(t.to(device) for t in mine.inputs)), mine.target.to(device))
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step}: loss {mean_loss.item():.6f} (mean over {world} ranks)")

    status = 0
    if rank == 0:
        ref_optimizer = spec.optimizer(list(reference.parameters()))
        for step in range(args.steps):
            inputs, target = whole_batch(name, [b[step] for b in batches])
            ref_optimizer.zero_grad()
            spec.loss(reference(*inputs), target).backward()
            ref_optimizer.step()
        trained = model.module.state_dict()
        worst = max((trained[k].cpu().double() - v.double()).abs().max().item()
                    for k, v in reference.state_dict().items() if v.numel())
        ok = worst <= 1e-4
        print(f"{args.model} on {world} ranks: parameters differ from one CPU process on the "
              f"whole batch by at most {worst:.2e} -> {'OK' if ok else 'MISMATCH'}")
        status = 0 if ok else 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
