"""Embedding lookups and their gradients (embedding.wgsl), with and without a GPT's position table: the forward a
thread an element, the backward without atomics (each gradient element summed in a fixed order). An id out of
range sets a bit of the runtime's error flags, raised at the next read-back. Methods of the backend (backend.py's
table)."""
from __future__ import annotations

from tinynn_gpu.ops.cross_entropy import check_dtypes
from tinynn_gpu.runtime.arrays import bindable, bindable_any
from tinynn_gpu.runtime.kernels import groups


def embedding_forward(self, weight, idx):
    check_dtypes("embedding_forward", weight, idx)
    v, c = weight.shape
    out = self._empty(idx.shape + (c,))
    self.rt.dispatch("embedding", "embedding_forward_main", groups(out.size),
                     {"weight": bindable(weight), "idx": bindable_any(idx), "out": out, "errors": self.rt.error_flags},
                     {"total": out.size, "cols": c, "rows": v})
    return out


def embedding_backward(self, g, idx, num_embeddings):
    check_dtypes("embedding_backward", g, idx)
    c, n = g.shape[-1], idx.size
    table = num_embeddings * c
    chunk = max(64, -(-n // max(1, 65536 // table)))  # ~64K threads, at least 64 positions each
    chunks = -(-n // chunk)
    partial = self._empty((chunks * table,))
    self.rt.dispatch("embedding", "embedding_backward_main", groups(partial.size),
                     {"idx": bindable_any(idx), "g": bindable(g), "out": partial, "errors": self.rt.error_flags},
                     {"total": table, "cols": c, "rows": num_embeddings, "positions": n, "chunk": chunk,
                      "chunks": chunks})
    out = partial if chunks == 1 else self._reduce_middle(partial, 1, chunks, table, 0)
    return out.view((num_embeddings, c))


def embedding_with_positions_forward(self, wte, wpe, idx):
    v, c = wte.shape
    check_dtypes("embedding_with_positions_forward", wte, wpe, idx)
    operands = bindable(wte), bindable(wpe), bindable_any(idx)
    out, rt = self._empty(idx.shape + (c,)), self.rt
    total = out.size
    key = ("embedding_with_positions_forward", total, c, v, idx.shape[-1])
    launch = rt.launches.get(key) or rt.keep(key, rt.prepare(
        "embedding", "embedding_with_positions_forward_main", groups(total),
        ("weight", "positions", "idx", "out", "errors"),
        {"total": total, "cols": c, "rows": v, "positions": idx.shape[-1]}))
    rt.launch(launch, (*operands, out, rt.error_flags))
    return out


def embedding_with_positions_backward(self, g, idx, num_embeddings, num_positions):
    check_dtypes("embedding_with_positions_backward", g, idx)
    t, c = g.shape[-2:]
    g_wte, g_wpe = self._empty((num_embeddings, c)), self._empty((num_positions, c))
    # ~512 token workgroups, 32 columns or more each
    blocks = max(1, min(-(-c // 32), -(-512 // max(1, num_embeddings))))
    block_cols = 32 * -(-c // (32 * blocks))
    self.rt.dispatch("embedding", "embedding_with_positions_backward_main",
                     num_embeddings * blocks + -(-g_wpe.size // 256),
                     {"idx": bindable_any(idx), "g": bindable(g), "g_wte": g_wte, "g_wpe": g_wpe,
                      "errors": self.rt.error_flags},
                     {"total": g_wpe.size, "cols": c, "rows": num_embeddings, "positions": t,
                      "batch": g.size // max(1, t * c), "blocks": blocks, "block_cols": block_cols})
    return g_wte, g_wpe
