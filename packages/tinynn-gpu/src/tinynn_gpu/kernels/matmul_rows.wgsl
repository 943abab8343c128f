// out = a @ b^T (+ bias) for a few rows of a (M <= 16): the matmuls of decoding, one row per sequence.
// A tiled kernel leaves most of its M rows empty and, with few output tiles, most of the GPU idle. Here each
// workgroup takes 8 output columns, its 256 threads 8 columns x 32 slices of K, so neighbouring threads read
// neighbouring weights (b's rows are K-contiguous) and every row of a shares each weight load; the slices'
// sums meet in workgroup memory. Launched by matmul_rows.py; a (M, K), b (N, K), out (M, N), bias (N).
// Bindings: 0:a 1:b 2:out 3:params 4:bias

struct Params { m: u32, n: u32, k: u32, has_bias: u32 }

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

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
            out[r * params.n + col] = partial[lid] + select(0.0, bias[col], params.has_bias == 1u);
        }
        workgroupBarrier();  // the sums are written before the next row reuses partial
    }
}
