// out = gelu?(a @ b^T + bias) + residual for a few rows of a (M <= 16): the matmuls of decoding, one row per sequence.
// A tiled kernel leaves most of its M rows empty and, with few output tiles, most of the GPU idle; and at this
// size a kernel's time is its longest chain of dependent steps, not its arithmetic. So each workgroup takes
// 4 output columns, its 256 threads 4 columns x 64 slices of K read as vec4 (K = 256: one load per thread),
// neighbouring threads read neighbouring weights (b's rows are K-contiguous) and every row of a shares each
// weight load. The slices' sums meet in workgroup memory, every row's at once behind one barrier: 4 threads
// per output each add 16 of them, then one adds the 4. The epilogue is the blocked kernel's (epilogue.wgsl), in its
// order: bias, then GELU (the value before it kept in `pre` for the backward), then the residual. Launched by rows.py;
// a (M, K), b (N, K), K a multiple of 4; out, pre and residual (M, N), bias (N).
// Bindings: a, b, out, params, bias, residual, pre

struct Params { m: u32, n: u32, k: u32, has_bias: u32, activation: u32, has_residual: u32 }

@group(0) @binding(0) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> residual: array<f32>;
@group(0) @binding(6) var<storage, read_write> pre: array<f32>;

const COLUMNS = 4u;
const SLICES = 64u;  // 256 / COLUMNS
const MAX_ROWS = 16u;
const SHARE = 4u;  // threads that add up one output's slice sums
const PART = 16u;  // SLICES / SHARE: the sums each of them adds
var<workgroup> partial: array<f32, 4096>;  // [row][column][slice], MAX_ROWS x 256
var<workgroup> shares: array<f32, 256>;

@compute @workgroup_size(256)
fn matmul_rows_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let first = row_index(grid) * COLUMNS;
    let col = first + lid / SLICES;
    let slice = lid % SLICES;
    let k4 = params.k / 4u;
    let m = params.m;
    var acc: array<f32, MAX_ROWS>;  // indexed by constants only (unrolled loops), so it stays in registers
    if (col < params.n) {
        for (var i = slice; i < k4; i = i + SLICES) {
            let w = b[col * k4 + i];
            for (var r = 0u; r < MAX_ROWS; r = r + 1u) {
                if (r < m) { acc[r] = acc[r] + dot(a[r * k4 + i], w); }
            }
        }
    }
    for (var r = 0u; r < MAX_ROWS; r = r + 1u) {
        if (r < m) { partial[r * 256u + lid] = acc[r]; }
    }
    workgroupBarrier();
    // output o = (row o / COLUMNS, column o % COLUMNS); its thread q adds slices q * PART.. (rotated by the
    // thread, so a subgroup's reads spread over the memory banks)
    let o = lid / SHARE;
    let q = lid % SHARE;
    let live = o < COLUMNS * m && first + o % COLUMNS < params.n;
    var part = 0.0;
    if (live) {
        let base = (o / COLUMNS) * 256u + (o % COLUMNS) * SLICES + q * PART;
        for (var s = 0u; s < PART; s = s + 1u) { part = part + partial[base + (s + lid) % PART]; }
    }
    shares[lid] = part;
    workgroupBarrier();
    if (live && q == 0u) {
        let column = first + o % COLUMNS;
        let i = (o / COLUMNS) * params.n + column;
        var y = (shares[lid] + shares[lid + 1u]) + (shares[lid + 2u] + shares[lid + 3u]);
        if (params.has_bias == 1u) { y = y + bias[column]; }
        if (params.activation == 1u) {
            pre[i] = y;
            y = gelu(y);
        }
        if (params.has_residual == 1u) { y = y + residual[i]; }
        out[i] = y;
    }
}
