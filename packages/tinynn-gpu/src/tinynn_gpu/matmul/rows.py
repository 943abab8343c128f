"""The matmul for a few rows (rows.wgsl): `out = a @ b.T` and the blocked matmul's epilogue
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

    def plan(self, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue):
        """record(a, b, out, epilogue) for this shape, a @ b.T with `fits`' epilogue (see `MatmulSelector.plan`)."""
        launch = self.rt.prepare("rows", "matmul_rows_main", -(-n // COLUMNS), ("a", "b", "out", "bias", "residual", "pre"),
                                 {"m": m, "n": n, "k": k, "has_bias": int(epilogue.bias is not None),
                                  "activation": int(epilogue.activation == "gelu"),
                                  "has_residual": int(epilogue.residual is not None)})
        stand_in = self.rt.stand_in

        def record(a, b, out, epilogue):
            bias, _, pre, residual, _, _ = epilogue
            self.rt.launch(launch, (a, b, out, stand_in(0) if bias is None else bias,
                                    stand_in(0) if residual is None else residual, stand_in(1) if pre is None else pre))
            return True
        return record
