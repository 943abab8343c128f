// Embedding lookup and its gradient. The backward gives each (chunk of positions, row v, column c) one
// thread that sums the gradients of the chunk's positions whose index is v: no atomics, a fixed order, and
// enough threads to fill the GPU; the launcher adds the chunks' partial tables. A GPT's input, token plus
// position rows, has a forward and a backward of its own.
// An id outside [0, V) sets bit ID_ERROR in `errors`, which the runtime raises at the next read-back (the
// NumPy backend raises the same error at once); its row reads as zeros meanwhile.
// Bindings: weight, idx, out, params, g, positions, g_wpe, g_wte, errors

struct Params {
    total: u32,      // forward: N * C; embedding_backward: V * C; with positions: P * C (the position table)
    cols: u32,       // C
    rows: u32,       // V, the table's rows
    positions: u32,  // embedding_backward: N; with positions: T (positions per sequence)
    chunk: u32,      // backward: positions per chunk
    chunks: u32,
    batch: u32,      // embedding_with_positions_backward_main: the sequences (N / T)
    blocks: u32,     // ... the column blocks of a token row, a workgroup each
    block_cols: u32, // ... and their width
}

@group(0) @binding(0) var<storage, read> weight: array<f32>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read> positions: array<f32>;  // a GPT's position table (wpe)
@group(0) @binding(6) var<storage, read_write> g_wpe: array<f32>;  // its position table's gradient
@group(0) @binding(7) var<storage, read_write> g_wte: array<f32>;  // embedding_with_positions' token table's gradient
@group(0) @binding(8) var<storage, read_write> errors: array<atomic<u32>>;

const ID_ERROR: u32 = 1u;  // runtime.py's KERNEL_ERRORS

fn in_range(id: i32) -> bool {
    let ok = id >= 0 && id < i32(params.rows);
    if (!ok) { atomicOr(&errors[0], ID_ERROR); }
    return ok;
}

// weight[idx[n], col]; 0 (and the error flag) for an id out of range
fn token_row_value(n: u32, col: u32) -> f32 {
    let id = idx[n];
    if (!in_range(id)) { return 0.0; }
    return weight[u32(id) * params.cols + col];
}

@compute @workgroup_size(256)
fn embedding_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i >= params.total) { return; }
    out[i] = token_row_value(i / params.cols, i % params.cols);
}

// out = weight[idx] + positions[:T], a GPT's input: ids (..., T), `positions` here T.
@compute @workgroup_size(256)
fn embedding_with_positions_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                                         @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let cols = params.cols;
    if (i >= params.total) { return; }
    let n = i / cols;
    out[i] = token_row_value(n, i % cols) + positions[(n % params.positions) * cols + i % cols];
}

// embedding_with_positions' backward in one dispatch. The first rows * blocks workgroups write the token
// gradient `g_wte`, workgroup (v, block) its row v's columns [block * block_cols, ...): it lists the
// positions whose id is v, in position order (CHUNK ids at a time, a prefix sum placing each thread's
// hits), then its threads, HIT_LANES by COL_LANES, add g's rows at the listed positions, lane h taking every
// HIT_LANES-th, and the lanes are added in a fixed order: no atomics, the same sum every run, and g read only
// where an id matches (the ids are read once per workgroup). The workgroups after them write the position
// gradient g_wpe (P, C) (`total` = P * C, `positions` = T), one thread an element: row p < T the sum over the
// batch of g[b, p] (in a fixed order: the same sum every run), rows T onwards 0.
const COL_LANES: u32 = 32u;
const HIT_LANES: u32 = 8u;
const IDS_PER_THREAD: u32 = 8u;
const CHUNK: u32 = 256u * IDS_PER_THREAD;

var<workgroup> hits: array<u32, CHUNK>;  // the positions of the chunk whose id is v
var<workgroup> hit_ends: array<u32, 256>;  // thread t's hits end at hit_ends[t] (a prefix sum)
var<workgroup> lane_sums: array<f32, 256>;

@compute @workgroup_size(256)
fn embedding_with_positions_backward_main(@builtin(workgroup_id) wg: vec3<u32>,
                                          @builtin(num_workgroups) nwg: vec3<u32>,
                                          @builtin(local_invocation_index) lid: u32) {
    let w = row_index(wg, nwg);
    let cols = params.cols;
    let token_groups = params.rows * params.blocks;
    if (w < token_groups) {
        token_block(w / params.blocks, w % params.blocks, lid);
        return;
    }
    let i = (w - token_groups) * 256u + lid;
    if (i >= params.total) { return; }
    let row_stride = params.positions * cols;
    var acc = vec4<f32>(0.0);  // four sequences' rows in flight, each lane of acc summing in batch order
    if (i < row_stride) {
        var b = 0u;
        for (; b + 3u < params.batch; b = b + 4u) {
            let at = b * row_stride + i;
            acc = acc + vec4<f32>(g[at], g[at + row_stride], g[at + 2u * row_stride], g[at + 3u * row_stride]);
        }
        for (; b < params.batch; b = b + 1u) { acc.x = acc.x + g[b * row_stride + i]; }
    }
    g_wpe[i] = (acc.x + acc.y) + (acc.z + acc.w);
}

// Lists the hits of ids [base, base + CHUNK) for row v in `hits`, returns how many (after a barrier).
// Thread t reads ids base + t * IDS_PER_THREAD onwards, so the list comes out in position order.
fn list_hits(v: u32, base: u32, lid: u32, check: bool) -> u32 {
    let n = params.batch * params.positions;
    let first = base + lid * IDS_PER_THREAD;
    var mine = 0u;
    for (var k = 0u; k < IDS_PER_THREAD; k = k + 1u) {
        if (first + k < n) {
            let id = idx[first + k];
            if (check) { _ = in_range(id); }
            mine = mine + u32(id == i32(v));
        }
    }
    hit_ends[lid] = mine;
    workgroupBarrier();
    for (var step = 1u; step < 256u; step = step << 1u) {  // an inclusive prefix sum, Hillis-Steele
        var add = 0u;
        if (lid >= step) { add = hit_ends[lid - step]; }
        workgroupBarrier();
        hit_ends[lid] = hit_ends[lid] + add;
        workgroupBarrier();
    }
    var at = hit_ends[lid] - mine;
    for (var k = 0u; k < IDS_PER_THREAD; k = k + 1u) {
        if (first + k < n && idx[first + k] == i32(v)) {
            hits[at] = first + k;
            at = at + 1u;
        }
    }
    let count = hit_ends[255];
    workgroupBarrier();
    return count;
}

fn token_block(v: u32, block: u32, lid: u32) {
    let cols = params.cols;
    let n = params.batch * params.positions;
    let lane = lid / COL_LANES;
    let c_lo = block * params.block_cols;
    let c_hi = min(c_lo + params.block_cols, cols);
    for (var base = 0u; base < n; base = base + CHUNK) {
        let count = list_hits(v, base, lid, v == 0u && block == 0u);
        for (var c0 = c_lo; c0 < c_hi; c0 = c0 + COL_LANES) {
            let c = c0 + lid % COL_LANES;
            var acc = vec4<f32>(0.0);  // four hits in flight
            if (c < c_hi) {
                var k = lane;
                for (; k + 3u * HIT_LANES < count; k = k + 4u * HIT_LANES) {
                    acc = acc + vec4<f32>(g[hits[k] * cols + c], g[hits[k + HIT_LANES] * cols + c],
                                          g[hits[k + 2u * HIT_LANES] * cols + c],
                                          g[hits[k + 3u * HIT_LANES] * cols + c]);
                }
                for (; k < count; k = k + HIT_LANES) { acc.x = acc.x + g[hits[k] * cols + c]; }
            }
            lane_sums[lid] = (acc.x + acc.y) + (acc.z + acc.w);
            workgroupBarrier();
            if (lane == 0u && c < c_hi) {
                var s = 0.0;
                for (var h = 0u; h < HIT_LANES; h = h + 1u) { s = s + lane_sums[h * COL_LANES + lid]; }
                let at = v * cols + c;
                if (base == 0u) { g_wte[at] = s; } else { g_wte[at] = g_wte[at] + s; }
            }
            workgroupBarrier();  // lane_sums and hits are read before they are reused
        }
    }
    if (n == 0u) {
        for (var c = c_lo + lid; c < c_hi; c = c + 256u) { g_wte[v * cols + c] = 0.0; }
    }
}

// out is (chunks, V, C). The threads of column 0 of row 0 also check their chunk's ids.
@compute @workgroup_size(256)
fn embedding_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let table = params.total;
    if (i >= table * params.chunks) { return; }
    let cols = params.cols;
    let chunk = i / table;
    let v = i32((i % table) / cols);
    let c = i % cols;
    let start = chunk * params.chunk;
    let stop = min(start + params.chunk, params.positions);
    var acc = 0.0;
    for (var n = start; n < stop; n = n + 1u) {
        if (idx[n] == v) { acc = acc + g[n * cols + c]; }
    }
    if (i % table == 0u) {
        for (var n = start; n < stop; n = n + 1u) { _ = in_range(idx[n]); }
    }
    out[i] = acc;
}
