"""Every op phantom registers a kernel of its own for, over every pair of
dtypes: what the CPU refuses is refused at the call with the CPU's exception
type and message, what the CPU accepts gives the CPU's result bit for bit,
and nothing is left queued that fails at the next sync.

A native kernel queues the CPU's implementation; one that took a dtype the
implementation refuses would fail later, on the stream, and its result
would read as garbage (docs/operators.md, "Native kernels"). The ops
come from the dispatcher (every aten op with a PrivateUse1 kernel), so a new
native kernel fails test_every_registered_kernel_is_covered until a call
template below covers it.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.requires_kernel_view(
    "checks the native kernels, which run over the kernel view")

P = torch.phantom

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
]


def T(shape, dtype):
    """Small positive values (1, 2, 3, ...) that every dtype holds."""
    base = torch.arange(math.prod(shape), dtype=torch.float32) % 3 + 1
    return base.reshape(shape).to(dtype)


class Case:
    """A call of one registered op: `build(dtypes)` gives `(fn, tensors)`
    for `slots` dtypes; `fn` runs on the CPU tensors and on their phantom
    copies. `values=False`: compare dtype and shape only (uninitialised
    memory); `close=True`: values within assert_close's tolerances, not bit
    for bit. `other_route`: why torch itself runs the call another way on an
    accelerator than on the CPU: its checks come in another order, so that
    a call the CPU refuses must be refused at the call too, but the error
    may be another (the one CUDA gives)."""

    def __init__(self, ops, slots, build, values=True, close=False, other_route=None):
        self.ops = ops if isinstance(ops, (list, tuple)) else [ops]
        self.slots = slots
        self.build = build
        self.values = values
        self.close = close
        self.other_route = other_route


def _embedding_bag_grads(weight, indices):
    grads = []
    for sparse in (True, False):
        w = weight.detach().requires_grad_()
        out = F.embedding_bag(indices, w, mode="sum", sparse=sparse)
        (g,) = torch.autograd.grad(out.sum(), w)
        grads.append(g.to_dense() if sparse else g)
    return grads


def _embedding_bag_forms(weight, indices, per_sample_weights):
    """_embedding_bag and _embedding_bag_forward_only, all four outputs, in
    each mode; offsets 0 and 2 as `indices`' dtype (the CPU refuses offsets
    of another dtype than the indices, and the values of floats)."""
    offsets = torch.tensor([0, 2]).to(device=indices.device, dtype=indices.dtype)
    indices = indices - 1  # 0, 1, 2, 0
    results = []
    for op in (torch.ops.aten._embedding_bag, torch.ops.aten._embedding_bag_forward_only):
        for mode in (0, 1, 2):
            results.append(op(weight, indices, offsets, False, mode, False))
        results.append(op(weight, indices, offsets, False, 0, False, per_sample_weights))
    return results


# On any device but the CPU, ATen's LSTM and GRU cells multiply with
# matmul and call the fused cell kernel (CUDA's route, which phantom's
# FusedRnnCells.cpp implements with its own formula); the CPU calls linear.
# So a dtype mismatch is reported by mm ("expected m1 and m2 to have the
# same dtype") where the CPU's linear says "mat1 and mat2 must have the same
# dtype", integer gates by the fused kernel (NotImplementedError, as
# CUDA's), and results agree to rounding.
CELL_ROUTE = "ATen's RNN cells take the fused-kernel route on accelerators"


def binary(fn, a=(3, 4), b=(4,)):
    return lambda d: (fn, [T(a, d[0]), T(b, d[1])])


def unary(fn, shape=(3, 4)):
    return lambda d: (fn, [T(shape, d[0])])


def _foreach(fn, lists):
    """`lists` tensor lists of two tensors each; list k has dtype d[k]."""
    def build(d):
        tensors = [T(shape, d[k]) for k in range(lists) for shape in ((3,), (2, 2))]
        return (lambda *t: fn(*[list(t[2 * k:2 * k + 2]) for k in range(lists)])), tensors
    return build


def _cell(cell, gates):
    def build(d):
        x, h = T((2, 3), d[0]), T((2, 4), d[1])
        w_ih = (T((gates * 4, 3), torch.float32) / 8).to(d[1])
        w_hh = (T((gates * 4, 4), torch.float32) / 8).to(d[1])
        b_ih, b_hh = T((gates * 4,), d[1]), T((gates * 4,), d[1])
        if cell == "lstm":
            return (lambda x, h, c, a, b, e, f: torch.lstm_cell(x, (h, c), a, b, e, f)), [
                x, h, T((2, 4), d[1]), w_ih, w_hh, b_ih, b_hh]
        return (lambda x, h, a, b, e, f: torch.gru_cell(x, h, a, b, e, f)), [
            x, h, w_ih, w_hh, b_ih, b_hh]
    return build


def _cell_backward(cell, gates):
    forward = _cell(cell, gates)

    def build(d):
        fn, tensors = forward(d)

        def grads(*t):
            t = [x.detach().requires_grad_() for x in t]
            out = fn(*t)
            out = out[0] if isinstance(out, tuple) else out
            return torch.autograd.grad(out.sum(), t)
        return grads, tensors
    return build


def _with_out(fn, out_shape):
    def build(d):
        return fn, [T((3, 4), d[0]), T((4,), d[1]), T(out_shape, d[2])]
    return build


def _set_storage_offset(a, b):
    """`a` viewed over `b`'s bytes from its second element, in bounds."""
    count = b.untyped_storage().nbytes() // a.element_size()
    return a.set_(b.untyped_storage(), 1, (max(count - 1, 0),), (1,))


SCALARS = {"int": 2, "float": 2.5, "bool": True, "complex": 1j, "huge": 1e10,
           "byte-overflow": 300, "negative": -1, "nan": float("nan"), "inf": float("inf")}

CASES = {
    # --- ops/Elementwise.cpp
    **{f"{name}": Case(f"aten::{name}.Tensor", 2, binary(getattr(torch, name)))
       for name in ("add", "sub", "mul", "div")},
    **{f"{name}-alpha": Case(f"aten::{name}.Tensor", 2,
                             binary(lambda a, b, op=getattr(torch, name): op(a, b, alpha=2)))
       for name in ("add", "sub")},
    **{f"{name}-alpha-{kind}": Case(
        f"aten::{name}.Tensor", 1,
        unary(lambda a, op=getattr(torch, name), v=SCALARS[kind]: op(a, a, alpha=v)))
       for name in ("add", "sub") for kind in ("float", "huge", "complex", "bool")},
    **{f"{name}-scalar-{kind}": Case(
        f"aten::{name}.Tensor", 1, unary(lambda a, op=getattr(torch, name), v=v: op(a, v)))
       for name in ("add", "sub", "mul", "div") for kind, v in SCALARS.items()
       if kind in ("int", "float", "bool", "complex", "huge")},
    **{f"{name}_": Case(f"aten::{name}_.Tensor", 2,
                        binary(lambda a, b, n=name: getattr(a, n + "_")(b), (3, 4), (4,)))
       for name in ("add", "sub", "mul", "div")},
    **{f"{name}_-scalar-{kind}": Case(
        f"aten::{name}_.Tensor", 1, unary(lambda a, n=name, v=v: getattr(a, n + "_")(v)))
       for name in ("add", "sub", "mul", "div") for kind, v in SCALARS.items()
       if kind in ("int", "float", "bool", "huge")},
    **{f"{name}-out": Case(f"aten::{name}.out", 3,
                           _with_out(lambda a, b, o, op=getattr(torch, name): op(a, b, out=o),
                                     (3, 4)))
       for name in ("add", "sub", "mul", "div")},
    "relu": Case("aten::relu", 1, unary(torch.relu)),
    "relu_": Case("aten::relu_", 1, unary(torch.relu_)),
    # --- ops/Structured.cpp
    "mm": Case("aten::mm", 2, binary(torch.mm, (3, 4), (4, 2))),
    "bmm": Case("aten::bmm", 2, binary(torch.bmm, (2, 3, 4), (2, 4, 2))),
    "addmm": Case("aten::addmm", 3, lambda d: (
        torch.addmm, [T((2,), d[0]), T((3, 4), d[1]), T((4, 2), d[2])])),
    "addmm-huge-alpha": Case("aten::addmm", 1, lambda d: (
        lambda b, x, y: torch.addmm(b, x, y, alpha=1e10),
        [T((2,), d[0]), T((3, 4), d[0]), T((4, 2), d[0])])),
    "sum": Case("aten::sum.dim_IntList", 1, unary(lambda a: a.sum(1))),
    "sum-all": Case("aten::sum.dim_IntList", 1, unary(lambda a: a.sum())),
    "sum-dtype": Case("aten::sum.dim_IntList", 2, lambda d: (
        lambda a: a.sum(1, dtype=d[1]), [T((3, 4), d[0])])),
    "mean": Case("aten::mean.dim", 1, unary(lambda a: a.mean(1))),
    "cumsum": Case("aten::cumsum", 1, unary(lambda a: a.cumsum(1))),
    "cumsum-dtype": Case("aten::cumsum", 2, lambda d: (
        lambda a: a.cumsum(0, dtype=d[1]), [T((3, 4), d[0])])),
    # self and source (d[0]), index (d[1]): values 1, 2, 3 -> rows 0, 1, 2.
    "index_add": Case("aten::index_add", 2, lambda d: (
        lambda a, i: a.index_add(0, i - 1, a[:3] * 2),
        [T((4, 3), d[0]), T((3,), d[1])])),
    "mean-dtype": Case("aten::mean.dim", 2, lambda d: (
        lambda a: a.mean(1, dtype=d[1]), [T((3, 4), d[0])])),
    "_softmax": Case("aten::_softmax", 1, unary(lambda a: torch._softmax(a, 1, False))),
    "_softmax-half_to_float": Case(
        "aten::_softmax", 1, unary(lambda a: torch._softmax(a, 1, True))),
    "_log_softmax": Case("aten::_log_softmax", 1,
                         unary(lambda a: torch._log_softmax(a, 0, False))),
    "_softmax_backward_data": Case("aten::_softmax_backward_data", 2, lambda d: (
        lambda g, o: torch._softmax_backward_data(g, o, 1, d[0]),
        [T((3, 4), d[0]), T((3, 4), d[1])])),
    "_log_softmax_backward_data": Case("aten::_log_softmax_backward_data", 2, lambda d: (
        lambda g, o: torch._log_softmax_backward_data(g, o, 1, d[1]),
        [T((3, 4), d[0]), T((3, 4), d[1])])),
    "sigmoid": Case("aten::sigmoid", 1, unary(torch.sigmoid)),
    "tanh": Case("aten::tanh", 1, unary(torch.tanh)),
    "gelu": Case("aten::gelu", 1, unary(F.gelu)),
    "gelu-tanh": Case("aten::gelu", 1, unary(lambda a: F.gelu(a, approximate="tanh"))),
    "threshold_backward": Case("aten::threshold_backward", 2, binary(
        lambda g, x: torch.ops.aten.threshold_backward(g, x, 1), (3, 4), (3, 4))),
    "threshold_backward-huge": Case("aten::threshold_backward", 1, unary(
        lambda g: torch.ops.aten.threshold_backward(g, g, 1e10))),
    "sigmoid_backward": Case("aten::sigmoid_backward", 2, binary(
        torch.ops.aten.sigmoid_backward, (3, 4), (3, 4))),
    "tanh_backward": Case("aten::tanh_backward", 2, binary(
        torch.ops.aten.tanh_backward, (3, 4), (3, 4))),
    "gelu_backward": Case("aten::gelu_backward", 2, binary(
        torch.ops.aten.gelu_backward, (3, 4), (3, 4))),
    "dot": Case("aten::dot", 2, binary(torch.dot, (4,), (4,))),
    "dot-sizes": Case("aten::dot", 2, binary(torch.dot, (4,), (3,))),
    "max": Case("aten::max", 1, unary(torch.max)),
    "max-empty": Case("aten::max", 1, lambda d: (torch.max, [T((0,), d[0])])),
    "neg": Case("aten::neg", 1, unary(torch.neg)),
    "reciprocal": Case("aten::reciprocal", 1, unary(torch.reciprocal)),
    **{f"pow-scalar-{kind}": Case(
        "aten::pow.Tensor_Scalar", 1, unary(lambda a, v=v: torch.pow(a, v)))
       for kind, v in SCALARS.items()},
    **{f"{name}": Case(f"aten::{name}.Tensor", 2, binary(getattr(torch, name)))
       for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{f"{name}-scalar-{kind}": Case(
        f"aten::{name}.Scalar", 1, unary(lambda a, op=getattr(torch, name), v=v: op(a, v)))
       for name in ("eq", "ne", "lt", "le", "gt", "ge") for kind, v in SCALARS.items()},
    "cat": Case("aten::cat", 2, binary(lambda a, b: torch.cat([a, b]), (2, 4), (3, 4))),
    "cat-dim1": Case("aten::cat", 2, binary(lambda a, b: torch.cat([a, b], 1), (2, 4), (2, 1))),
    # --- ops/LayerNorm.cpp
    "native_layer_norm": Case("aten::native_layer_norm", 3, lambda d: (
        lambda x, w, b: torch.native_layer_norm(x, [4], w, b, 1e-5),
        [T((3, 4), d[0]), T((4,), d[1]), T((4,), d[2])])),
    "native_layer_norm_backward": Case("aten::native_layer_norm_backward", 6, lambda d: (
        lambda g, x, m, r, w, b: torch.ops.aten.native_layer_norm_backward(
            g, x, [4], m, r, w, b, [True, True, True]),
        [T((3, 4), d[0]), T((3, 4), d[1]), T((3, 1), d[2]), T((3, 1), d[3]),
         T((4,), d[4]), T((4,), d[5])])),
    # --- ops/Foreach.cpp
    "_foreach_add_.List": Case("aten::_foreach_add_.List", 2, _foreach(
        lambda a, b: torch._foreach_add_(a, b, alpha=2), 2)),
    "_foreach_add_.List-huge": Case("aten::_foreach_add_.List", 2, _foreach(
        lambda a, b: torch._foreach_add_(a, b, alpha=1e10), 2)),
    "_foreach_add.List": Case("aten::_foreach_add.List", 2, _foreach(
        lambda a, b: torch._foreach_add(a, b, alpha=0.5), 2)),
    "_foreach_add_.Scalar": Case("aten::_foreach_add_.Scalar", 1, _foreach(
        lambda a: torch._foreach_add_(a, 0.5), 1)),
    "_foreach_add_.Scalar-huge": Case("aten::_foreach_add_.Scalar", 1, _foreach(
        lambda a: torch._foreach_add_(a, 1e10), 1)),
    "_foreach_mul_.Scalar": Case("aten::_foreach_mul_.Scalar", 1, _foreach(
        lambda a: torch._foreach_mul_(a, 0.9), 1)),
    "_foreach_mul_.Scalar-int": Case("aten::_foreach_mul_.Scalar", 1, _foreach(
        lambda a: torch._foreach_mul_(a, 3), 1)),
    "_foreach_mul_.Tensor": Case("aten::_foreach_mul_.Tensor", 2, lambda d: (
        lambda a, b, c: torch._foreach_mul_([a, b], c),
        [T((3,), d[0]), T((2, 2), d[0]), T((), d[1])])),
    "_foreach_div_.ScalarList": Case("aten::_foreach_div_.ScalarList", 1, _foreach(
        lambda a: torch._foreach_div_(a, [2.0, 0.5]), 1)),
    "_foreach_lerp_.Scalar": Case("aten::_foreach_lerp_.Scalar", 2, _foreach(
        lambda a, b: torch._foreach_lerp_(a, b, 0.25), 2)),
    "_foreach_addcmul_.Scalar": Case("aten::_foreach_addcmul_.Scalar", 3, _foreach(
        lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.5), 3)),
    "_foreach_addcdiv_.Scalar": Case("aten::_foreach_addcdiv_.Scalar", 3, _foreach(
        lambda a, b, c: torch._foreach_addcdiv_(a, b, c, value=-0.5), 3)),
    "_foreach_addcdiv_.ScalarList": Case("aten::_foreach_addcdiv_.ScalarList", 3, _foreach(
        lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.5, 2.0]), 3)),
    "_foreach_sqrt": Case("aten::_foreach_sqrt", 1, _foreach(torch._foreach_sqrt, 1)),
    "_foreach_norm": Case("aten::_foreach_norm.Scalar", 1, _foreach(torch._foreach_norm, 1)),
    "_foreach_norm-dtype": Case("aten::_foreach_norm.Scalar", 2, lambda d: (
        lambda a, b: torch._foreach_norm([a, b], 2, dtype=d[1]),
        [T((3,), d[0]), T((2, 2), d[0])])),
    # --- ops/Scalars.cpp
    **{f"fill_-{kind}": Case("aten::fill_.Scalar", 1, unary(lambda a, v=v: a.fill_(v)))
       for kind, v in SCALARS.items()},
    "fill_.Tensor": Case("aten::fill_.Tensor", 2, binary(lambda a, v: a.fill_(v), (3, 4), ())),
    "fill_.Tensor-cpu-value": Case("aten::fill_.Tensor", 2, binary(
        lambda a, v: a.fill_(v.cpu()), (3, 4), ())),
    "zero_": Case("aten::zero_", 1, unary(torch.zero_)),
    "item": Case("aten::_local_scalar_dense", 1, unary(lambda a: a.item(), (1,))),
    # --- ops/Copy.cpp
    "copy_": Case("aten::_copy_from", 2, binary(lambda a, b: a.copy_(b), (3, 4), (3, 4))),
    "copy_-broadcast": Case("aten::_copy_from", 2, binary(lambda a, b: a.copy_(b))),
    "to-dtype": Case("aten::_copy_from", 2, lambda d: (
        lambda a: a.to(d[1]), [T((3, 4), d[0])])),
    "to-cpu-and-back": Case("aten::_copy_from", 2, lambda d: (
        lambda a: a.to("cpu", d[1]).to(a.device), [T((3, 4), d[0])])),
    # --- ops/Convolution.cpp, ops/FusedRnnCells.cpp, ops/Dropout.cpp
    "conv1d": Case("aten::convolution_overrideable", 3, lambda d: (
        F.conv1d, [T((1, 2, 5), d[0]), T((3, 2, 2), d[1]), T((3,), d[2])])),
    "convolution_backward": Case("aten::convolution_backward_overrideable", 3, lambda d: (
        lambda g, x, w: torch.ops.aten.convolution_backward(
            g, x, w, [3], [1], [0], [1], False, [0], 1, [True, True, True]),
        [T((1, 3, 4), d[0]), T((1, 2, 5), d[1]), T((3, 2, 2), d[2])])),
    "lstm_cell": Case("aten::_thnn_fused_lstm_cell", 2, _cell("lstm", 4),
                      close=True, other_route=CELL_ROUTE),
    "lstm_cell-backward": Case(
        "aten::_thnn_fused_lstm_cell_backward_impl", 2, _cell_backward("lstm", 4),
        close=True, other_route=CELL_ROUTE),
    "gru_cell": Case("aten::_thnn_fused_gru_cell", 2, _cell("gru", 3),
                     close=True, other_route=CELL_ROUTE),
    "gru_cell-backward": Case(
        "aten::_thnn_fused_gru_cell_backward", 2, _cell_backward("gru", 3),
        close=True, other_route=CELL_ROUTE),
    "native_dropout": Case("aten::native_dropout", 1, unary(
        lambda a: torch.native_dropout(a, 0.5, True))),
    "native_dropout-eval": Case("aten::native_dropout", 1, unary(
        lambda a: torch.native_dropout(a, 0.5, False))),
    "native_dropout_backward": Case("aten::native_dropout_backward", 2, binary(
        lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 2.0), (3, 4), (3, 4))),
    # --- ops/Views.cpp, ops/Factories.cpp, ops/ShallowCopyType.cpp
    "view": Case("aten::view", 1, unary(lambda a: a.view(12))),
    "_reshape_alias": Case("aten::_reshape_alias", 1, unary(
        lambda a: torch.ops.aten._reshape_alias(a, [12], [1]))),
    "as_strided": Case("aten::as_strided", 1, unary(lambda a: a.as_strided((2, 2), (1, 2)))),
    "unfold": Case("aten::unfold", 1, unary(lambda a: a.unfold(1, 2, 1))),
    "view_as_real": Case("aten::view_as_real", 1, unary(torch.view_as_real)),
    "view_as_complex": Case("aten::view_as_complex", 1, unary(torch.view_as_complex, (3, 2))),
    "resize_": Case("aten::resize_", 1, unary(lambda a: a.resize_(2, 6))),
    "set_-empty": Case("aten::set_", 1, unary(lambda a: a.set_())),
    "set_.source_Tensor": Case("aten::set_.source_Tensor", 2, binary(
        lambda a, b: a.set_(b), (3, 4), (3, 4))),
    "set_.source_Storage": Case("aten::set_.source_Storage", 2, binary(
        lambda a, b: a.set_(b.untyped_storage()), (3, 4), (3, 4))),
    "set_.source_Storage_storage_offset": Case(
        "aten::set_.source_Storage_storage_offset", 2, binary(_set_storage_offset, (3, 4), (3, 4))),
    "empty": Case(["aten::empty.memory_format"], 1, unary(
        lambda a: torch.empty(3, dtype=a.dtype, device=a.device)), values=False),
    "empty_strided": Case("aten::empty_strided", 1, unary(
        lambda a: torch.empty_strided((2, 2), (1, 2), dtype=a.dtype, device=a.device)),
        values=False),
    "_has_compatible_shallow_copy_type": Case(
        "aten::_has_compatible_shallow_copy_type", 2, binary(
            torch._has_compatible_shallow_copy_type)),
    # --- CPU composites routed to the generic path (ops/Fallback.cpp)
    "addr": Case("aten::addr", 3, lambda d: (
        torch.addr, [T((3, 2), d[0]), T((3,), d[1]), T((2,), d[2])])),
    "addr-out": Case("aten::addr.out", 3, lambda d: (
        lambda m, v, o: torch.addr(m, v, v[:2], out=o),
        [T((3, 2), d[0]), T((3,), d[1]), T((3, 2), d[2])])),
    "addr_": Case("aten::addr_", 3, lambda d: (
        lambda m, v, w: m.addr_(v, w), [T((3, 2), d[0]), T((3,), d[1]), T((2,), d[2])])),
    "native_group_norm": Case("aten::native_group_norm", 3, lambda d: (
        lambda x, w, b: torch.native_group_norm(x, w, b, 2, 4, 3, 2, 1e-5),
        [T((2, 4, 3), d[0]), T((4,), d[1]), T((4,), d[2])])),
    "mode-out": Case("aten::mode.values", 2, lambda d: (
        lambda a, v, i: torch.mode(a, 1, out=(v, i)),
        [T((3, 4), d[0]), T((3,), d[1]), T((3,), torch.int64)])),
    "conj_physical_": Case("aten::conj_physical_", 1, unary(torch.conj_physical_)),
    "mse_loss": Case("aten::mse_loss", 2, binary(F.mse_loss, (3, 4), (3, 4))),
    "smooth_l1_loss": Case("aten::smooth_l1_loss", 2, binary(F.smooth_l1_loss, (3, 4), (3, 4))),
    # Structured ops routed to the generic path so that their meta
    # function runs once (its warnings, a boolean mask's count). The index
    # slot takes every dtype: integer indices 1 and 2, masks of all True.
    "index": Case("aten::index.Tensor", 2, lambda d: (
        lambda a, i: a[i], [T((3, 4), d[0]), T((2,), d[1])])),
    "index_reduce": Case("aten::index_reduce", 3, lambda d: (
        lambda a, i, s: a.index_reduce(0, i, s, "prod"),
        [T((3, 4), d[0]), T((2,), d[1]), T((2, 4), d[2])])),
    "index_reduce_": Case("aten::index_reduce_", 3, lambda d: (
        lambda a, i, s: a.index_reduce_(0, i, s, "amax", include_self=False),
        [T((3, 4), d[0]), T((2,), d[1]), T((2, 4), d[2])])),
    "scatter-reduce": Case("aten::scatter.reduce", 3, lambda d: (
        lambda a, i, s: torch.scatter(a, 1, i, s, reduce="add"),
        [T((3, 4), d[0]), T((2, 3), d[1]), T((2, 3), d[2])])),
    "scatter_-reduce": Case("aten::scatter_.reduce", 3, lambda d: (
        lambda a, i, s: a.scatter_(1, i, s, reduce="multiply"),
        [T((3, 4), d[0]), T((2, 3), d[1]), T((2, 3), d[2])])),
    "scatter-value_reduce": Case("aten::scatter.value_reduce", 2, lambda d: (
        lambda a, i: torch.scatter(a, 1, i, 2, reduce="add"),
        [T((3, 4), d[0]), T((2, 3), d[1])])),
    "scatter_-value_reduce": Case("aten::scatter_.value_reduce", 2, lambda d: (
        lambda a, i: a.scatter_(1, i, 2, reduce="multiply"),
        [T((3, 4), d[0]), T((2, 3), d[1])])),
    # --- Dense arguments, sparse results (ops/SparseLayouts.cpp): the sparse
    # generic path; results compared through to_dense().
    "_to_sparse": Case("aten::_to_sparse", 1, unary(lambda a: a.to_sparse().to_dense())),
    "_to_sparse-sparse_dim": Case("aten::_to_sparse.sparse_dim", 1,
                                  unary(lambda a: a.to_sparse(1).to_dense())),
    "_to_sparse_csr": Case("aten::_to_sparse_csr", 1,
                           unary(lambda a: a.to_sparse_csr().to_dense())),
    "_to_sparse_csc": Case("aten::_to_sparse_csc", 1,
                           unary(lambda a: a.to_sparse_csc().to_dense())),
    "_to_sparse_bsr": Case("aten::_to_sparse_bsr", 1,
                           unary(lambda a: a.to_sparse_bsr((1, 2)).to_dense())),
    "_to_sparse_bsc": Case("aten::_to_sparse_bsc", 1,
                           unary(lambda a: a.to_sparse_bsc((1, 2)).to_dense())),
    # --- Strided nested tensors built from dense arguments and CPU metadata
    # (ops/NestedTensors.cpp): ATen's kernel shared by CPU and CUDA; nested
    # results compared padded.
    "_nested_from_padded": Case("aten::_nested_from_padded", 1, unary(
        lambda p: torch._nested_from_padded(
            p, torch.tensor([[2, 4], [3, 4]])).to_padded_tensor(0), (2, 3, 4))),
    "_nested_view_from_buffer": Case("aten::_nested_view_from_buffer", 1, unary(
        lambda b: torch._nested_view_from_buffer(
            b, torch.tensor([[2, 3], [2, 3]]), torch.tensor([[3, 1], [3, 1]]),
            torch.tensor([0, 6])).to_padded_tensor(0), (12,))),
    "_nested_tensor_from_mask": Case("aten::_nested_tensor_from_mask", 2, lambda d: (
        lambda p, m: torch._nested_tensor_from_mask(p, m > 1).to_padded_tensor(0),
        [T((2, 3, 4), d[0]), T((2, 3), d[1])])),
    "_nested_tensor_from_mask_left_aligned": Case(
        "aten::_nested_tensor_from_mask_left_aligned", 2, lambda d: (
            lambda p, m: torch._nested_tensor_from_mask_left_aligned(p, m),
            [T((2, 3, 4), d[0]), T((2, 3), d[1])])),
    # sparse=False: the CPU's kernel (Embedding.cpp); sparse=True: ATen's
    # device-generic kernel, as on CUDA, which builds a sparse gradient.
    "_embedding_bag_backward": Case("aten::_embedding_bag_backward", 2, lambda d: (
        _embedding_bag_grads, [T((5, 3), d[0]), T((2, 2), d[1])])),
    # Weights (d[0]), indices and offsets (d[1]), per-sample weights (d[2]).
    "_embedding_bag": Case(
        ["aten::_embedding_bag", "aten::_embedding_bag_forward_only"], 3, lambda d: (
            _embedding_bag_forms, [T((5, 3), d[0]), T((4,), d[1]), T((4,), d[2])])),
    "log_sigmoid_forward": Case("aten::log_sigmoid_forward", 1, unary(
        lambda x: torch.ops.aten.log_sigmoid_forward(x))),
}

# Registrations with no dtype to vary, and why.
NOT_DTYPE_DEPENDENT = {
    "aten::record_stream": "takes a stream; records it, whatever the tensor's dtype",
}


def _registered():
    names = torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
    # c10d ops are registered for PrivateUse1 by torch itself, not phantom.
    return sorted(n for n in names if n.startswith("aten::"))


def test_every_registered_kernel_is_covered():
    covered = {op for case in CASES.values() for op in case.ops} | set(NOT_DTYPE_DEPENDENT)
    missing = [op for op in _registered() if op not in covered]
    assert not missing, f"no dtype-matrix case for {missing}: add one to CASES"
    stale = sorted(covered - set(_registered()))
    assert not stale, f"CASES name ops phantom does not register: {stale}"


def _assignments(slots):
    if slots == 1:
        return [(d,) for d in DTYPES]
    result = []
    for first in DTYPES:
        for rest in DTYPES:
            result.append((first,) + (rest,) * (slots - 1))
            if slots > 2 and first != rest:
                result.append((rest,) * (slots - 1) + (first,))
    return result


def _run(fn, args):
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", fn(*args)
    except Exception as error:  # noqa: BLE001 - the outcome is compared
        return "raised", error


def _canonical(value, with_values):
    if isinstance(value, torch.Tensor):
        value = value.detach()
        head = (str(value.dtype), tuple(value.shape), value.device.type != "meta")
        if not with_values or value.numel() == 0:
            return head
        data = value.cpu().contiguous().reshape(-1)
        if data.dtype.is_complex or data.element_size() > 0:
            data = data.view(torch.uint8)
        return head + (bytes(data.numpy()),)
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v, with_values) for v in value)
    if isinstance(value, torch.UntypedStorage):
        return "storage"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _on_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _assert_close(actual, expected):
    """Within rounding of a different order of operations."""
    if isinstance(expected, (list, tuple)):
        for a, e in zip(actual, expected):
            _assert_close(a, e)
        return
    low = expected.dtype in (torch.float16, torch.bfloat16)
    torch.testing.assert_close(actual, expected, equal_nan=True,
                               **({"rtol": 1e-2, "atol": 1e-3} if low else {}))


def _mismatch(case, dtypes):
    """None if phantom behaved as the CPU for this assignment, else why."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn, cpu_args = case.build(dtypes)
        phantom_args = [t.to("phantom") for t in cpu_args]
    cpu_kind, cpu = _run(fn, cpu_args)
    phantom_kind, phantom = _run(fn, phantom_args)
    try:
        P.synchronize()
    except Exception as error:  # noqa: BLE001
        return f"queued work failed at the next sync: {type(error).__name__}: {error}"
    if cpu_kind == "raised":
        if phantom_kind != "raised":
            return f"the CPU raised {type(cpu).__name__}({cpu}); phantom did not"
        if case.other_route is not None:
            return None
        if type(phantom) is not type(cpu) or str(phantom) != str(cpu):
            return (f"the CPU raised {type(cpu).__name__}({cpu}); "
                    f"phantom {type(phantom).__name__}({phantom})")
        return None
    if phantom_kind == "raised":
        return f"the CPU accepted; phantom raised {type(phantom).__name__}({phantom})"
    if case.close:
        try:
            _assert_close(_on_cpu(phantom), cpu)
        except AssertionError as error:
            return f"results differ from the CPU's beyond rounding: {error}"
    elif _canonical(cpu, case.values) != _canonical(phantom, case.values):
        return "results differ from the CPU's"
    if _canonical(cpu_args, case.values) != _canonical(phantom_args, case.values):
        return "arguments left different from the CPU's"
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_registered_kernel_behaves_as_the_cpu_for_every_dtype(name):
    case = CASES[name]
    failures = []
    for dtypes in _assignments(case.slots):
        why = _mismatch(case, dtypes)
        if why is not None:
            failures.append(f"{[str(d)[6:] for d in dtypes]}: {why}")
    assert not failures, f"{len(failures)} dtype assignments:\n" + "\n".join(failures[:15])
