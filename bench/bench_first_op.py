"""The first operation of a fresh process, phantom beside the CPU.

Design. Every script, test process and DataLoader worker pays for its first
operation once; a benchmark that warms up never sees it. Each case here is
a short program run in a fresh Python process (`import torch`, then the
case's first call of each op, then a sync) once with device "cpu" and once
with "phantom", the order alternating, --rounds times. A child reports its
own wall time of the case (not of the import, which autoloading phantom
does not change) and the modules the case imported; the table gives the
median time per arm, phantom minus CPU in milliseconds (the figure of
merit: the target is at most 50 ms per case), and whether the case pulled
in torch._dynamo or sympy, which torch's Python Meta kernels import on
their first call (phantom's generic path avoids them where an op's output
shapes follow from its arguments' shapes; docs/performance.md).

    python bench/bench_first_op.py               # ~1 min
    python bench/bench_first_op.py --rounds 9 --out /tmp/first_op.json
"""
import argparse
import json
import statistics
import subprocess
import sys

CASES = {
    "randn": "r = torch.randn(256, 256, device=d)",
    "sin": "r = torch.ones(256, device=d).sin()",
    "matmul": "r = torch.ones(64, 64, device=d) @ torch.ones(64, 64, device=d)",
    "softmax": "r = torch.ones(8, 64, device=d).softmax(-1)",
    "conv2d": "r = torch.nn.functional.conv2d(torch.ones(1, 3, 16, 16, device=d), "
              "torch.ones(4, 3, 3, 3, device=d))",
    "cross_entropy": "r = torch.nn.functional.cross_entropy(torch.ones(8, 10, device=d), "
                     "torch.zeros(8, dtype=torch.long, device=d))",
    "inference": """with torch.no_grad():
    m = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).to(d).eval()
    r = m(torch.randn(2, 16, 64, device=d)).sum().item()""",
    "train_step": """m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                          torch.nn.Linear(64, 10)).to(d)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
loss = torch.nn.functional.mse_loss(m(torch.randn(16, 32, device=d)),
                                    torch.zeros(16, 10, device=d))
loss.backward(); opt.step(); r = loss.item()""",
}

CHILD = """
import json, sys, time
import torch
d = {device!r}
before = set(sys.modules)
start = time.perf_counter()
{body}
if d != "cpu":
    torch.phantom.synchronize()
elapsed = time.perf_counter() - start
new = set(sys.modules) - before
print(json.dumps({{"ms": elapsed * 1e3, "modules": len(new),
                  "dynamo": "torch._dynamo" in new, "sympy": "sympy" in new}}))
"""


def run_child(body, device):
    out = subprocess.run([sys.executable, "-c", CHILD.format(device=device, body=body)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=sorted(CASES))
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    results = {}
    print(f"{'case':<14} {'cpu ms':>8} {'phantom ms':>11} {'extra ms':>9} "
          f"{'modules':>8}  imports")
    for name in args.only or CASES:
        samples = {"cpu": [], "phantom": []}
        last = {}
        for r in range(args.rounds):
            for device in (("cpu", "phantom") if r % 2 == 0 else ("phantom", "cpu")):
                last[device] = run_child(CASES[name], device)
                samples[device].append(last[device]["ms"])
        cpu = statistics.median(samples["cpu"])
        phantom = statistics.median(samples["phantom"])
        heavy = [m for m in ("dynamo", "sympy") if last["phantom"][m]]
        cpu_heavy = [m for m in ("dynamo", "sympy") if last["cpu"][m]]
        results[name] = {"cpu_ms": cpu, "phantom_ms": phantom, "extra_ms": phantom - cpu,
                         "phantom_modules": last["phantom"]["modules"],
                         "phantom_imports": heavy, "cpu_imports": cpu_heavy}
        print(f"{name:<14} {cpu:>8.1f} {phantom:>11.1f} {phantom - cpu:>9.1f} "
              f"{last['phantom']['modules']:>8}  phantom: {', '.join(heavy) or '-'}"
              f"; cpu: {', '.join(cpu_heavy) or '-'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
