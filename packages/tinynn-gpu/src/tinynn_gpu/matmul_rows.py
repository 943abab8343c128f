"""The matmul for a few rows (kernels/matmul_rows.wgsl): `out = a @ b.T` and the blocked matmul's epilogue
(bias, GELU, residual; not its row sums or GELU's gradient) with a (M, K), M <= 16, K a multiple of 4 (read
as vec4), and b (N, K) a weight as `Linear` stores it. That is every matmul of a decode step (one row per
sequence), where the tiled kernels leave the GPU mostly idle. `MatmulSelector` sends such matmuls here, on
adapters offering its 17 KiB of workgroup memory.
"""
from __future__ import annotations

MAX_ROWS = 16  # the kernel's register array
COLUMNS = 4  # output columns per workgroup
WORKGROUP_BYTES = 4 * (4096 + 256)  # its `partial` and `shares`: above WebGPU's guaranteed 16 KiB


class RowsMatmul:
    def __init__(self, runtime):
        self.rt = runtime
        self.usable = runtime.ctx.limits.get("max-compute-workgroup-storage-size", 16384) >= WORKGROUP_BYTES

    def fits(self, batch, m, k, transpose_a, transpose_b, epilogue) -> bool:
        """Whether this kernel computes the matmul; it has neither row sums nor GELU's gradient."""
        return self.usable and batch == 1 and m <= MAX_ROWS and k % 4 == 0 and not transpose_a and \
            transpose_b and epilogue.row_sums is None and epilogue.activation_grad is None

    def describe(self) -> str:
        return f"rows (M <= {MAX_ROWS})"

    def record(self, a, b, out, m, n, k, epilogue) -> bool:
        """Record out = epilogue(a @ b.T); True: the epilogue was applied."""
        bindings = {0: a, 1: b, 2: out, 4: epilogue.bias or self.rt.stand_in(0),
                    5: epilogue.residual or self.rt.stand_in(0), 6: epilogue.pre or self.rt.stand_in(1)}
        self.rt.dispatch("matmul_rows", "matmul_rows_main", -(-n // COLUMNS), bindings,
                         {"m": m, "n": n, "k": k, "has_bias": int(epilogue.bias is not None),
                          "activation": int(epilogue.activation == "gelu"),
                          "has_residual": int(epilogue.residual is not None)})
        return True
