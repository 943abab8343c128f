"""Cross-entropy over rows of logits (cross_entropy.wgsl, compiled through group_sum.py): the forward a row team
per row, then one workgroup for the mean; the backward one thread an element. And the fused classifier, the output
head and its cross entropy in one op (llm.c's): a chunk of rows at a time, the head's matmul makes the chunk's
logits, a workgroup per row replaces them in place with their gradient, and the head's backward matmuls take it at
once, so the logits of all B x T rows never exist together. A target out of range sets a bit of the runtime's
error flags, raised at the next read-back. Methods of the backend (backend.py's table)."""
from __future__ import annotations

from tinynn_gpu.ops import group_sum
from tinynn_gpu.runtime.arrays import TooLarge, bindable, bindable_any, check_dtypes
from tinynn_gpu.runtime.kernels import groups


def cross_entropy_forward(self, logits, targets, ignore_index, for_backward=True):
    n, c = logits.shape
    check_dtypes("cross_entropy_forward", logits, targets)
    operands = bindable(logits), bindable_any(targets)
    rows, loss = self._empty((n, 2)), self._empty(())
    probs, count = self._for_backward((n, c), for_backward), self._for_backward((), for_backward, 1)
    rt = self.rt
    key = ("cross_entropy_forward", *group_sum.variant(rt), n, c, int(ignore_index))
    launches = rt.launches.get(key) or rt.keep(key, _forward_launches(rt, n, c, ignore_index))
    rt.launch(launches[0], (*operands, probs, rows, rt.error_flags))
    rt.launch(launches[1], (rows, loss, count))
    return (loss, probs, count) if for_backward else (loss, None, None)


def _forward_launches(rt, n, c, ignore_index) -> tuple:
    """The rows' dispatch, then the mean's."""
    shader = group_sum.shader(rt, "cross_entropy")
    params = {"n": n, "cols": c, "ignore_index": int(ignore_index)}
    return (rt.prepare(shader, "cross_entropy_forward_rows_main", -(-n // group_sum.TEAM_ROWS),
                       ("logits", "targets", "probs", "rows", "errors"), params),
            rt.prepare(shader, "cross_entropy_forward_mean_main", 1, ("rows", "result", "count"), params))


def cross_entropy_backward(self, probs, targets, g_loss, ignore_index, count=None):
    check_dtypes("cross_entropy_backward", probs, g_loss, *([] if count is None else [count]), targets)
    n, c = probs.shape
    grad = self._empty((n, c))
    shader = group_sum.shader(self.rt, "cross_entropy")
    params = {"n": n, "cols": c, "ignore_index": int(ignore_index)}
    if count is None:
        count = self._empty(())
        self.rt.dispatch(shader, "cross_entropy_count_main", 1, {"targets": bindable_any(targets), "count": count},
                         params)
    self.rt.dispatch(shader, "cross_entropy_backward_main", groups(n * c),
                     {"targets": bindable_any(targets), "probs": bindable(probs), "count": bindable(count),
                      "g_loss": bindable(g_loss), "grad": grad, "errors": self.rt.error_flags}, params)
    return grad


# The most bytes of a classifier chunk's logits: GPT-2's 4096 rows of 50304 take four chunks of 206 MB, not one of
# 824 MB (a step's peak memory), each further chunk costing one add of the head's (V, C) weight gradient.
CHUNK_BYTES = 256 << 20


def chunk_rows(rt, v_padded: int) -> int:
    """The most rows of a classifier's chunk: as many as CHUNK_BYTES and one storage binding hold the logits of."""
    most = min(CHUNK_BYTES, rt.max_binding) // (4 * max(1, v_padded))
    if most < 1:
        raise TooLarge(f"one row of {v_padded} logits exceeds a chunk's {min(CHUNK_BYTES, rt.max_binding)} bytes")
    return most


def classifier_forward(self, x, weight, bias, targets, vocab, ignore_index, for_backward=True):
    check_dtypes("classifier_forward", x, weight, *([] if bias is None else [bias]), targets)
    n, v_padded = x.shape[0], weight.shape[0]
    operands = bindable(x), bindable(weight), None if bias is None else bindable(bias), bindable_any(targets)
    x, weight, bias, targets = operands
    chunks = -(-n // chunk_rows(self.rt, v_padded))  # as few as can be, and as even
    size = -(-n // max(1, chunks))
    shader = group_sum.shader(self.rt, "cross_entropy")
    rows, loss, count = self._empty((n, 2)), self._empty(()), self._empty(())
    params = {"n": n, "cols": v_padded, "ignore_index": int(ignore_index), "vocab": vocab}
    if for_backward:  # the gradient's scale, 1 / count, before any chunk
        self.rt.dispatch(shader, "cross_entropy_count_main", 1, {"targets": targets, "count": count}, params)
    g_x, g_weight, g_bias = [], None, None
    for start in range(0, n, size):
        stop = min(n, start + size)
        rows_x = x if stop - start == n else self.getitem(x, slice(start, stop))  # (R, C)
        logits, _ = self.linear_forward(rows_x, weight, bias, None, None, False)  # (R, V_padded)
        self.rt.dispatch(shader, "classifier_rows_main", stop - start,
                         {"scores": bindable(logits), "targets": targets, "rows": rows, "count": count,
                          "errors": self.rt.error_flags},
                         {**params, "n": stop - start, "row0": start, "with_grad": int(for_backward)})
        if for_backward:  # the head's backward, its g the logits' gradient
            gx, gw, gb = self.linear_backward(logits, rows_x, weight, None, None, bias is not None)
            g_x.append(gx)
            g_weight = gw if g_weight is None else self.binary("add", g_weight, gw)
            g_bias = gb if g_bias is None else self.binary("add", g_bias, gb)  # None throughout without a bias
        del logits  # its buffer goes back to the pool for the next chunk's
    self.rt.dispatch(shader, "cross_entropy_forward_mean_main", 1, {"rows": rows, "result": loss, "count": count},
                     params)
    if not for_backward:
        return loss, None, None, None
    return loss, (g_x[0] if len(g_x) == 1 else self.concatenate(g_x, 0)), g_weight, g_bias
