"""The first operation of a fresh process: fast, and as right as every later one.

Each test runs its program in a new Python process, because what is tested
is the first call of each op with a call signature, which the generic path
handles once per process (docs/operators.md, "The generic path").
"""
import json
import subprocess
import sys

import pytest

NO_RACE_DETECTOR = pytest.mark.no_race_detector(
    "torch wraps every dispatch mode's __torch_dispatch__, the race detector's "
    "too, in torch._dynamo.disable, which imports Dynamo and sympy at the first op")


def run_fresh(body):
    """Runs `body` in a new interpreter after `import torch`; returns what
    it prints last, parsed as JSON."""
    program = "import json, sys\nimport torch\n" + body
    out = subprocess.run([sys.executable, "-c", program], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@NO_RACE_DETECTOR
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


# Programs whose ops' only Meta kernels are Python ones that import sympy
# (and torch._dynamo, through torch's elementwise type-promotion wrapper) on
# their first call: nll_loss_forward and its backward, the fused
# transformer encoder layer. Each defines `run(d)`, returning the tensors
# to compare; the same seed gives both devices the same weights and data
# (drawn on the CPU: phantom's generator is its own, and the weights'
# initialization draws from the CPU's).
FIRST_CALL_PROGRAMS = {
    "cross_entropy": """
def run(d):
    x = torch.randn(8, 10, device=d)
    target = torch.tensor([0, 3, 9, 1, 1, 7, 2, 5], device=d)
    return [torch.nn.functional.cross_entropy(x, target),
            torch.nn.functional.nll_loss(x.log_softmax(1), target, reduction="none")]
""",
    "transformer_layer_inference": """
def run(d):
    with torch.no_grad():
        m = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).to(d).eval()
        return [m(torch.randn(2, 16, 64).to(d))]
""",
    # Integer division: the trial on zeros divides by zero, and the trial on
    # ones that follows gives integer tensors ones only because these ops
    # are elementwise (no value is an index; other ops' integers stay zero).
    "integer_division": """
def run(d):
    a = torch.arange(-6, 6, device=d)
    b = torch.tensor([1, 2, 3, -4] * 3, device=d)
    return [a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")]
""",
    # torch.optim imports torch._dynamo on the CPU as well (its
    # Optimizer.__init__), so the step is written out.
    "mlp_training_step": """
def run(d):
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 10)).to(d)
    loss = torch.nn.functional.cross_entropy(
        m(torch.randn(16, 32).to(d)), torch.randint(0, 10, (16,)).to(d))
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(p.grad, alpha=-0.1)
    return [loss] + list(m.parameters())
""",
}


@NO_RACE_DETECTOR
@pytest.mark.parametrize("case", sorted(FIRST_CALL_PROGRAMS))
def test_first_call_of_ops_with_python_meta_kernels_imports_neither_dynamo_nor_sympy(case):
    # The trial run of the CPU kernel answers for these ops (their outputs
    # do not depend on the data: a second trial on other values agrees),
    # so their Python Meta kernels, and the ~800 modules they import, are
    # not needed; the CPU imports neither either. Results are the CPU's, bit
    # for bit.
    result = run_fresh(FIRST_CALL_PROGRAMS[case] + """
imported = {}
results = {}
for d in ("phantom", "cpu"):
    before = set(sys.modules)
    torch.manual_seed(0)
    results[d] = [t.detach().cpu() for t in run(d)]
    if d != "cpu":
        torch.phantom.synchronize()
    new = set(sys.modules) - before
    imported[d] = sorted(m for m in ("torch._dynamo", "sympy") if m in new)
same = all(torch.equal(a, b) for a, b in zip(results["phantom"], results["cpu"]))
print(json.dumps({"imported": imported, "same": same,
                  "count": [len(results["phantom"]), len(results["cpu"])]}))
""")
    assert result["imported"] == {"phantom": [], "cpu": []}
    assert result["same"] and result["count"][0] == result["count"][1]


@pytest.mark.parametrize("call, fragment", [
    ("torch.bitwise_and(a, a)", "bitwise_and"),
    ("torch.ones(3, device=a.device).add_(torch.ones(2, 3, device=a.device))",
     "doesn't match the broadcast shape"),
    ("torch.ones(2, device=a.device).lerp(torch.ones(3, device=a.device), 0.5)",
     "must match the size"),
    # nll_loss_forward's first call takes the trial run, not its Meta kernel
    ("torch.nn.functional.cross_entropy(torch.ones(8, 10, device=a.device), "
     "torch.zeros(8, 2, dtype=torch.long, device=a.device))", "multi-target not supported"),
    ("torch.nn.functional.nll_loss(torch.ones(8, 10, device=a.device), "
     "torch.zeros(8, dtype=torch.long, device=a.device), weight=torch.ones(3, device=a.device))",
     "weight tensor should be defined either for all 10 classes or no classes"),
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


def test_first_call_of_an_op_whose_outputs_depend_on_float_data_waits_without_its_meta_kernel():
    # An aten op that ATen does not tag as data-dependent, whose output
    # length is its input's count of positive values (defined here, with a
    # Meta kernel that records that it ran). Its first call is decided by
    # trial runs on zeros and on twos, which disagree: the call waits for
    # the real data and returns the CPU's result, instead of queuing the
    # zeros' empty one, and the Meta kernel (with the ~800 modules torch's
    # import) is not needed.
    result = run_fresh("""
meta_calls = []
lib = torch.library.Library("aten", "FRAGMENT")
lib.define("_phantom_test_positive(Tensor self) -> Tensor")
lib.impl("_phantom_test_positive", lambda x: x[x > 0], "CPU")
def meta(x):
    meta_calls.append(1)
    raise RuntimeError("the output length depends on the data")
lib.impl("_phantom_test_positive", meta, "Meta")
op = torch.ops.aten._phantom_test_positive.default
shapes = []
for values in ([0.0, 1.0, -2.0, 3.0], [5.0, 1.0, 2.0, 3.0]):
    x = torch.tensor(values)
    cpu, on_phantom = op(x), op(x.to("phantom")).cpu()
    shapes.append([list(cpu.shape), list(on_phantom.shape), torch.equal(cpu, on_phantom)])
print(json.dumps({"shapes": shapes, "meta_calls": len(meta_calls)}))
""")
    assert result == {"shapes": [[[2], [2], True], [[4], [4], True]], "meta_calls": 0}


@pytest.mark.requires_kernel_view(
    "without a kernel view the op runs on host copies at the call: no trial run, no Meta kernel")
def test_first_call_of_an_op_whose_outputs_depend_on_integer_values_asks_its_meta_kernel():
    # `_padded_dense_to_jagged_forward` without `total_L` returns as many
    # rows as its offsets' last value says, and ATen does not tag it as
    # data-dependent. Trial runs keep integer tensors at zero (a kernel that
    # trusts its offsets could run past the trial's buffers on any other
    # value), so they cannot show that the offsets' values do not matter:
    # its Meta kernel decides (here one that raises), and every call with
    # new offsets gets the CPU's shape.
    result = run_fresh("""
meta_calls = []
lib = torch.library.Library("aten", "IMPL")
def meta(padded, offsets, total_L=None):
    meta_calls.append(1)
    raise RuntimeError("the output length depends on the offsets' data")
lib.impl("_padded_dense_to_jagged_forward", meta, "Meta")
op = torch.ops.aten._padded_dense_to_jagged_forward.default
padded = torch.arange(3 * 4 * 2, dtype=torch.float).reshape(3, 4, 2)
results = []
for offsets in ([0, 2, 5, 9], [0, 1, 2, 3]):
    offsets = torch.tensor(offsets)
    cpu = op(padded, [offsets])
    on_phantom = op(padded.to("phantom"), [offsets.to("phantom")]).cpu()
    results.append([list(on_phantom.shape), torch.equal(cpu, on_phantom)])
print(json.dumps({"results": results, "meta_calls": len(meta_calls)}))
""")
    assert result == {"results": [[[9, 2], True], [[3, 2], True]], "meta_calls": 1}


def test_ops_whose_output_shapes_follow_integer_values_give_the_cpus_shapes_each_call():
    # repeat_interleave with a tensor of repeats and bincount: the same call
    # signature with other values must give the CPU's (other) shapes, not
    # the first call's, and values; the process must exit cleanly.
    result = run_fresh("""
out = []
for repeats, values in (([1, 0, 3], [0, 1, 1, 4]), ([2, 2, 2], [7, 0, 0, 1])):
    x = torch.tensor([1.0, 2.0, 3.0])
    r = torch.tensor(repeats)
    v = torch.tensor(values)
    cpu = [torch.repeat_interleave(x, r), torch.bincount(v), torch.repeat_interleave(r)]
    dev = [t.cpu() for t in (torch.repeat_interleave(x.to("phantom"), r.to("phantom")),
                             torch.bincount(v.to("phantom")),
                             torch.repeat_interleave(r.to("phantom")))]
    out.append([[list(c.shape) for c in cpu], all(torch.equal(c, p) for c, p in zip(cpu, dev)),
                [list(p.shape) for p in dev]])
print(json.dumps(out))
""")
    assert result == [[[[4], [5], [4]], True, [[4], [5], [4]]],
                      [[[6], [8], [6]], True, [[6], [8], [6]]]]


# segment_reduce and its backward trust their lengths and offsets: the
# backward walks `lengths` without checking that they sum to the data's
# length. A trial run that gave them values the caller did not (a second
# trial on twos once did) wrote past the trial's host buffers and
# corrupted the heap, which aborts the process ("double free or
# corruption") at the call or later, so each case runs in its own process
# and must exit cleanly.
SEGMENT_REDUCE = """
def run(d, reduce, kind, axis):
    torch.manual_seed(0)
    if axis == 0:
        data = torch.randn(6, 3, dtype=torch.float64)
        lengths = torch.tensor([1, 0, 3, 2])
        offsets = torch.tensor([0, 1, 1, 4, 6])
    else:
        data = torch.randn(2, 6, dtype=torch.float64)
        lengths = torch.tensor([[1, 0, 3, 2], [6, 0, 0, 0]])
        offsets = torch.tensor([[0, 1, 1, 4, 6], [0, 6, 6, 6, 6]])
    data = data.to(d).requires_grad_()
    segments = {kind: (lengths if kind == "lengths" else offsets).to(d)}
    y = torch.segment_reduce(data, reduce, axis=axis, unsafe=False,
                             initial=0.0 if reduce in ("max", "min", "prod") else None,
                             **segments)
    y.backward(torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).to(d))
    return y.detach().cpu(), data.grad.cpu()

same = {}
for reduce in ("sum", "mean", "max", "min", "prod"):
    for axis in (0, 1):
        cpu, on_phantom = run("cpu", reduce, KIND, axis), run("phantom", reduce, KIND, axis)
        # mean over an empty segment is NaN on both
        same[f"{reduce}, axis {axis}"] = all(
            torch.allclose(c, p, rtol=0, atol=0, equal_nan=True)
            for c, p in zip(cpu, on_phantom))
torch.phantom.synchronize()
print(json.dumps(same))
"""


@pytest.mark.parametrize("kind", ["lengths", "offsets"])
def test_segment_reduce_and_its_backward_equal_the_cpu_and_leave_the_heap_intact(kind):
    result = run_fresh(f"KIND = {kind!r}\n" + SEGMENT_REDUCE)
    assert result == {f"{reduce}, axis {axis}": True
                      for reduce in ("sum", "mean", "max", "min", "prod") for axis in (0, 1)}


def test_first_in_place_call_that_resizes_the_tensor_it_reads_equals_the_cpu():
    # addbmm_ on a one-element self broadcasts it into the product, then
    # resizes it to the product's shape. Queued work resizes the outputs
    # before the kernel runs, which would lose the broadcast value: though
    # trial runs could answer for addbmm_, its Meta kernel must decide
    # (it refuses that self), and the call waits and gives the CPU's values.
    result = run_fresh("""
torch.manual_seed(0)
s = torch.randn(1, dtype=torch.float64)
b1 = torch.randn(5, 5, 5, dtype=torch.float64)
b2 = torch.randn(5, 5, 10, dtype=torch.float64)
cpu = s.clone().addbmm_(b1, b2)
on_phantom = s.to("phantom").addbmm_(b1.to("phantom"), b2.to("phantom")).cpu()
print(json.dumps({"shape": list(on_phantom.shape), "same": torch.equal(cpu, on_phantom)}))
""")
    assert result == {"shape": [5, 10], "same": True}
