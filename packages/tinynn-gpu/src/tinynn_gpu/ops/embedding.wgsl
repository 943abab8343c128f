// Embedding lookup and its gradient. The backward gives workgroup (row v, column block) the positions whose id
// is v, listed in position order in workgroup memory a chunk at a time, and adds their gradient rows in that
// order: no atomics, the same sum every run. It lists them one of two ways, which embedding.py chooses by the
// vocabulary: at a large one from the (id, position) pairs sorted once beforehand (embedding_sort_main, one
// workgroup), each row finding its run by a binary search, so that the cost is the sort plus the table and the
// gradient read once, not V x N; at a small one by scanning every id, which costs V x N id reads but no
// dispatch of its own. A GPT's input, token plus position rows, has a forward and a backward of its own; the
// plain embedding's backward is the same kernel without the position table.
// An id outside [0, V) sets bit ID_ERROR in `errors`, which the runtime raises at the next read-back (the
// NumPy backend raises the same error at once); its row reads as zeros meanwhile, and the backward drops it.
// Bindings: weight, idx, out, params, g, positions, g_wpe, g_wte, errors, keys

struct Params {
    total: u32,      // forward: N * C; backward: P * C (the position table; 0 without one)
    cols: u32,       // C
    rows: u32,       // V, the table's rows
    positions: u32,  // with positions: T (positions per sequence); the plain backward: N
    batch: u32,      // backward: the sequences (N / T; the plain backward: 1)
    blocks: u32,     // ... the column blocks of a token row, a workgroup each
    block_cols: u32, // ... and their width
    pairs: u32,      // the sorted pairs: N rounded up to a power of two
    scan: u32,       // backward: 1 to list each row's positions by scanning the ids, 0 from the sorted pairs
}

@group(0) @binding(0) var<storage, read> weight: array<f32>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read> positions: array<f32>;  // a GPT's position table (wpe)
@group(0) @binding(6) var<storage, read_write> g_wpe: array<f32>;  // its position table's gradient
@group(0) @binding(7) var<storage, read_write> g_wte: array<f32>;  // embedding_with_positions' token table's gradient
@group(0) @binding(8) var<storage, read_write> errors: array<atomic<u32>>;
// (id, position) of every position, sorted: keys[2k] the id, keys[2k + 1] the position
@group(0) @binding(9) var<storage, read_write> keys: array<u32>;

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
fn embedding_forward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.total) { return; }
    out[i] = token_row_value(i / params.cols, i % params.cols);
}

// out = weight[idx] + positions[:T], a GPT's input: ids (..., T), `positions` here T.
@compute @workgroup_size(256)
fn embedding_with_positions_forward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    let cols = params.cols;
    if (i >= params.total) { return; }
    let n = i / cols;
    out[i] = token_row_value(n, i % cols) + positions[(n % params.positions) * cols + i % cols];
}

// The ids' (id, position) pairs sorted by id, then position, into `keys`: a bitonic sort by one workgroup in
// storage memory, params.pairs (a power of two) pairs, those past N and ids out of range (flagged) given the
// largest key so that they sort last and no row finds them. The pairs are distinct, so the order is unique.
const NO_ID: u32 = 0xffffffffu;

@compute @workgroup_size(256)
fn embedding_sort_main(@builtin(local_invocation_index) lid: u32) {
    let n = params.batch * params.positions;
    let size = params.pairs;
    for (var i = lid; i < size; i = i + 256u) {
        var id = NO_ID;
        var at = NO_ID;
        if (i < n) {
            at = i;
            if (in_range(idx[i])) { id = u32(idx[i]); }
        }
        keys[2u * i] = id;
        keys[2u * i + 1u] = at;
    }
    storageBarrier();
    for (var k = 2u; k <= size; k = k << 1u) {
        for (var j = k >> 1u; j > 0u; j = j >> 1u) {
            for (var i = lid; i < size; i = i + 256u) {
                let l = i ^ j;
                if (l > i) {
                    let a = vec2<u32>(keys[2u * i], keys[2u * i + 1u]);
                    let b = vec2<u32>(keys[2u * l], keys[2u * l + 1u]);
                    let a_after_b = a.x > b.x || (a.x == b.x && a.y > b.y);
                    if (a_after_b == ((i & k) == 0u)) {  // out of this run's order (ascending where i & k is 0)
                        keys[2u * i] = b.x;
                        keys[2u * i + 1u] = b.y;
                        keys[2u * l] = a.x;
                        keys[2u * l + 1u] = a.y;
                    }
                }
            }
            storageBarrier();
        }
    }
}

// The backward of both embeddings in one dispatch, after embedding_sort_main unless params.scan. The first
// rows * blocks workgroups write the token gradient `g_wte`, workgroup (v, block) its row v's columns
// [block * block_cols, ...) (token_block). The workgroups after them write the position gradient g_wpe (P, C)
// (`total` = P * C, `positions` = T), one thread an element: row p < T the sum over the batch of g[b, p] (in a
// fixed order), rows T onwards 0.
@compute @workgroup_size(256)
fn embedding_backward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let w = row_index(grid);
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

// Row v's positions, CHUNK at a time: those of the sorted run, or of the ids scanned (all N, in chunks), listed in
// `hits`; then threads HIT_LANES by COL_LANES add g's rows at the listed positions, lane h taking every
// HIT_LANES-th, and the lanes are added in a fixed order.
const COL_LANES: u32 = 32u;
const HIT_LANES: u32 = 8u;
const IDS_PER_THREAD: u32 = 8u;
const CHUNK: u32 = 256u * IDS_PER_THREAD;

var<workgroup> hits: array<u32, CHUNK>;  // the chunk's positions whose id is v, in order
var<workgroup> hit_ends: array<u32, 256>;  // scanning: thread t's hits end at hit_ends[t] (a prefix sum)
var<workgroup> lane_sums: array<f32, 256>;
var<workgroup> run_first: u32;  // the row's run of sorted pairs, found by thread 0
var<workgroup> run_length: u32;

fn token_block(v: u32, block: u32, lid: u32) {
    let cols = params.cols;
    let c_lo = block * params.block_cols;
    let c_hi = min(c_lo + params.block_cols, cols);
    var listed = params.batch * params.positions;  // the positions to list: every id when scanning
    if (params.scan == 0u) {
        if (lid == 0u) {
            run_first = run_start(v);
            run_length = run_start(v + 1u) - run_first;
        }
        listed = workgroupUniformLoad(&run_length);  // (its barrier also shows every thread run_first)
    }
    if (listed == 0u) {  // most rows of a large vocabulary: zeros, without the lanes' sums
        for (var c = c_lo + lid; c < c_hi; c = c + 256u) { g_wte[v * cols + c] = 0.0; }
        return;
    }
    for (var base = 0u; base < listed; base = base + CHUNK) {
        var count: u32;
        if (params.scan != 0u) {
            count = scan_hits(v, base, lid, v == 0u && block == 0u);
        } else {
            count = min(CHUNK, listed - base);
            for (var k = lid; k < count; k = k + 256u) { hits[k] = keys[2u * (run_first + base + k) + 1u]; }
            workgroupBarrier();
        }
        add_hits(v, c_lo, c_hi, count, base == 0u, lid);
    }
}

// g_wte[v, c_lo:c_hi] = (or += after the first chunk) the sum of g's rows at hits[0:count], in order.
fn add_hits(v: u32, c_lo: u32, c_hi: u32, count: u32, first_chunk: bool, lid: u32) {
    let cols = params.cols;
    let lane = lid / COL_LANES;
    for (var c0 = c_lo; c0 < c_hi; c0 = c0 + COL_LANES) {
        let c = c0 + lid % COL_LANES;
        var acc = vec4<f32>(0.0);  // four hits in flight
        if (c < c_hi) {
            var k = lane;
            for (; k + 3u * HIT_LANES < count; k = k + 4u * HIT_LANES) {
                acc = acc + vec4<f32>(g[hits[k] * cols + c], g[hits[k + HIT_LANES] * cols + c],
                                      g[hits[k + 2u * HIT_LANES] * cols + c], g[hits[k + 3u * HIT_LANES] * cols + c]);
            }
            for (; k < count; k = k + HIT_LANES) { acc.x = acc.x + g[hits[k] * cols + c]; }
        }
        lane_sums[lid] = (acc.x + acc.y) + (acc.z + acc.w);
        workgroupBarrier();
        if (lane == 0u && c < c_hi) {
            var s = 0.0;
            for (var h = 0u; h < HIT_LANES; h = h + 1u) { s = s + lane_sums[h * COL_LANES + lid]; }
            let at = v * cols + c;
            if (first_chunk) { g_wte[at] = s; } else { g_wte[at] = g_wte[at] + s; }
        }
        workgroupBarrier();  // lane_sums and hits are read before they are reused
    }
}

// The first sorted pair whose id is v or more (params.pairs if none).
fn run_start(v: u32) -> u32 {
    var lo = 0u;
    var hi = params.pairs;
    while (lo < hi) {
        let mid = (lo + hi) / 2u;
        if (keys[2u * mid] < v) { lo = mid + 1u; } else { hi = mid; }
    }
    return lo;
}

// Lists the positions in [base, base + CHUNK) whose id is v in `hits`, returns how many (after a barrier);
// `check` flags the ids out of range. Thread t reads ids base + t * IDS_PER_THREAD onwards, so the list comes
// out in position order.
fn scan_hits(v: u32, base: u32, lid: u32, check: bool) -> u32 {
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
