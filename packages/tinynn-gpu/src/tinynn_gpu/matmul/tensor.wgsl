// Tensor-core matmul, out[B,M,N] = op(a)[B,M,K] @ op(b)[B,K,N] with the shared epilogue (epilogue.wgsl): a
// template that tensor.py fills in ({{...}}) for one configuration and one operand layout. It runs where the
// matmul precision is "high" (tinynn/precision.py) on an adapter with f16 subgroup matrices
// (chromium_experimental_subgroup_matrix: Dawn; NVIDIA's tensor cores).
//
// Each workgroup computes a BM x BN block of the output with subgroups of 32 invocations, arranged in rows of
// SG_COLS; each subgroup holds the result matrices (16 x 16, f32) of a SUB_M x SUB_N part of the block. Per BK
// step the block's A (BM x BK) and B (BK x BN) tiles are read as vec4s of f32, multiplied by their lines'
// range scales (scales.wgsl: powers of two, so exact), converted to f16 and stored in workgroup memory in the
// operand's own layout; the subgroup matrices load from there (column-major where a tile is stored transposed)
// and multiply-accumulate in f32. Double-buffered variants (BUFFERS = 2) fetch the next step's vec4s into
// registers before this step's products and store them into the other buffer after, with one barrier a step.
// Each result matrix then goes through a 16 x 16 f32 slot of its subgroup in workgroup memory: every invocation
// takes 8 neighbouring values of a row, divides them by their row's and column's scales, and stores them
// through the epilogue's `store` (bias, GELU, residual, GELU's gradient; raw slices under split-K, which
// matmul_finish_main adds up). Row sums come from the scales pass, not from here.
// Edges: out-of-range loads read 0 (the epilogue's load functions) and out-of-range stores are skipped; every
// invocation reaches every barrier.

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const SG_COLS: u32 = {{SG_COLS}}u;
const THREADS: u32 = {{THREADS}}u;
const A_STRIDE: u32 = {{A_STRIDE}}u;  // f16s between a stored tile's lines (its contiguous side, padded by 8)
const B_STRIDE: u32 = {{B_STRIDE}}u;
const A_TILE: u32 = {{A_TILE}}u;  // f16s in one buffer of the A tiles
const B_TILE: u32 = {{B_TILE}}u;

@group(0) @binding(16) var<storage, read> a_scales: array<f32>;  // [batch][m]: op(a)'s rows
@group(0) @binding(17) var<storage, read> b_scales: array<f32>;  // [batch or 0][n]: op(b)'s columns

{{HALF}}

var<workgroup> a_tile: array<half, {{A_TILES}}>;
var<workgroup> b_tile: array<half, {{B_TILES}}>;
var<workgroup> results: array<f32, {{RESULTS}}>;  // a 16 x 16 slot per subgroup

{{PROBLEMS}}
@compute @workgroup_size({{THREADS}})
fn matmul_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32{{BUILTINS}}) {
{{SUBGROUP}}
    let z = wg.z + params.z_offset;
    let m_dim = params.m;
    let n_dim = params.n;
    let batch = z / params.splits;
    let k_begin = (z % params.splits) * params.k_chunk;
    let k_end = min(params.k, k_begin + params.k_chunk);
    let row0 = (wg.y + params.y_offset) * BM;
    let col0 = wg.x * BN;
    let a_base = batch * m_dim * params.k;
    let b_base = select(batch * params.k * n_dim, 0u, params.shared_b == 1u);
    let a_scale_base = batch * m_dim;
    let b_scale_base = select(batch * n_dim, 0u, params.shared_b == 1u);
    let sr = (sg / SG_COLS) * {{SUB_M}}u;  // the subgroup's first row and column in the block
    let sc = (sg % SG_COLS) * {{SUB_N}}u;
{{DECLARE}}
{{PROLOGUE}}
    var buf = 0u;
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
{{FETCH}}
{{PRODUCTS}}
{{STASH}}
        workgroupBarrier();
        buf = (buf + 1u) % {{BUFFERS}}u;
    }
    let raw = params.splits > 1u;
    let out_base = z * m_dim * n_dim;
    let slot = sg * 256u;
    let r = lane / 2u;  // this invocation's row of a result matrix, and its first of 8 columns
    let c = (lane % 2u) * 8u;
{{STORES}}
}
