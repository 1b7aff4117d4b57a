"""DistributedDataParallel on phantom against one CPU process on the whole batch.

The models are examples/train_models.py's (MLP, CNN, Transformer, DLRM).
Each rank trains its DDP replica on its own slice of every batch; rank 0
(every rank, in fact) also trains the same model on the CPU, in one
process, on the concatenation of all ranks' slices. DDP averages the
gradients, so after a few steps the parameters must agree (to float
rounding: the sum is formed in another order). Dropout is set to 0 (each
rank would draw its own masks) and the CNN's batch norm layers run on their
running statistics (frozen, as when fine-tuning): in training mode each
replica would normalise by its own slice's statistics, which the whole
batch does not have, and SyncBatchNorm, which would share them, needs
ATen's CUDA-only batch_norm_stats kernels, which phantom does not have.

    ddp.py [steps]
"""

import copy
import datetime
import sys
from pathlib import Path

from common import RANK, WORLD, Checks, device, dist, torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import train_models  # noqa: E402

from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
RTOL, ATOL = 1e-4, 1e-5

dist.init_process_group("pccl", device_id=device(), timeout=datetime.timedelta(seconds=120))
DEV = device()
checks = Checks()


def without_dropout(model):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
    return model


def concat_batches(name, per_rank):
    """One CPU batch from every rank's batch, in rank order."""
    if not name.startswith("dlrm"):
        inputs = tuple(torch.cat(parts) for parts in zip(*(b.inputs for b in per_rank)))
        return train_models.Batch(inputs, torch.cat([b.target for b in per_rank]))
    # EmbeddingBag inputs: indices and weights concatenate, offsets shift.
    dense = torch.cat([b.inputs[0] for b in per_rank])
    sparse = []
    for table in range(len(train_models._DLRM.TABLES)):
        indices, offsets, weights, shift = [], [], [], 0
        for b in per_rank:
            i, o, w = b.inputs[1 + 3 * table: 4 + 3 * table]
            indices.append(i)
            offsets.append(o + shift)
            weights.append(w)
            shift += i.numel()
        sparse += [torch.cat(indices), torch.cat(offsets), torch.cat(weights)]
    return train_models.Batch((dense, *sparse), torch.cat([b.target for b in per_rank]))


class WithUnusedHead(nn.Module):
    """An MLP with a second head that forward never uses:
    find_unused_parameters must mark it ready every step."""

    def __init__(self):
        super().__init__()
        self.body = train_models._mlp()
        self.unused = nn.Linear(5, 3)

    def forward(self, x):
        return self.body(x)


def run(name, make_model=None, micro_batches=1, timing=None, **ddp_options):
    spec = train_models.MODELS[name]
    make_model = make_model or spec.make_model
    torch.manual_seed(0)
    reference = without_dropout(make_model())
    replica = copy.deepcopy(reference)
    ddp = DDP(replica.to(DEV), device_ids=[DEV.index], **ddp_options)
    ddp_opt = spec.optimizer(list(ddp.parameters()))
    ref_opt = spec.optimizer(list(reference.parameters()))
    batches = [spec.make_batches(STEPS, torch.Generator().manual_seed(100 + r)) for r in range(WORLD)]
    for model in (ddp, reference):
        model.train()
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
    for step in range(STEPS):
        mine = batches[RANK][step]
        ddp_opt.zero_grad()
        inputs = [t.to(DEV) for t in mine.inputs]
        target = mine.target.to(DEV)
        if micro_batches == 1:
            spec.loss(ddp(*inputs), target).backward()
        else:  # accumulate: no_sync for all but the last micro-batch
            n = target.shape[0] // micro_batches
            for m in range(micro_batches):
                part = slice(m * n, (m + 1) * n)
                loss = spec.loss(ddp(*(t[part] for t in inputs)), target[part]) / micro_batches
                if m < micro_batches - 1:
                    with ddp.no_sync():
                        loss.backward()
                else:
                    loss.backward()
        ddp_opt.step()

        whole = concat_batches(name, [b[step] for b in batches])
        ref_opt.zero_grad()
        spec.loss(reference(*whole.inputs), whole.target).backward()
        ref_opt.step()

    if timing is not None:
        timing.update(ddp._get_ddp_logging_data())
    trained = {k: v.detach().cpu() for k, v in ddp.module.state_dict().items()}
    for key, expected in reference.state_dict().items():
        got = trained[key]
        if not torch.allclose(got.double(), expected.double(), rtol=RTOL, atol=ATOL):
            worst = (got.double() - expected.double()).abs().max().item()
            raise AssertionError(f"{name}: {key} differs from the CPU by up to {worst:.3g}")


checks.run("mlp", lambda: run("mlp"))
checks.run("cnn", lambda: run("cnn"))
checks.run("transformer", lambda: run("transformer"))
checks.run("dlrm", lambda: run("dlrm-sgd"))
checks.run("small_buckets_as_views", lambda: run(
    "mlp", gradient_as_bucket_view=True, bucket_cap_mb=0.002))
checks.run("no_sync", lambda: run("mlp", micro_batches=2))
checks.run("find_unused_parameters", lambda: run(
    "mlp", make_model=WithUnusedHead, find_unused_parameters=True))


def check_runtime_stats():
    # DDP times sampled iterations with the device's Timer (phantom's:
    # device events), from the second iteration on.
    logged = {}
    run("mlp", timing=logged)
    for key in ("avg_forward_compute_time", "avg_backward_compute_time",
                "avg_backward_comm_time"):
        assert logged.get(key, 0) > 0, f"{key} = {logged.get(key)}"


checks.run("runtime_stats", check_runtime_stats)
checks.report(memory_allocated=torch.phantom.memory_allocated(DEV))
dist.destroy_process_group()
