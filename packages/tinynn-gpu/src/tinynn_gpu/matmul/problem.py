"""A matmul problem: out = epilogue(op(a) @ op(b)), its shapes and layout (`matmul_dims`, `shape_key`), the
`Epilogue` fused into its stores, and its kernel parameters under a block configuration (`problem_plan`)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tinynn_gpu.matmul.configs import BlockConfig

ACTIVATIONS = {None: 0, "gelu": 1}
Layout = tuple  # (transpose_a, transpose_b, vec4 loads, aligned): what one problem's code depends on


class Epilogue(NamedTuple):
    """What a matmul does to each result as it stores it; every part optional (arrays on the GPU). A named
    tuple: built per matmul, three times faster than a frozen dataclass."""
    bias: object = None  # (N,): added to every row
    activation: str | None = None  # "gelu"; then `pre` receives the value before it
    pre: object = None
    residual: object = None  # the output's shape: added last
    row_sums: object = None  # (batch, M): sum over k of op(a), the bias gradient of a weight gradient
    activation_grad: str | None = None  # "gelu": times its derivative at `pre` (read), for a backward

    @property
    def empty(self) -> bool:
        return (self.bias, self.activation, self.residual, self.row_sums, self.activation_grad) == (None,) * 5


def epilogue_parts(epilogue: Epilogue) -> tuple:
    """What of an epilogue decides a matmul's plan (its params): which parts it has, not which arrays."""
    bias, activation, _, residual, row_sums, activation_grad = epilogue
    return bias is not None, activation, activation_grad, residual is not None, row_sums is not None


def problem_plan(cfg: BlockConfig, splits: int, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue) \
        -> tuple[int, Layout, dict]:
    """One matmul's split count (at most one split per BK of K), code layout and params under a configuration."""
    splits = max(1, min(splits, -(-k // cfg.bk)))
    k_chunk = -(-k // (splits * cfg.bk)) * cfg.bk
    layout = (bool(transpose_a), bool(transpose_b), cfg.uses_vec4(m, n, k, transpose_a, transpose_b),
              cfg.aligned(m, n, k, splits, k_chunk))
    params = {"m": m, "n": n, "k": k, "shared_b": int(shared_b), "splits": splits, "k_chunk": k_chunk,
              "has_bias": int(epilogue.bias is not None), "activation": ACTIVATIONS[epilogue.activation],
              "activation_grad": ACTIVATIONS[epilogue.activation_grad],
              "has_residual": int(epilogue.residual is not None), "row_sums": int(epilogue.row_sums is not None),
              "batch": batch}
    return splits, layout, params


def matmul_dims(a, b, transpose_a, transpose_b) -> tuple:
    """(m, n, k, shared_b, batch shape) of op(a) @ op(b): b shared by every batch where it is a 2-D weight under a
    batched a, else the batch axes broadcast (NumPy's rules)."""
    m, k = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    n = b.shape[-2] if transpose_b else b.shape[-1]
    shared_b = b.ndim == 2 and a.ndim > 2
    batch_shape = a.shape[:-2] if shared_b else tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return m, n, k, shared_b, batch_shape


def shape_key(batch, m, n, k, transpose_a, transpose_b, shared_b) -> str:
    """A problem's key in the selector's choices (and the autotune cache)."""
    return f"ta={int(transpose_a)} tb={int(transpose_b)} shared={int(shared_b)} b={batch} m={m} n={n} k={k}"
