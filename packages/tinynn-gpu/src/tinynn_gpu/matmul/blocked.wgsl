// Register-blocked batched matmul, out[B,M,N] = op(a)[B,M,K] @ op(b)[B,K,N], with a fused epilogue: a
// template that blocked.py fills in ({{...}}) for one configuration and one operand layout (two: a pair).
//
// Each workgroup computes a BM x BN block of the output; each of its (BM/TM)*(BN/TN) threads holds
// TM x TN results in registers as TM*TN/4 vec4 accumulators. The generator writes every accumulator as
// its own variable and unrolls the BK loop: naga does not unroll loops, and an accumulator array indexed
// in a loop would live in slow local memory instead of registers.
// Per BK step the block's A (BM x BK) and B (BK x BN) tiles go through workgroup memory as vec4s, so the inner
// product reads 4 values per load. The tiles are nested arrays indexed [buffer][k][column], not flat ones:
// with wgpu's runtime checks on (TINYNN_SHADER_CHECKS=1, unchecked.py) naga clamps every dynamic index, and a
// clamped flat index is a new address per load, while here k is a constant and a thread's column is the same every
// step, so its clamp is made once and each load is a constant offset from one address. A thread's rows and columns
// are interleaved with its neighbours' (4-wide groups THREADS_M or THREADS_N apart) so a warp reads consecutive
// vec4s: no bank conflicts; each tile row (one k) is padded by a vec4 (in configurations that ask for it:
// A_STRIDE, B_STRIDE), so that threads storing neighbouring k (an operand stored with k contiguous) hit
// different banks too. Double-buffered variants
// (BUFFERS = 2) keep two tiles: the next step's global loads go into registers before this step's products and
// into the other buffer after them, so their latency hides behind the arithmetic, with one barrier per step.
// The generator can also run those loads two tiles ahead (BlockConfig.ahead, a second set of registers) and
// spread vec4 loads along k over every thread (BlockConfig.spread).
// Stores: a thread's 4 results of a row (4 neighbouring columns) are one vec4 store where every problem's N is a
// multiple of 4 (`quads` in blocked.py: each row then starts on a quad), and the epilogue reads and writes
// its arrays a quad at a time (`Value`); else 4 scalar stores, which cost about what no stores at all would save.
// Edges: out-of-range loads read 0 and out-of-range stores are skipped; no thread leaves before a barrier.
// Aligned variants, for shapes whose every tile lies whole inside the operands (M, N, K multiples of BM, BN,
// BK, no empty split), load without those checks, whose branch around each load slows the double-buffered
// kernels; stores stay checked. Workgroups are visited GROUP block-rows at a time so that the A and B panels
// being read stay in L2 (the raster order would stream all of B once per block-row).
// Grids above 65535 workgroups in y or z are launched as several dispatches; y_offset and z_offset say
// where this one starts.
//
// Split-K: with `splits` > 1 the z axis runs over (batch, split) and each split sums its own k_chunk of
// K into its own (M, N) slice of `out` (bound to a scratch buffer); matmul_finish_main (epilogue.wgsl) then adds
// the slices into the real output and applies the epilogue (a long K over a small M x N output would
// otherwise leave most of the GPU idle).
//
// The epilogue (epilogue.wgsl) is applied to each result as it is stored. Its row sums come from the A tiles
// already in workgroup memory: for the weight gradient g^T @ x this is the bias gradient, at no extra pass over
// g. In a pair's module the block's threads share the sums, each a quad of rows over every
// (THREADS / (BM / 4))-th k, and add their partial sums up in the A tiles after the loop (summed by the first
// BM / 4 threads alone, their warp does ~7% more work than the others at 128x128x16, and every warp waits for
// it at each barrier); see `_row_sums`.
//
// Pairs: matmul_pair_main runs two independent matmuls of one block configuration in one dispatch (a linear
// layer's input and weight gradients, which both read its output's gradient): the first problem's workgroups,
// then the second's, each with its own operands, layout, params and split count. A small problem leaves most
// of a large GPU idle or runs one workgroup per SM with too few warps to hide latency; two of them side by side
// fill it, and one barrier between dispatches goes too. The two share the tiles in workgroup memory and
// the epilogue's arrays, which only one of them may use each (a linear layer's: the input gradient pre, the
// weight gradient row_sums; either may be the first here, PairedMatmul putting the longer K chunk first).
//
// The file has three parts: the module (what follows), `pair` (matmul_pair_main and matmul_pair_finish_main, in a
// pair's module only) and `product` (one workgroup's block of a problem: written into matmul_main, and twice into
// matmul_pair_main). epilogue.wgsl adds one problem's bindings, loads, stores and split-K finish per problem.
// Bindings: a, b, out, params, bias, residual, pre, row_sums, and a pair's second problem's a2, b2, out2, params2;
// the finishes read the split slices from parts and row_parts (a pair's second problem's from parts2 and
// row_parts2). Unused ones are bound to small stand-ins.
// vec4 variants read a and b as vec4s: a quad along a contiguous m or n is one tile entry; quads along a
// contiguous k are loaded 4 rows at a time and transposed into the tile (4x fewer load instructions).

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const THREADS_M: u32 = {{THREADS_M}}u;  // BM / TM
const THREADS_N: u32 = {{THREADS_N}}u;  // BN / TN
const THREADS: u32 = {{THREADS}}u;
const GROUP: u32 = {{GROUP}}u;

const BUFFERS: u32 = {{BUFFERS}}u;  // 2: double-buffered
// [buffer][k][m / 4 (+ 1 where padded)] and [buffer][k][n / 4 (+ 1)], nested: see the header
var<workgroup> a_tile: array<array<array<vec4<f32>, {{A_STRIDE}}>, BK>, BUFFERS>;
var<workgroup> b_tile: array<array<array<vec4<f32>, {{B_STRIDE}}>, BK>, BUFFERS>;

{{PROBLEMS}}
@compute @workgroup_size({{THREADS}})
fn matmul_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let z = wg.z + params.z_offset;
    let block_x = wg.x;
    let block_y = wg.y;
    let blocks_x = nwg.x;
    let blocks_y = nwg.y;
    let y_offset = params.y_offset;
{{PRODUCT}}
}

{{PAIR}}
//:: pair
// Two problems in one grid, workgroup by workgroup: the first's blocks (x fastest, then y, then batch and split),
// then the second's; the grid's spare workgroups (rounded up to a rectangle) do nothing.
@compute @workgroup_size({{THREADS}})
fn matmul_pair_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    let first = ((params.n + BN - 1u) / BN) * ((params.m + BM - 1u) / BM) * params.batch * params.splits;
    if (id < first) {
        let blocks_x = (params.n + BN - 1u) / BN;
        let blocks_y = (params.m + BM - 1u) / BM;
        let z = id / (blocks_x * blocks_y);
        let block_x = id % blocks_x;
        let block_y = (id / blocks_x) % blocks_y;
        let y_offset = 0u;
{{PRODUCT}}
    } else {
        let blocks_x = (params2.n + BN - 1u) / BN;
        let blocks_y = (params2.m + BM - 1u) / BM;
        let second = id - first;
        if (second < blocks_x * blocks_y * params2.batch * params2.splits) {
            let z = second / (blocks_x * blocks_y);
            let block_x = second % blocks_x;
            let block_y = (second / blocks_x) % blocks_y;
            let y_offset = 0u;
{{PRODUCT2}}
        }
    }
}

// Both problems' split-K finishes in one dispatch, where both are split: the first's Values (its workgroups rounded
// up to whole ones), then the second's. One dispatch fewer, and each problem's finish fills the GPU's gaps in the
// other's.
@compute @workgroup_size(256)
fn matmul_pair_finish_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let id = (wg.y * nwg.x + wg.x) * 256u + lid;
    let first = (params.batch * params.m * params.n / WIDTH + 255u) / 256u * 256u;
    if (id < first) {
        finish_split(id);
    } else {
        finish_split2(id - first);
    }
}
//:: product
    // block (block_x, block_y) of the grid's blocks_x x blocks_y, batch and split z, of problem {{P}}
    let m_dim = params{{P}}.m;
    let n_dim = params{{P}}.n;
    let batch = z / params{{P}}.splits;
    let k_begin = (z % params{{P}}.splits) * params{{P}}.k_chunk;
    let k_end = min(params{{P}}.k, k_begin + params{{P}}.k_chunk);
    // grouped order: GROUP block-rows share the B panels they read while they are in L2
    let linear = block_y * blocks_x + block_x;
    let per_group = GROUP * blocks_x;
    let first_row = (linear / per_group) * GROUP;
    let rows_here = min(blocks_y - first_row, GROUP);
    let block_m = first_row + (linear % per_group) % rows_here + y_offset;
    let block_n = (linear % per_group) / rows_here;
    let row0 = block_m * BM;
    let col0 = block_n * BN;
    let a_base = batch * m_dim * params{{P}}.k;
    let b_base = select(batch * params{{P}}.k * n_dim, 0u, params{{P}}.shared_b == 1u);
    let tx = lid % THREADS_N;
    let ty = lid / THREADS_N;
    let sum_rows = params{{P}}.row_sums == 1u && block_n == 0u;  // one block-column sums A's rows
    var row_sum = vec4<f32>(0.0);
{{DECLARE}}
{{PROLOGUE}}
    var buf = 0u;  // the buffer holding this step's tiles
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
{{FETCH}}
{{INNER}}
{{ROW_SUM}}
{{STASH}}
        workgroupBarrier();
        buf = (buf + 1u) % BUFFERS;
    }
    let raw = params{{P}}.splits > 1u;  // a split's partial sum: matmul_finish_main applies the epilogue
    let out_base = z * m_dim * n_dim;  // with splits: this split's own slice
{{STORE}}
{{ROW_SUM_STORE}}
