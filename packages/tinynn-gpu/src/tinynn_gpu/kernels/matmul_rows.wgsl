// out = gelu?(a @ b^T + bias) + residual for a few rows of a (M <= 16): the matmuls of decoding, one row per sequence.
// A tiled kernel leaves most of its M rows empty and, with few output tiles, most of the GPU idle. Here each
// workgroup takes 8 output columns, its 256 threads 8 columns x 32 slices of K, so neighbouring threads read
// neighbouring weights (b's rows are K-contiguous) and every row of a shares each weight load; the slices'
// sums meet in workgroup memory. The epilogue is matmul_blocked.wgsl's: bias, then GELU (the value before
// it kept in `pre` for the backward), then the residual. Launched by matmul_rows.py; a (M, K), b (N, K),
// out, pre and residual (M, N), bias (N). Bindings: 0:a 1:b 2:out 3:params 4:bias 5:residual 6:pre

struct Params { m: u32, n: u32, k: u32, has_bias: u32, activation: u32, has_residual: u32 }

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> residual: array<f32>;
@group(0) @binding(6) var<storage, read_write> pre: array<f32>;

const COLUMNS = 8u;
const SLICES = 32u;
const MAX_ROWS = 16u;
var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn matmul_rows_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let col = row_index(wg, nwg) * COLUMNS + lid / SLICES;
    let slice = lid % SLICES;
    let live = col < params.n;
    let k = params.k;
    var acc: array<f32, MAX_ROWS>;  // constant bounds below, so the compiler keeps it in registers
    if (live) {
        for (var i = slice; i < k; i = i + SLICES) {
            let w = b[col * k + i];
            for (var r = 0u; r < MAX_ROWS; r = r + 1u) {
                if (r < params.m) { acc[r] = acc[r] + a[r * k + i] * w; }
            }
        }
    }
    for (var r = 0u; r < MAX_ROWS; r = r + 1u) {
        if (r >= params.m) { break; }  // params are uniform: the whole workgroup leaves together
        partial[lid] = acc[r];
        workgroupBarrier();
        for (var s = SLICES / 2u; s > 0u; s = s >> 1u) {
            if (slice < s) { partial[lid] = partial[lid] + partial[lid + s]; }
            workgroupBarrier();
        }
        if (live && slice == 0u) {
            let i = r * params.n + col;
            var y = partial[lid];
            if (params.has_bias == 1u) { y = y + bias[col]; }
            if (params.activation == 1u) {
                pre[i] = y;
                y = gelu(y);
            }
            if (params.has_residual == 1u) { y = y + residual[i]; }
            out[i] = y;
        }
        workgroupBarrier();  // the sums are written before the next row reuses partial
    }
}
