"""Train a small MLP on the phantom device and on the CPU, side by side.

Both runs start from the same weights and see the same synthetic batches;
the phantom device computes with the CPU's kernels and draws the CPU's
random numbers, so the two loss curves must agree. The script prints one
line per step and exits with status 1 if they do not.

    python examples/train_mlp.py [--steps 20] [--device phantom:1]
"""

import argparse
import sys
import time

import torch
import torch_phantom  # noqa: F401  (registers the device; autoload also does)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(32, 128),
        torch.nn.ReLU(),
        torch.nn.Dropout(p=0.1),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 4),
    )


def make_data(steps: int, batch: int):
    generator = torch.Generator().manual_seed(1234)
    true_weights = torch.randn(32, 4, generator=generator)
    batches = []
    for _ in range(steps):
        inputs = torch.randn(batch, 32, generator=generator)
        labels = (inputs @ true_weights).argmax(dim=1)
        batches.append((inputs, labels))
    return batches


def train(device: str, batches, seed: int = 0):
    torch.manual_seed(seed)
    model = make_model().to(device)  # initialised on the CPU, then moved
    # Dropout draws from the device's generator: give the CPU run and the
    # phantom run the same generator state from here on.
    torch.manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    started = time.perf_counter()
    for inputs, labels in batches:
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="phantom")
    args = parser.parse_args()

    batches = make_data(args.steps, args.batch)
    phantom_losses, phantom_seconds = train(args.device, batches)
    cpu_losses, cpu_seconds = train("cpu", batches)

    print(f"{'step':>4}  {args.device + ' loss':>14}  {'cpu loss':>14}  {'|diff|':>9}")
    worst = 0.0
    for step, (p, c) in enumerate(zip(phantom_losses, cpu_losses)):
        worst = max(worst, abs(p - c))
        print(f"{step:>4}  {p:>14.6f}  {c:>14.6f}  {abs(p - c):>9.2e}")
    print(f"time: {args.device} {phantom_seconds:.3f}s, cpu {cpu_seconds:.3f}s "
          f"(ratio {phantom_seconds / cpu_seconds:.2f})")
    if worst > 1e-5 or phantom_losses[-1] >= phantom_losses[0]:
        print(f"FAILED: largest loss difference {worst:.2e}, or loss did not fall")
        return 1
    print(f"OK: {args.device} matches the CPU at every step "
          f"(largest difference {worst:.2e}); loss fell from "
          f"{phantom_losses[0]:.4f} to {phantom_losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
