"""The first operation of a fresh process: fast, and as right as every later one.

Each test runs its program in a new Python process, because what is tested
is the first call of each op with a call signature, which the generic path
handles once per process (docs/operators.md, "The generic path").
"""
import json
import subprocess
import sys

import pytest


def run_fresh(body):
    """Runs `body` in a new interpreter after `import torch`; returns what
    it prints last, parsed as JSON."""
    program = "import json, sys\nimport torch\n" + body
    out = subprocess.run([sys.executable, "-c", program], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.no_race_detector(
    "torch wraps every dispatch mode's __torch_dispatch__, the race detector's "
    "too, in torch._dynamo.disable, which imports Dynamo and sympy at the first op")
def test_first_pointwise_and_random_ops_import_neither_dynamo_nor_sympy():
    # torch's Python Meta kernels for pointwise ops import torch._dynamo and
    # sympy (~800 modules, about a second) on their first call; the CPU
    # never runs them, and neither must phantom's first randn or sin.
    result = run_fresh("""
before = set(sys.modules)
torch.manual_seed(0)
x = torch.randn(64, 64, device="phantom")
y = (x.sin() * 2).exp_().clamp(max=3.0)
y.bernoulli_(0.5).uniform_()
z = torch.where(x > 0, x, y).cpu()
new = set(sys.modules) - before
torch.manual_seed(0)
xc = torch.randn(64, 64)
yc = (xc.sin() * 2).exp_().clamp(max=3.0)
yc.bernoulli_(0.5).uniform_()
zc = torch.where(xc > 0, xc, yc)
print(json.dumps({"dynamo": "torch._dynamo" in new, "sympy": "sympy" in new,
                  "same": torch.equal(z, zc)}))
""")
    assert result == {"dynamo": False, "sympy": False, "same": True}


@pytest.mark.parametrize("call, fragment", [
    ("torch.bitwise_and(a, a)", "bitwise_and"),
    ("torch.ones(3, device=a.device).add_(torch.ones(2, 3, device=a.device))",
     "doesn't match the broadcast shape"),
    ("torch.ones(2, device=a.device).lerp(torch.ones(3, device=a.device), 0.5)",
     "must match the size"),
])
def test_first_call_with_refused_arguments_raises_the_cpus_error_at_the_call(call, fragment):
    # The first call of a pointwise op skips the Meta kernel; arguments the
    # CPU kernel refuses must still raise at the call, with the CPU's error,
    # and leave the device usable.
    result = run_fresh(f"""
errors = {{}}
for device in ("cpu", "phantom"):
    a = torch.ones(3, device=device)
    try:
        {call}
        errors[device] = None
    except RuntimeError as e:
        errors[device] = str(e).splitlines()[0]
ok = (torch.ones(3, device="phantom") + 1).sum().item()
print(json.dumps({{"errors": errors, "after": ok}}))
""")
    assert result["errors"]["cpu"] is not None and fragment in result["errors"]["cpu"]
    assert result["errors"]["phantom"] == result["errors"]["cpu"]
    assert result["after"] == 6.0


def test_first_data_dependent_ops_still_wait_for_their_data():
    # Ops whose output shapes depend on the data keep the Meta kernel's
    # verdict: the first call must not be queued with a trial run's shapes.
    result = run_fresh("""
x = torch.tensor([0.0, 1.0, 2.0, 0.0, 3.0], device="phantom")
picked = x[x > 0].tolist()
nz = torch.nonzero(x).flatten().tolist()
print(json.dumps({"picked": picked, "nonzero": nz}))
""")
    assert result == {"picked": [1.0, 2.0, 3.0], "nonzero": [1, 2, 4]}
