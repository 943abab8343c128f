"""Embedding lookups and their gradients (embedding.wgsl), with and without a GPT's position table: the forward a
thread an element; the backward a workgroup per table row (and column block) that lists its positions, from the
ids sorted once beforehand (one dispatch more) or, at a small vocabulary, by scanning every id (`scans`), then sums
their gradient rows in position order (no atomics). An id out of range sets a bit of the runtime's error flags,
raised at the next read-back. Methods of the backend (backend.py's table)."""
from __future__ import annotations

import numpy as np

from tinynn_gpu.runtime.arrays import bindable, bindable_any, check_dtypes
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
    c = g.shape[-1]
    g_wte, _ = _backward(self, g, idx, num_embeddings, idx.size, 1, None)
    return g_wte.view((num_embeddings, c))


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
    return _backward(self, g, idx, num_embeddings, t, g.size // max(1, t * c), self._empty((num_positions, c)))


# The backward scans the ids while the scan's reads, table rows x column blocks x ids, are at most this many (a
# character vocabulary: 65 x 8 x 2048 at the lesson's shapes), and sorts them otherwise. The sort is a dispatch of
# its own and one workgroup's log2(N)^2 / 2 dependent passes over the pairs (66 at N = 2048), whatever the
# vocabulary; the scan's reads are spread over the whole GPU, 16 MiB through the caches at this limit, and grow
# with the vocabulary: at GPT-2's they would be a hundred times that.
SCAN_MAX_READS = 1 << 22


def scans(rows: int, blocks: int, ids: int) -> bool:
    """Whether the backward of a table of `rows` (`blocks` workgroups a row) over `ids` positions scans the ids."""
    return rows * blocks * ids <= SCAN_MAX_READS


def _backward(self, g, idx, num_embeddings, t, batch, g_wpe):
    """(g_wte, g_wpe) for ids idx read as (batch, t) and g's rows of C floats; without a position table (g_wpe
    None) a stand-in is bound and no workgroup writes it, as for the sorted pairs when the ids are scanned."""
    c = g.shape[-1]
    g_wte = self._empty((num_embeddings, c))
    # ~512 token workgroups, 32 columns or more each
    blocks = max(1, min(-(-c // 32), -(-512 // max(1, num_embeddings))))
    block_cols = 32 * -(-c // (32 * blocks))
    scan = scans(num_embeddings, blocks, idx.size)
    pairs = 1 << max(0, idx.size - 1).bit_length()  # the sort's size: a power of two
    params = {"total": 0 if g_wpe is None else g_wpe.size, "cols": c, "rows": num_embeddings, "positions": t,
              "batch": batch, "blocks": blocks, "block_cols": block_cols, "pairs": pairs, "scan": int(scan)}
    rt = self.rt
    keys = rt.stand_in(1) if scan else self._empty((2 * pairs,), np.int32)
    if not scan:
        rt.dispatch("embedding", "embedding_sort_main", 1,
                    {"idx": bindable_any(idx), "keys": keys, "errors": rt.error_flags}, params)
    rt.dispatch("embedding", "embedding_backward_main", num_embeddings * blocks + -(-params["total"] // 256),
                {"idx": bindable_any(idx), "keys": keys, "g": bindable(g), "g_wte": g_wte, "errors": rt.error_flags,
                 "g_wpe": rt.stand_in(0) if g_wpe is None else g_wpe}, params)
    return g_wte, g_wpe
