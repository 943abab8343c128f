// Embedding lookup and its gradient. The backward gives each (chunk of positions, row v, column c) one
// thread that sums the gradients of the chunk's positions whose index is v: no atomics, a fixed order, and
// enough threads to fill the GPU; the launcher adds the chunks' partial tables. A GPT's input, token plus
// position rows, has a forward and a backward of its own.
// An id outside [0, V) sets bit ID_ERROR in `errors`, which the runtime raises at the next read-back (the
// NumPy backend raises the same error at once); its row reads as zeros meanwhile.
// Bindings: 0:weight 1:idx 2:out 3:params 4:g 5:positions 7:tokens 8:errors

struct Params {
    total: u32,      // forward: N * C; embedding_backward: V * C; with positions: P * C (the position table)
    cols: u32,       // C
    rows: u32,       // V, the table's rows
    positions: u32,  // embedding_backward: N; with positions: T (positions per sequence)
    chunk: u32,      // backward: positions per chunk
    chunks: u32,
    batch: u32,      // embedding_with_positions_backward_main: the sequences (N / T)
}

@group(0) @binding(0) var<storage, read> weight: array<f32>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> g: array<f32>;
@group(0) @binding(5) var<storage, read> positions: array<f32>;  // a GPT's position table (wpe)
@group(0) @binding(7) var<storage, read_write> tokens: array<f32>;
@group(0) @binding(8) var<storage, read_write> errors: array<atomic<u32>>;

const ID_ERROR: u32 = 1u;  // runtime.py's KERNEL_ERRORS

fn in_range(id: i32) -> bool {
    let ok = id >= 0 && id < i32(params.rows);
    if (!ok) { atomicOr(&errors[0], ID_ERROR); }
    return ok;
}

@compute @workgroup_size(256)
fn embedding_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let cols = params.cols;
    if (i >= params.total) { return; }
    let id = idx[i / cols];
    var value = 0.0;
    if (in_range(id)) { value = weight[u32(id) * cols + i % cols]; }
    out[i] = value;
}

// out = weight[idx] + positions[:T], a GPT's input: ids (..., T), `positions` here T.
@compute @workgroup_size(256)
fn embedding_with_positions_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                                         @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let cols = params.cols;
    if (i >= params.total) { return; }
    let n = i / cols;
    let id = idx[n];
    var value = 0.0;
    if (in_range(id)) { value = weight[u32(id) * cols + i % cols]; }
    out[i] = value + positions[(n % params.positions) * cols + i % cols];
}

// embedding_with_positions' backward in one dispatch. Workgroup v < V (`rows`) writes row v of the token
// gradient `tokens`: it reads the ids 256 at a time into workgroup memory, and its threads, one per column,
// add g's row of every position whose id is v, in position order (no atomics: the same sum every run).
// The workgroups after them write the position gradient out (P, C) (`total` = P * C, `positions` = T), one
// thread an element: row p < T the sum over the batch of g[b, p], in batch order, rows T onwards 0.
var<workgroup> chunk_ids: array<i32, 256>;

@compute @workgroup_size(256)
fn embedding_with_positions_backward_main(@builtin(workgroup_id) wg: vec3<u32>,
                                          @builtin(num_workgroups) nwg: vec3<u32>,
                                          @builtin(local_invocation_index) lid: u32) {
    let w = row_index(wg, nwg);
    let cols = params.cols;
    if (w < params.rows) {
        token_row(i32(w), lid);
        return;
    }
    let i = (w - params.rows) * 256u + lid;
    if (i >= params.total) { return; }
    let row_stride = params.positions * cols;
    var acc = 0.0;
    if (i < row_stride) {
        for (var b = 0u; b < params.batch; b = b + 1u) { acc = acc + g[b * row_stride + i]; }
    }
    out[i] = acc;
}

fn token_row(v: i32, lid: u32) {
    let cols = params.cols;
    let n = params.batch * params.positions;
    for (var c0 = 0u; c0 < cols; c0 = c0 + 256u) {
        let c = c0 + lid;
        var acc = 0.0;
        for (var base = 0u; base < n; base = base + 256u) {
            workgroupBarrier();  // the previous chunk's ids are read by all
            var id = -1;
            if (base + lid < n) {
                id = idx[base + lid];
                if (v == 0 && c0 == 0u) { _ = in_range(id); }
            }
            chunk_ids[lid] = id;
            workgroupBarrier();
            let count = min(256u, n - base);
            if (c < cols) {
                for (var k = 0u; k < count; k = k + 1u) {
                    if (chunk_ids[k] == v) { acc = acc + g[(base + k) * cols + c]; }
                }
            }
        }
        if (c < cols) { tokens[u32(v) * cols + c] = acc; }
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
