"""The copying CPU fallback: ops on a driver without a kernel view.

Each test runs a fresh interpreter with ``PHANTOM_FAKE_NO_KERNEL_VIEW=1``
(the fake plays a discrete device's driver, whose table has no
``ph_kernel_address``) or with the remote driver, which has none either.
Every op other than factories, copies, views and ``item()`` then runs its
CPU kernel on host copies of the device memory it uses, with written
arguments copied back. What a user relies on: results equal the CPU's
(pointwise, reductions, matmul, in-place, ``out=``, writes through views,
indexing, a training step), the ``PHANTOM_CPU_FALLBACK`` policy (a warning
once per op by default, ``silent``, ``error``, a bad value refused), the
ops report's count, and a device out of memory being a clear error that
leaves nothing allocated.
"""

import json
import pathlib

import pytest
import torch_phantom

from conftest import run_python

NO_VIEW = {"PHANTOM_FAKE_NO_KERNEL_VIEW": "1", "PHANTOM_CPU_FALLBACK": "silent"}

REMOTE_DRIVER = pathlib.Path(torch_phantom.__file__).resolve().parent / "libphantom_remote.so"
REMOTE_SERVER = REMOTE_DRIVER.parent / "phantom_remote_server"


def run(code, env=None):
    result = run_python(code, {**NO_VIEW, **(env or {})}, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.requires_fake_driver("PHANTOM_FAKE_NO_KERNEL_VIEW is the fake driver's setting")
def test_the_fake_switch_takes_the_kernel_view_away():
    state = run("""
import json, torch, torch_phantom
from torch_phantom import _C
print(json.dumps({"view": _C._has_kernel_view()}))
""")
    assert state == {"view": False}
    result = run_python("import torch, torch_phantom\n"
                        "print(torch_phantom._C._has_kernel_view())",
                        {"PHANTOM_FAKE_NO_KERNEL_VIEW": "0"})
    assert result.returncode == 0 and result.stdout.split() == ["True"], result.stderr


_MATCHES_CPU = """
import json, torch, torch_phantom
torch.manual_seed(0)
def pair(*shape, dtype=torch.float32):
    x = torch.randn(*shape).to(dtype)
    return x, x.to("phantom")
checks = {}
def check(name, cpu, dev):
    if isinstance(cpu, (tuple, list)):
        checks[name] = all(check_one(c, d) for c, d in zip(cpu, dev))
    else:
        checks[name] = check_one(cpu, dev)
def check_one(cpu, dev):
    assert dev.device.type == "phantom", dev.device
    return cpu.shape == dev.shape and cpu.dtype == dev.dtype and \\
        torch.allclose(cpu, dev.cpu(), atol=1e-5, rtol=1e-5)

a, da = pair(4, 5); b, db = pair(4, 5); c, dc = pair(5)
# pointwise, with broadcasting and a CPU scalar
check("pointwise", a * b + c.sin() - 2, da * db + dc.sin() - 2)
check("where", torch.where(a > 0, a, b), torch.where(da > 0, da, db))
check("sum_dim", a.sum(1), da.sum(1))
check("mean", a.mean(), da.mean())
check("max_dim", a.max(dim=0), da.max(dim=0))
check("argmax", a.argmax(1), da.argmax(1))
m, dm = pair(5, 3)
check("matmul", a @ m, da @ dm)
bb, dbb = pair(2, 3, 4); bm, dbm = pair(2, 4, 6)
check("bmm", torch.bmm(bb, bm), torch.bmm(dbb, dbm))
# in-place, on the tensor and on a view: the base sees the write
x, dx = a.clone(), da.clone()
x.add_(b); dx.add_(db)
x[:, 1].mul_(3); dx[:, 1].mul_(3)
x.t()[2].zero_(); dx.t()[2].zero_()
check("in_place_and_views", x, dx)
# out=, including one the kernel has to resize
out, dout = torch.empty(0), torch.empty(0, device="phantom")
torch.add(a, b, out=out); torch.add(da, db, out=dout)
check("out_resized", out, dout)
out2, dout2 = torch.empty(4, 5), torch.empty(4, 5, device="phantom")
torch.mul(a, 2, out=out2); torch.mul(da, 2, out=dout2)
check("out", out2, dout2)
# a view result of a generic op shares the argument's memory
v, dv = a.clone(), da.clone()
dview = torch.diagonal(dv)
dview.fill_(7); torch.diagonal(v).fill_(7)
check("view_result", v, dv)
# a strided copy on the device (no copy kernel without the kernel view)
check("strided_copy", a.t().contiguous(), da.t().contiguous())
# indexing: gather, boolean masks, index_put_, scatter_
idx = torch.tensor([3, 0, 2])
check("index", a[idx], da[idx])
check("index_device_indices", a[idx], da[idx.to("phantom")])
check("mask", a[a > 0], da[da > 0])
y, dy = a.clone(), da.clone()
y[idx] = 1.5; dy[idx] = 1.5
y[y < 0] = 0; dy[dy < 0] = 0
check("index_put", y, dy)
s, ds = torch.zeros(3, 5), torch.zeros(3, 5, device="phantom")
si = torch.tensor([[0, 1, 2, 0, 1]])
s.scatter_(0, si, 1.0); ds.scatter_(0, si.to("phantom"), 1.0)
check("scatter", s, ds)
check("gather", a.gather(1, torch.tensor([[0], [4], [1], [2]])),
      da.gather(1, torch.tensor([[0], [4], [1], [2]], device="phantom")))
check("cat", torch.cat([a, b]), torch.cat([da, db]))
# fills: zero and one-byte values are the driver's memset, others copied
check("zeros", torch.zeros(3, 4), torch.zeros(3, 4, device="phantom"))
check("full", torch.full((3, 4), 2.5), torch.full((3, 4), 2.5, device="phantom"))
check("full_uint8", torch.full((9,), 7, dtype=torch.uint8),
      torch.full((9,), 7, dtype=torch.uint8, device="phantom"))
rows = {r["op"]: r for r in torch_phantom.ops_report()}
checks["no_native_or_queued_calls"] = all(
    r["native"] == 0 and r["async"] == 0 and r["sync"] == 0 for r in rows.values())
checks["copied_counted"] = rows["aten::mul"]["copied"] >= 2
print(json.dumps(checks))
"""


def test_ops_match_the_cpu_without_a_kernel_view():
    checks = run(_MATCHES_CPU)
    assert checks == {name: True for name in checks}, checks
    assert len(checks) >= 20


_MLP_STEP = """
import json, torch, torch_phantom
torch.manual_seed(0)
def mlp():  # batch norm: running statistics its schema does not declare written
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))
model, dev_model = mlp(), mlp()
dev_model.load_state_dict(model.state_dict())
dev_model.to("phantom")
x, target = torch.randn(32, 8), torch.randn(32, 4)
dx, dtarget = x.to("phantom"), target.to("phantom")
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1, momentum=0.9)
losses = []
for _ in range(3):
    for m, o, inp, tgt in ((model, opt, x, target), (dev_model, dev_opt, dx, dtarget)):
        o.zero_grad()
        loss = torch.nn.functional.mse_loss(m(inp), tgt)
        loss.backward()
        o.step()
        losses.append(loss.item())
dev_state = dev_model.state_dict()
same = all(torch.allclose(v, dev_state[k].cpu(), atol=1e-5)
           for k, v in model.state_dict().items())
print(json.dumps({"same_state": same,
                  "same_losses": all(abs(losses[i] - losses[i + 1]) < 1e-5
                                     for i in range(0, len(losses), 2)),
                  "loss_fell": losses[-1] < losses[0],
                  "device": str(next(dev_model.parameters()).device)}))
"""

_MLP_EXPECTED = {"same_state": True, "same_losses": True, "loss_fell": True,
                 "device": "phantom:0"}


def test_an_mlp_training_step_matches_the_cpu():
    assert run(_MLP_STEP) == _MLP_EXPECTED


@pytest.mark.skipif(not (REMOTE_DRIVER.exists() and REMOTE_SERVER.exists()),
                    reason="the remote driver is not installed next to the runtime")
def test_an_mlp_training_step_on_the_remote_driver():
    # The remote driver's table has no kernel view at all (NULL member).
    env = {"PHANTOM_DRIVER": str(REMOTE_DRIVER), "PHANTOM_DEVICE_COUNT": "1",
           "PHANTOM_DEVICE_MEMORY": "256MiB", "PHANTOM_FAKE_NO_KERNEL_VIEW": "0"}
    assert run(_MLP_STEP, env) == _MLP_EXPECTED


_DROPOUT = """
import json, torch, torch_phantom
x = torch.randn(5, 41, generator=torch.Generator().manual_seed(1))
grad = torch.randn(5, 41, generator=torch.Generator().manual_seed(2))
torch.manual_seed(7)
out_cpu, mask_cpu = torch.native_dropout(x, 0.3, True)
back_cpu = torch.ops.aten.native_dropout_backward(grad, mask_cpu, 1 / 0.7)
torch.manual_seed(7)
out, mask = torch.native_dropout(x.to("phantom"), 0.3, True)
back = torch.ops.aten.native_dropout_backward(grad.to("phantom"), mask, 1 / 0.7)
print(json.dumps({"mask": torch.equal(mask.cpu(), mask_cpu),
                  "out": torch.equal(out.cpu(), out_cpu),
                  "backward": torch.equal(back.cpu(), back_cpu)}))
"""


def test_dropout_matches_the_cpu_without_a_kernel_view():
    # With a kernel view dropout's products are one direct loop over
    # device memory; without one they must take the copying fallback.
    assert run(_DROPOUT) == {"mask": True, "out": True, "backward": True}


_WARNINGS = """
import json, warnings, torch, torch_phantom
a = torch.ones(3, device="phantom")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        b = a + a
        c = a * b
messages = [str(w.message) for w in caught]
print(json.dumps({"messages": messages, "value": c.cpu().tolist()}))
"""


def test_the_default_warns_once_per_op_naming_it_and_the_reason():
    state = run(_WARNINGS, {"PHANTOM_CPU_FALLBACK": ""})
    assert state["value"] == [2.0, 2.0, 2.0]
    messages = state["messages"]
    assert len(messages) == 2, messages
    assert messages[0].startswith("aten::add: driver has no kernel view; copying to the CPU")
    assert messages[1].startswith("aten::mul: driver has no kernel view; copying to the CPU")
    assert "PHANTOM_CPU_FALLBACK=silent" in messages[0]


def test_silent_runs_without_warnings():
    state = run(_WARNINGS, {"PHANTOM_CPU_FALLBACK": "Silent"})
    assert state == {"messages": [], "value": [2.0, 2.0, 2.0]}


def test_error_refuses_the_op_naming_it_and_the_setting():
    state = run("""
import json, torch, torch_phantom
x = torch.tensor([1.0, 2.0]).to("phantom")    # copies work
back = x[1:].cpu().tolist()                   # views and copies work
zeros = torch.zeros(2, device="phantom").cpu().tolist()  # a memset
try:
    x + x
    raised = None
except NotImplementedError as e:
    raised = str(e)
print(json.dumps({"back": back, "raised": raised, "still": x.cpu().tolist(),
                  "zeros": zeros}))
""", {"PHANTOM_CPU_FALLBACK": "error"})
    assert state["back"] == [2.0] and state["still"] == [1.0, 2.0]
    assert state["zeros"] == [0.0, 0.0]
    assert state["raised"] is not None
    assert state["raised"].startswith("aten::add: the driver has no kernel view")
    assert "PHANTOM_CPU_FALLBACK=error refuses that" in state["raised"]


def test_a_bad_setting_is_refused_naming_the_accepted_words():
    result = run_python("import torch_phantom", {**NO_VIEW, "PHANTOM_CPU_FALLBACK": "sometimes"})
    assert result.returncode != 0
    assert ("PHANTOM_CPU_FALLBACK='sometimes' is not one of the accepted words; accepted: "
            "one of warn, silent, error; unset it for the default warn") in result.stderr


def test_the_ops_report_counts_copied_calls_per_op():
    state = run("""
import json, torch, torch_phantom
a = torch.ones(4, device="phantom")
torch_phantom.reset_ops_report()
for _ in range(3):
    a = a + 1
a.sum()
rows = {r["op"]: r for r in torch_phantom.ops_report()}
print(json.dumps({op: [rows[op]["copied"], rows[op]["native"], rows[op]["async"]]
                  for op in ("aten::add", "aten::sum")}))
""")
    assert state == {"aten::add": [3, 0, 0], "aten::sum": [1, 0, 0]}


def test_out_of_memory_is_a_clear_error_and_leaves_nothing_allocated():
    state = run("""
import json, torch, torch_phantom
x = torch.ones(10 * 2**20 // 4, device="phantom")      # 10 MiB of a 16 MiB device
before = torch.phantom.memory_allocated()
try:
    x * 2                                             # the result does not fit
    error = None
except torch.OutOfMemoryError as e:
    error = type(e).__name__
after = torch.phantom.memory_allocated()
y = x[:4] * 3                                         # the device still works
print(json.dumps({"error": error, "leaked": after - before, "y": y.cpu().tolist()}))
""", {"PHANTOM_DEVICE_MEMORY": "16MiB"})
    assert state == {"error": "OutOfMemoryError", "leaked": 0, "y": [3.0] * 4}
