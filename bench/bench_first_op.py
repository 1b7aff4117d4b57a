"""The first operation of a fresh process, phantom beside the CPU.

Design. Every script, test process and DataLoader worker pays for its first
operation once; a benchmark that warms up never sees it. Each case here is
a short program run in a fresh Python process (`import torch`, then the
case's first call of each op, then a sync) once with device "cpu" and once
with "phantom", the order alternating, --rounds times. A child reports its
own wall time of the case (not of the import, which autoloading phantom
does not change) and the modules the case imported; the table gives the
median time per arm, phantom minus CPU in milliseconds (the figure of
merit: the target is at most 50 ms per case), whether the case pulled in
torch._dynamo or sympy on either device (torch's Python Meta kernels
import them on their first call; phantom's generic path runs them only
when a trial run of the CPU kernel cannot show an op's outputs
(docs/operators.md)), and the packages phantom imported that the CPU did
not. A case may import, before its clock starts, what both devices import
anyway: the training step's optimizer imports torch._dynamo on the CPU
too (torch.optim.Optimizer.__init__), so that import, about a second and
~830 modules, is made first and only the difference is measured.

    python bench/bench_first_op.py               # ~1 min
    python bench/bench_first_op.py --rounds 9 --out /tmp/first_op.json
"""
import argparse
import json
import statistics
import subprocess
import sys

# What a case imports before its clock starts, on both devices: what the
# CPU imports in the case anyway.
SETUP = {
    "train_step": "import torch._dynamo  # torch.optim.Optimizer.__init__ imports it",
}

CASES = {
    "randn": "r = torch.randn(256, 256, device=d)",
    "sin": "r = torch.ones(256, device=d).sin()",
    "matmul": "r = torch.ones(64, 64, device=d) @ torch.ones(64, 64, device=d)",
    "softmax": "r = torch.ones(8, 64, device=d).softmax(-1)",
    "conv2d": "r = torch.nn.functional.conv2d(torch.ones(1, 3, 16, 16, device=d), "
              "torch.ones(4, 3, 3, 3, device=d))",
    "cross_entropy": "r = torch.nn.functional.cross_entropy(torch.ones(8, 10, device=d), "
                     "torch.zeros(8, dtype=torch.long, device=d))",
    # integer tensors: the trial on zeros divides by zero (docs/operators.md)
    "int_divide": "r = torch.arange(1, 257, device=d) // torch.arange(1, 257, device=d)",
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
{setup}
before = set(sys.modules)
start = time.perf_counter()
{body}
if d != "cpu":
    torch.phantom.synchronize()
elapsed = time.perf_counter() - start
new = set(sys.modules) - before
print(json.dumps({{"ms": elapsed * 1e3, "modules": sorted(new),
                  "dynamo": "torch._dynamo" in new, "sympy": "sympy" in new}}))
"""


def run_child(name, device):
    program = CHILD.format(device=device, setup=SETUP.get(name, ""), body=CASES[name])
    out = subprocess.run([sys.executable, "-c", program],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def packages(modules):
    """Module names reduced to their package (`torch._dynamo.utils` to
    `torch._dynamo`, `sympy.core` to `sympy`), sorted."""
    return sorted({".".join(m.split(".")[:2]) if m.startswith("torch.") else m.split(".")[0]
                   for m in modules})


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
                last[device] = run_child(name, device)
                samples[device].append(last[device]["ms"])
        cpu = statistics.median(samples["cpu"])
        phantom = statistics.median(samples["phantom"])
        heavy = [m for m in ("dynamo", "sympy") if last["phantom"][m]]
        cpu_heavy = [m for m in ("dynamo", "sympy") if last["cpu"][m]]
        # Packages phantom's run imported that the CPU's did not (phantom's
        # own modules, torch_phantom.*, are imported at `import torch`).
        extra = packages(set(last["phantom"]["modules"]) - set(last["cpu"]["modules"]))
        results[name] = {"cpu_ms": cpu, "phantom_ms": phantom, "extra_ms": phantom - cpu,
                         "phantom_modules": len(last["phantom"]["modules"]),
                         "cpu_modules": len(last["cpu"]["modules"]),
                         "phantom_imports": heavy, "cpu_imports": cpu_heavy,
                         "phantom_only_packages": extra,
                         "imported_before": SETUP.get(name, "")}
        setup = " (torch._dynamo imported first, on both)" if name in SETUP else ""
        print(f"{name:<14} {cpu:>8.1f} {phantom:>11.1f} {phantom - cpu:>9.1f} "
              f"{len(last['phantom']['modules']):>8}  phantom: {', '.join(heavy) or '-'}"
              f"; cpu: {', '.join(cpu_heavy) or '-'}; phantom only: "
              f"{', '.join(extra) or '-'}{setup}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
