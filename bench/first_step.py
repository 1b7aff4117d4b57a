"""The first training step of each example model, phantom beside the CPU.

Design. A program's first step is where every call signature is new: the
step in which phantom's generic path learns each op's outputs (a trial run
of the CPU kernel on the host, docs/operators.md) and where anything
that waits would drain the queue. This script builds each model of
examples/train_models.py on phantom and on the CPU in one process, times
its first step (forward, loss, backward, optimizer step, then a sync) on
each, and counts the calls that waited on phantom (torch_phantom's ops
report). The models run in the order listed, in one process: the first
one also pays for first use of Python Meta kernels and allocator caches,
on both devices. Run it in a fresh process, a few times: single first
steps are noisy.

    PYTHONPATH=<build>/python python bench/first_step.py
"""
import sys
import time
from pathlib import Path

import torch
import torch_phantom

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_perf import train_models, training_step  # noqa: E402


def first_step_ms(spec, device):
    step = training_step(spec, device)
    torch.phantom.synchronize()
    start = time.perf_counter()
    step()
    torch.phantom.synchronize()
    return (time.perf_counter() - start) * 1e3


def main():
    print(f"{'model':<12} {'phantom':>10} {'cpu':>10} {'waits':>6}")
    for name, spec in train_models.MODELS.items():
        cpu = first_step_ms(spec, "cpu")
        torch_phantom.reset_ops_report()
        phantom = first_step_ms(spec, "phantom")
        waits = sum(row["sync"] for row in torch_phantom.ops_report())
        print(f"{name:<12} {phantom:>8.1f}ms {cpu:>8.1f}ms {waits:>6}")


if __name__ == "__main__":
    main()
