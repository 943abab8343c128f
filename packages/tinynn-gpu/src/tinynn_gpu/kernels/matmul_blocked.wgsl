// Register-blocked batched matmul, out[B,M,N] = op(a)[B,M,K] @ op(b)[B,K,N]: a template that
// matmul_blocked.py fills in ({{...}}) for one configuration and one operand layout.
//
// Each workgroup computes a BM x BN block of the output; each of its (BM/TM)*(BN/TN) threads holds
// TM x TN results in registers as TM*TN/4 vec4 accumulators. The generator writes every accumulator as
// its own variable and unrolls the BK loop: naga does not unroll loops, and an accumulator array indexed
// in a loop would live in slow local memory instead of registers.
// Per BK step the block's A (BM x BK) and B (BK x BN) tiles go through workgroup memory as vec4s, so the
// inner product reads 4 values per load. A thread's rows and columns are interleaved with its
// neighbours' (4-wide groups THREADS_M or THREADS_N apart) so a warp reads consecutive vec4s: no bank
// conflicts. Edges: out-of-range loads read 0 and out-of-range stores are skipped; no thread leaves
// before a barrier. Workgroups are visited GROUP block-rows at a time so that the A and B panels being
// read stay in L2 (the raster order would stream all of B once per block-row).
// Split-K: with `splits` > 1 the z axis runs over (batch, split) and each split sums its own k_chunk of
// K into its own (M, N) slice of `out`; the launcher then adds the slices (a long K over a small M x N
// output would otherwise leave most of the GPU idle).
//
// Bias epilogue: with has_bias, bias[n] is added to every row as the results are stored (a linear layer
// in one kernel); under split-K only the first split adds it.
//
// Bindings: 0:a 1:b 2:out 3:params 4:bias.
// Layout of this variant: a {{A_LAYOUT}}, b {{B_LAYOUT}}.

struct Params { m: u32, n: u32, k: u32, shared_b: u32, splits: u32, k_chunk: u32, has_bias: u32, pad: u32 }

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const THREADS_M: u32 = {{THREADS_M}}u;  // BM / TM
const THREADS_N: u32 = {{THREADS_N}}u;  // BN / TN
const THREADS: u32 = {{THREADS}}u;
const GROUP: u32 = {{GROUP}}u;

var<workgroup> a_tile: array<vec4<f32>, {{A_TILE_VEC4}}>;  // [k][m / 4]
var<workgroup> b_tile: array<vec4<f32>, {{B_TILE_VEC4}}>;  // [k][n / 4]

fn load_a(base: u32, m: u32, k: u32, k_end: u32) -> f32 {
    if (m >= params.m || k >= k_end) { return 0.0; }
    return a[{{A_INDEX}}];
}

fn load_b(base: u32, k: u32, n: u32, k_end: u32) -> f32 {
    if (k >= k_end || n >= params.n) { return 0.0; }
    return b[{{B_INDEX}}];
}

fn bias_at(n: u32) -> f32 {
    if (n >= params.n) { return 0.0; }
    return bias[n];
}

fn store(base: u32, m: u32, n: u32, acc: vec4<f32>, add_bias: bool) {
    if (m >= params.m) { return; }
    var v = acc;
    if (add_bias) { v = v + vec4<f32>(bias_at(n), bias_at(n + 1u), bias_at(n + 2u), bias_at(n + 3u)); }
    let i = base + m * params.n + n;
    if (n + 3u < params.n) {
        out[i] = v.x; out[i + 1u] = v.y; out[i + 2u] = v.z; out[i + 3u] = v.w;
    } else {
        if (n < params.n) { out[i] = v.x; }
        if (n + 1u < params.n) { out[i + 1u] = v.y; }
        if (n + 2u < params.n) { out[i + 2u] = v.z; }
    }
}

@compute @workgroup_size({{THREADS}})
fn matmul_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let m_dim = params.m;
    let n_dim = params.n;
    let batch = wg.z / params.splits;
    let k_begin = (wg.z % params.splits) * params.k_chunk;
    let k_end = min(params.k, k_begin + params.k_chunk);
    // grouped order: GROUP block-rows share the B panels they read while they are in L2
    let linear = wg.y * nwg.x + wg.x;
    let per_group = GROUP * nwg.x;
    let first_row = (linear / per_group) * GROUP;
    let rows_here = min(nwg.y - first_row, GROUP);
    let block_m = first_row + (linear % per_group) % rows_here;
    let block_n = (linear % per_group) / rows_here;
    let row0 = block_m * BM;
    let col0 = block_n * BN;
    let a_base = batch * m_dim * params.k;
    let b_base = select(batch * params.k * n_dim, 0u, params.shared_b == 1u);
    let tx = lid % THREADS_N;
    let ty = lid / THREADS_N;
{{DECLARE}}
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
{{LOAD}}
        workgroupBarrier();
{{INNER}}
        workgroupBarrier();
    }
    let out_base = wg.z * m_dim * n_dim;  // with splits: this split's own slice
    let add_bias = params.has_bias == 1u && wg.z % params.splits == 0u;
{{STORE}}
}
