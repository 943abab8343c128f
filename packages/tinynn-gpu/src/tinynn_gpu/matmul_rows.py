"""The matmul for a few rows (kernels/matmul_rows.wgsl): `out = a @ b.T (+ bias)` with a (M, K), M <= 16,
and b (N, K) a weight as `Linear` stores it. That is every matmul of a decode step (one row per sequence),
where the tiled kernels leave the GPU mostly idle. `MatmulSelector` sends such matmuls here.
"""
from __future__ import annotations

MAX_ROWS = 16  # the kernel's register array
COLUMNS = 8  # output columns per workgroup


class RowsMatmul:
    def __init__(self, runtime):
        self.rt = runtime

    @staticmethod
    def fits(batch, m, transpose_a, transpose_b) -> bool:
        return batch == 1 and m <= MAX_ROWS and not transpose_a and transpose_b

    def describe(self) -> str:
        return f"rows (M <= {MAX_ROWS})"

    def record(self, a, b, out, m, n, k, bias=None) -> bool:
        """Record out = a @ b.T (+ bias); True: the bias was added."""
        self.rt.dispatch("matmul_rows", "matmul_rows_main", -(-n // COLUMNS),
                         {0: a, 1: b, 2: out, 4: a if bias is None else bias},
                         {"m": m, "n": n, "k": k, "has_bias": int(bias is not None)})
        return True
