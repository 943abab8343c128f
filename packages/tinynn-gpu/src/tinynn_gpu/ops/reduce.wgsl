// Sum or max over the middle axis of a (outer, R, inner) view (any run of adjacent axes reduces this way),
// in one dispatch, every read coalesced:
// - reduce_rows_main (inner = 1, R contiguous): one workgroup per row, its threads striding along R;
// - reduce_columns_main (inner > 1): one workgroup per 32 adjacent columns of one outer index, 8 threads
//   per column each folding every 8th row, so a warp reads 32 consecutive floats of a row.
// group_sum is filled in by group_sum.py: subgroup operations where the device has them.
// Bindings: a, out, params. out is (outer, inner).

struct Params { outer: u32, r: u32, inner: u32, op: u32 }  // op: 0 sum, 1 max

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

{{GROUP_SUM}}

const COLUMNS: u32 = 32u;  // reduce_columns_main: columns per workgroup
const LANES: u32 = 8u;  // threads per column

fn fold(acc: f32, x: f32, is_max: bool) -> f32 {
    return select(acc + x, max_nan(acc, x), is_max);
}

@compute @workgroup_size(256)
fn reduce_rows_main(grid: Grid, lanes: Lanes) {
    let row = row_index(grid);
    if (row >= params.outer) { return; }
    let r_len = params.r;
    let base = row * r_len;
    if (params.op == 1u) {
        var m = neg_inf();
        for (var r = lanes.lid; r < r_len; r = r + 256u) { m = max_nan(m, a[base + r]); }
        m = workgroup_max(lanes.lid, m);
        if (lanes.lid == 0u) { out[row] = m; }
    } else {
        var s0 = 0.0;  // two accumulators: two loads in flight per thread
        var s1 = 0.0;
        var r = lanes.lid;
        for (; r + 256u < r_len; r = r + 512u) {
            s0 = s0 + a[base + r];
            s1 = s1 + a[base + r + 256u];
        }
        if (r < r_len) { s0 = s0 + a[base + r]; }
        let s = group_sum(lanes, s0 + s1);
        if (lanes.lid == 0u) { out[row] = s; }
    }
}

@compute @workgroup_size(256)
fn reduce_columns_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let inner = params.inner;
    let tiles = (inner + COLUMNS - 1u) / COLUMNS;
    let tile = row_index(grid);
    if (tile >= params.outer * tiles) { return; }
    let o = tile / tiles;
    let j = (tile % tiles) * COLUMNS + lid % COLUMNS;
    let lane = lid / COLUMNS;
    let r_len = params.r;
    let is_max = params.op == 1u;
    var acc = select(0.0, neg_inf(), is_max);
    if (j < inner) {
        for (var r = lane; r < r_len; r = r + LANES) { acc = fold(acc, a[(o * r_len + r) * inner + j], is_max); }
    }
    scratch[lid] = acc;
    workgroupBarrier();
    if (lane == 0u && j < inner) {
        for (var l = 1u; l < LANES; l = l + 1u) { acc = fold(acc, scratch[lid + l * COLUMNS], is_max); }
        out[o * inner + j] = acc;
    }
}
