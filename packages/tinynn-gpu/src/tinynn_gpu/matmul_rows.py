"""The matmul for a few rows (kernels/matmul_rows.wgsl): `out = a @ b.T` and the blocked matmul's epilogue
(bias, GELU, residual; not its row sums) with a (M, K), M <= 16,
and b (N, K) a weight as `Linear` stores it. That is every matmul of a decode step (one row per sequence),
where the tiled kernels leave the GPU mostly idle. `MatmulSelector` sends such matmuls here.
"""
from __future__ import annotations

MAX_ROWS = 16  # the kernel's register array
COLUMNS = 8  # output columns per workgroup


class RowsMatmul:
    def __init__(self, runtime):
        self.rt = runtime
        self.unused_read, self.unused_pre = runtime.empty((1,)), runtime.empty((1,))  # an unused slot's binding

    @staticmethod
    def fits(batch, m, transpose_a, transpose_b, epilogue) -> bool:
        return batch == 1 and m <= MAX_ROWS and not transpose_a and transpose_b and epilogue.row_sums is None

    def describe(self) -> str:
        return f"rows (M <= {MAX_ROWS})"

    def record(self, a, b, out, m, n, k, epilogue) -> bool:
        """Record out = epilogue(a @ b.T); True: the epilogue was applied."""
        bindings = {0: a, 1: b, 2: out, 4: epilogue.bias or self.unused_read,
                    5: epilogue.residual or self.unused_read, 6: epilogue.pre or self.unused_pre}
        self.rt.dispatch("matmul_rows", "matmul_rows_main", -(-n // COLUMNS), bindings,
                         {"m": m, "n": n, "k": k, "has_bias": int(epilogue.bias is not None),
                          "activation": int(epilogue.activation == "gelu"),
                          "has_residual": int(epilogue.residual is not None)})
        return True
