"""Train real models on the phantom device and on the CPU, side by side.

Each model starts from the same weights (built on the CPU from one seed),
sees the same synthetic batches, and draws the same dropout masks (both
devices' generators are seeded alike before training). The phantom device
computes with the CPU's kernels, so the two runs must agree step by step;
the script prints both loss curves and exits with status 1 if they do not.

    python examples/train_models.py --model cnn [--steps 8] [--device phantom:1]
    python examples/train_models.py --model all

Models: mlp, cnn (conv, batch norm, pooling), transformer
(nn.TransformerEncoder), lstm, dlrm-sgd and dlrm-adam (EmbeddingBag sum and
mean with offsets and per_sample_weights, a dense MLP and a pairwise dot
interaction). tests/python/test_models.py runs the same code.
"""

import argparse
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_phantom  # noqa: F401  (registers the device; autoload also does)

# Largest difference tolerated between the phantom and CPU losses and
# parameters. mlp, cnn, transformer and dlrm agree bit for bit; the LSTM
# differs in its parameters' last bits (phantom runs ATen's fused LSTM
# cell, the CPU its own RNN kernel).
RTOL = 1e-5
ATOL = 1e-5


class Batch(NamedTuple):
    inputs: Tuple[torch.Tensor, ...]
    target: torch.Tensor


class Spec(NamedTuple):
    make_model: Callable[[], nn.Module]
    make_batches: Callable[[int, torch.Generator], List[Batch]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Callable[[List[nn.Parameter]], torch.optim.Optimizer]


# --- MLP --------------------------------------------------------------------


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 32),
        nn.GELU(), nn.Linear(32, 5),
    )


def _mlp_batches(steps, gen):
    return [
        Batch((torch.randn(32, 20, generator=gen),), torch.randint(0, 5, (32,), generator=gen))
        for _ in range(steps)
    ]


# --- CNN --------------------------------------------------------------------


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
        nn.Linear(16, 10),
    )


def _cnn_batches(steps, gen):
    return [
        Batch((torch.randn(8, 3, 16, 16, generator=gen),), torch.randint(0, 10, (8,), generator=gen))
        for _ in range(steps)
    ]


# --- Transformer encoder ----------------------------------------------------


class _TransformerClassifier(nn.Module):
    def __init__(self, vocab=50, d_model=32, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(16, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens, padding_mask):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        x = self.encoder(x, src_key_padding_mask=padding_mask)
        return self.head(x.mean(dim=1))


def _transformer_batches(steps, gen):
    batches = []
    for _ in range(steps):
        tokens = torch.randint(0, 50, (6, 12), generator=gen)
        lengths = torch.randint(6, 13, (6,), generator=gen)
        padding = torch.arange(12)[None, :] >= lengths[:, None]
        batches.append(Batch((tokens, padding), torch.randint(0, 4, (6,), generator=gen)))
    return batches


# --- LSTM -------------------------------------------------------------------


class _LSTMRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1]).squeeze(1)


def _lstm_batches(steps, gen):
    return [
        Batch((torch.randn(4, 10, 8, generator=gen),), torch.randn(4, generator=gen))
        for _ in range(steps)
    ]


# --- DLRM -------------------------------------------------------------------


class _DLRM(nn.Module):
    """A small DLRM: a bottom MLP over dense features, one EmbeddingBag per
    sparse feature (sum with per-sample weights, sum, and mean; all with
    offsets), a pairwise dot-product interaction and a top MLP."""

    TABLES = ((40, "sum", True), (30, "sum", False), (25, "mean", False))
    DIM = 8

    def __init__(self):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, self.DIM), nn.ReLU())
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(rows, self.DIM, mode=mode) for rows, mode, _ in self.TABLES
        )
        features = 1 + len(self.TABLES)
        pairs = features * (features - 1) // 2
        self.top = nn.Sequential(nn.Linear(self.DIM + pairs, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, *sparse):
        x = self.bottom(dense)
        embedded = [x]
        for i, table in enumerate(self.tables):
            indices, offsets, weights = sparse[3 * i: 3 * i + 3]
            use_weights = self.TABLES[i][2]
            embedded.append(table(indices, offsets, per_sample_weights=weights if use_weights else None))
        features = torch.stack(embedded, dim=1)  # (batch, features, dim)
        dots = torch.bmm(features, features.transpose(1, 2))
        rows, cols = torch.triu_indices(features.shape[1], features.shape[1], offset=1)
        interaction = dots[:, rows.to(dots.device), cols.to(dots.device)]
        return self.top(torch.cat([x, interaction], dim=1)).squeeze(1)


def _dlrm_batches(steps, gen, batch=16):
    batches = []
    for _ in range(steps):
        dense = torch.randn(batch, 6, generator=gen)
        sparse = []
        for rows, _, _ in _DLRM.TABLES:
            lengths = torch.randint(1, 5, (batch,), generator=gen)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
            indices = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
            weights = torch.rand(indices.shape[0], generator=gen)
            sparse += [indices, offsets, weights]
        clicks = (torch.rand(batch, generator=gen) < 0.3).float()
        batches.append(Batch((dense, *sparse), clicks))
    return batches


MODELS: Dict[str, Spec] = {
    "mlp": Spec(_mlp, _mlp_batches, F.cross_entropy,
                lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "cnn": Spec(_cnn, _cnn_batches, F.cross_entropy,
                lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4)),
    "transformer": Spec(_TransformerClassifier, _transformer_batches, F.cross_entropy,
                        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "lstm": Spec(_LSTMRegressor, _lstm_batches, F.mse_loss,
                 lambda p: torch.optim.Adam(p, lr=1e-2)),
    "dlrm-sgd": Spec(_DLRM, _dlrm_batches, F.binary_cross_entropy_with_logits,
                     lambda p: torch.optim.SGD(p, lr=0.1)),
    "dlrm-adam": Spec(_DLRM, _dlrm_batches, F.binary_cross_entropy_with_logits,
                      lambda p: torch.optim.Adam(p, lr=1e-2)),
}


class Run(NamedTuple):
    losses: List[float]
    parameters: Dict[str, torch.Tensor]  # on the CPU
    seconds: float


def train(name: str, device: str, steps: int = 5, seed: int = 0) -> Run:
    """Trains model `name` on `device` for `steps` steps; deterministic for a
    given seed, whatever the device."""
    spec = MODELS[name]
    torch.manual_seed(seed)
    model = spec.make_model().to(device)  # initialised on the CPU
    batches = spec.make_batches(steps, torch.Generator().manual_seed(seed + 1))
    optimizer = spec.optimizer(list(model.parameters()))
    # Seed again: the CPU's generator was used to initialise the model, the
    # phantom one was not; dropout must start from the same state on both.
    torch.manual_seed(seed + 2)
    model.train()
    losses = []
    started = time.perf_counter()
    for batch in batches:
        inputs = [t.to(device) for t in batch.inputs]
        optimizer.zero_grad()
        loss = spec.loss(model(*inputs), batch.target.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - started
    parameters = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return Run(losses, parameters, seconds)


def compare(name: str, device: str = "phantom", steps: int = 5, verbose: bool = True) -> bool:
    phantom = train(name, device, steps)
    cpu = train(name, "cpu", steps)
    worst = 0.0
    if verbose:
        print(f"== {name}")
        print(f"{'step':>4}  {device + ' loss':>14}  {'cpu loss':>14}  {'|diff|':>9}")
    for step, (p, c) in enumerate(zip(phantom.losses, cpu.losses)):
        worst = max(worst, abs(p - c))
        if verbose:
            print(f"{step:>4}  {p:>14.6f}  {c:>14.6f}  {abs(p - c):>9.2e}")
    losses_ok = all(abs(p - c) <= ATOL + RTOL * abs(c) for p, c in zip(phantom.losses, cpu.losses))
    worst_param = max(
        (phantom.parameters[k].double() - cpu.parameters[k].double()).abs().max().item()
        for k in cpu.parameters if cpu.parameters[k].numel()
    )
    params_ok = all(
        torch.allclose(phantom.parameters[k].double(), cpu.parameters[k].double(), rtol=RTOL, atol=ATOL)
        for k in cpu.parameters
    )
    ok = losses_ok and params_ok
    if verbose:
        print(f"largest loss difference {worst:.2e}, parameter difference {worst_param:.2e}; "
              f"time {device} {phantom.seconds:.3f}s, cpu {cpu.seconds:.3f}s -> "
              f"{'OK' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", default="phantom")
    args = parser.parse_args()
    names = list(MODELS) if args.model == "all" else [args.model]
    failed = [n for n in names if not compare(n, args.device, args.steps)]
    if failed:
        print(f"FAILED: {', '.join(failed)} differ from the CPU")
        return 1
    print(f"OK: {', '.join(names)} match the CPU on {args.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
