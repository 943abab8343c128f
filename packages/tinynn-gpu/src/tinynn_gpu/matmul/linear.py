"""The backend's matmul ops (a method each: backend.py's table): matmul, and a linear layer's forward and backward
with their epilogues fused into the kernel's stores. Each (shapes, layout, epilogue parts, forced variant) is
planned once by the selector (selection.py) and kept in `matmul_plans` (under the matmul precision in force:
tinynn/precision.py): an eager forward repeats a few."""
from __future__ import annotations

import math

from tinynn import precision
from tinynn_gpu.matmul.problem import ACTIVATIONS, Epilogue, matmul_dims
from tinynn_gpu.runtime.arrays import FLOAT32, bindable
from tinynn_gpu.runtime.kernels import trim

NO_EPILOGUE = Epilogue()  # frozen: one for every plain matmul


def matmul(self, a, b, transpose_a=False, transpose_b=False):
    return self._matmul(a, b, transpose_a, transpose_b, NO_EPILOGUE)

def linear_forward(self, x, weight, bias=None, residual=None, activation=None, for_backward=True):
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    pre = self._for_backward(x.shape[:-1] + weight.shape[:1], for_backward) if activation else None
    y = self._matmul(x, weight, False, True, Epilogue(None if bias is None else bindable(bias), activation, pre,
                                                      None if residual is None else bindable(residual)))
    return y, (pre if for_backward else None)

def linear_backward(self, g, x, weight, pre=None, activation=None, has_bias=True, x_activation=None, x_pre=None):
    if x_activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {x_activation!r}")
    if activation is not None:
        g = self.unary_backward(activation, pre, pre, g)
    g_bias = self._empty((weight.shape[0],)) if has_bias else None
    x_epilogue, weight_epilogue = Epilogue(activation_grad=x_activation, pre=x_pre), Epilogue(row_sums=g_bias)
    paired = self._linear_gradients_paired(g, x, weight, x_epilogue, weight_epilogue)
    if paired is not None:
        return (*paired, g_bias)
    g_x = self._matmul(g, weight, False, False, x_epilogue)
    g_weight = self._matmul(g, x, True, False, weight_epilogue)  # g.T @ x; g_bias = g's column sums
    return g_x, g_weight, g_bias

def linear_gradients_paired(self, g, x, weight, x_epilogue, weight_epilogue):
    """(g @ weight, g.T @ x) with their epilogues in one dispatch, where the matmul selector chose that for
    these shapes (`MatmulSelector.plan_pair`); else None. Planned once per key, like `_matmul`."""
    key = ("pair", g.shape, x.shape, weight.shape, x_epilogue.activation_grad, weight_epilogue.row_sums is None,
           self.mm.forced, precision.current())
    record = self.matmul_plans.get(key, False)
    if record is False:
        record = None
        if g.ndim == x.ndim == 2 and 0 not in g.shape + x.shape:
            (rows, outs), ins = g.shape, x.shape[1]
            g_, x_, weight_ = bindable(g), bindable(x), bindable(weight)
            record = self.mm.plan_pair(
                (g_, weight_, self._empty((rows, ins)), 1, rows, ins, outs, False, False, False, x_epilogue),
                (g_, x_, self._empty((outs, ins)), 1, outs, ins, rows, True, False, False, weight_epilogue))
        self.matmul_plans[key] = record
        trim(self.matmul_plans)
    if record is None:
        return None
    g, x, weight = bindable(g), bindable(x), bindable(weight)
    g_x, g_weight = self._empty((g.shape[0], x.shape[1])), self._empty(weight.shape)
    record(g, weight, g_x, x_epilogue, g, x, g_weight, weight_epilogue)
    return g_x, g_weight

def matmul_epilogue(self, a, b, transpose_a, transpose_b, epilogue):
    """out = epilogue(op(a) @ op(b)): in the matmul's own stores where its kernel can, else after it. Each
    (shapes, layout, epilogue parts, forced variant) is planned once (`_plan_matmul`): an eager forward repeats
    a few."""
    key = (a.shape, b.shape, transpose_a, transpose_b, epilogue.bias is None, epilogue.activation,
           epilogue.residual is None, epilogue.row_sums is None, epilogue.activation_grad, self.mm.forced,
           precision.current())
    plan = self.matmul_plans.get(key)
    if plan is None:
        plan = self.matmul_plans[key] = self._plan_matmul(a, b, transpose_a, transpose_b, epilogue)
        trim(self.matmul_plans)
    out_shape, record, description = plan
    if record is None:  # operands to broadcast, or an empty output: the general path
        return self._matmul_unplanned(a, b, transpose_a, transpose_b, epilogue, out_shape)
    if a.buffer is None or b.buffer is None or a.dtype is not FLOAT32 or b.dtype is not FLOAT32:
        bindable(a), bindable(b)  # the refusal (`bindable`'s test written out: most eager dispatches pass here)
    out = self._empty(out_shape)
    self.mm.last = description
    if record(a, b, out, epilogue):
        return out
    return self._epilogue_after(a, out, transpose_a, epilogue)

def plan_matmul(self, a, b, transpose_a, transpose_b, epilogue) -> tuple:
    """(output shape, record(a, b, out, epilogue) -> applied?, the kernel's description) for `_matmul`, which
    keeps it per key; record and description None where the batch axes broadcast or the output is empty.
    Choosing the kernel may tune it on the real operands (`MatmulSelector.plan`), into an output made here."""
    if b.ndim == 2 and a.ndim != 2 and not transpose_a:  # one weight for every row: a's leading axes fold into M
        rows = a.view((math.prod(a.shape[:-1]), a.shape[-1]))  # (N, k): a linear layer's x (..., in)
        # planned on the rows view; its record reads a's buffer, which the view shares
        out_shape, record, description = self._plan_matmul(rows, b, False, transpose_b, epilogue)
        return a.shape[:-1] + out_shape[-1:], record, description
    m, n, k, shared_b, batch_shape = matmul_dims(a, b, transpose_a, transpose_b)
    out_shape = batch_shape + (m, n)
    if (not shared_b and a.shape[:-2] != b.shape[:-2]) or 0 in out_shape:
        return out_shape, None, None
    record, description = self.mm.plan(bindable(a), bindable(b), self._empty(out_shape), math.prod(batch_shape), m,
                                       n, k, transpose_a, transpose_b, shared_b, epilogue)
    return out_shape, record, description

def matmul_unplanned(self, a, b, transpose_a, transpose_b, epilogue, out_shape):
    """`_matmul` where the batch axes broadcast (each operand gathered to the common shape, then planned), or
    into an empty output (of `out_shape`)."""
    if 0 in out_shape:
        bindable(a), bindable(b)  # refused as `_matmul` refuses them: NumPy's empty int32 product is int32
        if epilogue.row_sums is not None:
            self._fill(epilogue.row_sums, 0.0)
        return self._empty(out_shape)
    batch_shape = out_shape[:-2]
    return self._matmul(self.broadcast_to(a, batch_shape + a.shape[-2:]),
                        self.broadcast_to(b, batch_shape + b.shape[-2:]), transpose_a, transpose_b, epilogue)

def epilogue_after(self, a, out, transpose_a, epilogue):
    """The epilogue as separate ops, after a kernel without one (the lesson's)."""
    if epilogue.activation_grad is not None:
        out = self.unary_backward(epilogue.activation_grad, epilogue.pre, epilogue.pre, out)
    if epilogue.row_sums is not None:
        sums = self.sum(a, (a.ndim - 2 if transpose_a else a.ndim - 1,))
        self._copy(sums, epilogue.row_sums)
    if epilogue.bias is not None:
        out = self.binary("add", out, epilogue.bias)
    if epilogue.activation is not None:
        self._copy(out, epilogue.pre)
        out = self.unary(epilogue.activation, out)
    if epilogue.residual is not None:
        out = self.binary("add", out, epilogue.residual)
    return out
