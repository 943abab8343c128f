// LayerNorm over the last axis (C). Each row belongs to one team of threads (a subgroup, or 32 threads
// adding through workgroup memory: row_sum_*.wgsl, filled in by group_sum.py), ROWS rows per 256-thread
// workgroup: a row of a few hundred floats is a few loads per thread, and its sums need no barrier where
// the adapter has subgroups (one workgroup per row waited on eight-round workgroup trees). The backward is
// one dispatch for the input, weight and bias gradients. On an H200 (experiments/row_kernels.py, 50 calls
// back to back) this took the forward from 8.4 to 4.7 us at 2048 x 256 (8.8 to 5.9 at 2048 x 384) and
// the backward from 9.9 to 8.2 (10.7 to 9.6), before the loops were made to load before they store.
// Bindings: 0:x 1:weight 2:bias 3:params 4:out 5:mean 6:rstd 7:g 8:g_add 9:partials 10:g_weight 11:g_bias
// A missing weight or bias is bound as ones or zeros by the launcher, so one kernel serves every case.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

struct Params {
    rows: u32, cols: u32, eps: f32,
    has_g_add: u32,
    param_groups: u32,  // the backward's column workgroups (0: no weight or bias gradient wanted)
    group_cols: u32,  // the columns of one column workgroup (a power of two up to 256)
    split_rows: u32, splits: u32,  // the rows each column workgroup sums, and how many splits cover them
}
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(7) var<storage, read> g: array<f32>;
@group(0) @binding(8) var<storage, read> g_add: array<f32>;
@group(0) @binding(9) var<storage, read_write> partials: array<f32>;
@group(0) @binding(10) var<storage, read_write> g_weight: array<f32>;
@group(0) @binding(11) var<storage, read_write> g_bias: array<f32>;

{{ROW_SUM}}

// The elements of row `row` that `team` holds (lane, lane + width, ...) end below this: 0 for a team with no
// row (past the workgroup's ROWS or the last row), which still calls row_sum, adding zeros.
fn team_end(r: u32, row: u32) -> u32 { return select(0u, params.cols, r < ROWS && row < params.rows); }

// Four elements w apart, loaded together: every loop below loads a few elements' operands before it
// stores anything, as the compiler may not move a load above a store to another binding (they could alias)
// and each load would otherwise wait out a trip to memory on its own.
fn x4(i: u32, w: u32) -> vec4<f32> { return vec4<f32>(x[i], x[i + w], x[i + 2u * w], x[i + 3u * w]); }
fn g4(i: u32, w: u32) -> vec4<f32> { return vec4<f32>(g[i], g[i + w], g[i + 2u * w], g[i + 3u * w]); }
fn g_add4(i: u32, w: u32) -> vec4<f32> {
    return vec4<f32>(g_add[i], g_add[i + w], g_add[i + 2u * w], g_add[i + 3u * w]);
}
fn weight4(j: u32, w: u32) -> vec4<f32> {
    return vec4<f32>(weight[j], weight[j + w], weight[j + 2u * w], weight[j + 3u * w]);
}
fn bias4(j: u32, w: u32) -> vec4<f32> { return vec4<f32>(bias[j], bias[j + w], bias[j + 2u * w], bias[j + 3u * w]); }

fn store4(i: u32, w: u32, v: vec4<f32>) {
    out[i] = v.x;
    out[i + w] = v.y;
    out[i + 2u * w] = v.z;
    out[i + 3u * w] = v.w;
}

// sum over a team's elements of row `base` of (x - mu)^p, p = 1 or 2, eight loads in flight per thread
fn moment(base: u32, end: u32, team: Team, mu: f32, p: u32) -> f32 {
    let w = team.width;
    var acc = vec4<f32>(0.0);
    var j = team.lane;
    for (; j + 7u * w < end; j = j + 8u * w) {
        let a = x4(base + j, w) - mu;
        let b = x4(base + j + 4u * w, w) - mu;
        acc = acc + select(a + b, a * a + b * b, p == 2u);
    }
    for (; j < end; j = j + w) {
        let d = x[base + j] - mu;
        acc.x = acc.x + select(d, d * d, p == 2u);
    }
    return (acc.x + acc.y) + (acc.z + acc.w);
}

// out = y; mean, rstd per row.
@compute @workgroup_size(256)
fn layernorm_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          lanes: Lanes) {
    let team = team_of(lanes);
    let cols = params.cols;
    let w = team.width;
    let rows_each = team_rows(team);
    for (var k = 0u; k < rows_each; k = k + 1u) {
        let r = team.id + k * team.count;
        let row = row_index(wg, nwg) * ROWS + r;
        let end = team_end(r, row);
        let base = row * cols;
        let mu = row_sum(team, vec2<f32>(moment(base, end, team, 0.0, 1u), 0.0)).x / f32(cols);
        // two passes: E[(x - mu)^2] keeps its precision where E[x^2] - mu^2 would not
        let variance = row_sum(team, vec2<f32>(moment(base, end, team, mu, 2u), 0.0)).x / f32(cols);
        let rs = inverseSqrt(variance + params.eps);
        var j = team.lane;
        for (; j + 3u * w < end; j = j + 4u * w) {
            store4(base + j, w, (x4(base + j, w) - mu) * rs * weight4(j, w) + bias4(j, w));
        }
        for (; j < end; j = j + w) { out[base + j] = (x[base + j] - mu) * rs * weight[j] + bias[j]; }
        if (team.lane == 0u && end > 0u) {
            mean[row] = mu;
            rstd[row] = rs;
        }
    }
}

// The backward in one dispatch: workgroups [0, param_groups) sum the weight and bias gradients down
// columns, the rest compute dx, ROWS rows each. Both kinds only read g, x and the saved statistics, so they
// run side by side with no pass between them, and no finish when one split covers all rows (`splits` = 1,
// rows <= split_rows): a column workgroup then writes g_weight and g_bias itself. With more rows, split s
// leaves its sums in partials (2, splits, C) for layernorm_param_grads_finish_main.
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * weight, plus g_add where has_g_add:
// x's gradient from its other uses (the residual stream's), added here rather than by another kernel.
@compute @workgroup_size(256)
fn layernorm_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           lanes: Lanes) {
    let group = row_index(wg, nwg);
    if (group < params.param_groups) {
        param_grads(group, lanes.lid);
        return;
    }
    let team = team_of(lanes);
    let cols = params.cols;
    let w = team.width;
    let add = params.has_g_add == 1u;
    let rows_each = team_rows(team);
    for (var k = 0u; k < rows_each; k = k + 1u) {
        let r = team.id + k * team.count;
        let row = (group - params.param_groups) * ROWS + r;
        let end = team_end(r, row);
        let base = row * cols;
        var mu = 0.0;
        var rs = 0.0;
        if (end > 0u) {
            mu = mean[row];
            rs = rstd[row];
        }
        let m = row_sum(team, dx_sums(base, end, team, mu, rs)) / f32(cols);
        var j = team.lane;
        for (; j + 3u * w < end; j = j + 4u * w) {
            let i = base + j;
            var dx = rs * (g4(i, w) * weight4(j, w) - m.x - (x4(i, w) - mu) * rs * m.y);
            if (add) { dx = dx + g_add4(i, w); }
            store4(i, w, dx);
        }
        for (; j < end; j = j + w) {
            let i = base + j;
            var dx = rs * (g[i] * weight[j] - m.x - (x[i] - mu) * rs * m.y);
            if (add) { dx = dx + g_add[i]; }
            out[i] = dx;
        }
    }
}

// (sum of gw, sum of gw * xhat) over a team's elements of one row, four elements in flight per thread
fn dx_sums(base: u32, end: u32, team: Team, mu: f32, rs: f32) -> vec2<f32> {
    let w = team.width;
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var j = team.lane;
    for (; j + 3u * w < end; j = j + 4u * w) {
        let gw = g4(base + j, w) * weight4(j, w);
        s1 = s1 + gw;
        s2 = s2 + gw * (x4(base + j, w) - mu) * rs;
    }
    for (; j < end; j = j + w) {
        let gw = g[base + j] * weight[j];
        s1.x = s1.x + gw;
        s2.x = s2.x + gw * (x[base + j] - mu) * rs;
    }
    return vec2<f32>((s1.x + s1.y) + (s1.z + s1.w), (s2.x + s2.y) + (s2.z + s2.w));
}

var<workgroup> lane_sums: array<vec2<f32>, 256>;

// Column workgroup w: group_cols columns, each summed by 256 / group_cols lanes over every lanes-th row of
// its split (eight rows in flight per lane), then the lanes added by a tree in workgroup memory. Neighbouring
// threads read neighbouring columns of a row. Few columns a workgroup make many workgroups, so a GPU's
// multiprocessors all share the columns' rows (a C-wide layer has C / group_cols of them).
fn param_grads(w: u32, lid: u32) {
    let cols = params.cols;
    let gc = params.group_cols;
    let strips = (cols + gc - 1u) / gc;
    let c = (w % strips) * gc + lid % gc;
    let split = w / strips;
    let step = 256u / gc;
    let lo = split * params.split_rows;
    let hi = min(lo + params.split_rows, params.rows);
    var sw = vec4<f32>(0.0);
    var sb = vec4<f32>(0.0);
    if (c < cols) {
        var r = lo + lid / gc;
        for (; r + 7u * step < hi; r = r + 8u * step) {
            let ra = vec4<u32>(r, r + step, r + 2u * step, r + 3u * step);
            let rb = ra + 4u * step;
            let ga = vec4<f32>(g[ra.x * cols + c], g[ra.y * cols + c], g[ra.z * cols + c], g[ra.w * cols + c]);
            let gb = vec4<f32>(g[rb.x * cols + c], g[rb.y * cols + c], g[rb.z * cols + c], g[rb.w * cols + c]);
            let xa = (vec4<f32>(x[ra.x * cols + c], x[ra.y * cols + c], x[ra.z * cols + c], x[ra.w * cols + c])
                      - vec4<f32>(mean[ra.x], mean[ra.y], mean[ra.z], mean[ra.w]))
                     * vec4<f32>(rstd[ra.x], rstd[ra.y], rstd[ra.z], rstd[ra.w]);
            let xb = (vec4<f32>(x[rb.x * cols + c], x[rb.y * cols + c], x[rb.z * cols + c], x[rb.w * cols + c])
                      - vec4<f32>(mean[rb.x], mean[rb.y], mean[rb.z], mean[rb.w]))
                     * vec4<f32>(rstd[rb.x], rstd[rb.y], rstd[rb.z], rstd[rb.w]);
            sw = sw + ga * xa + gb * xb;
            sb = sb + ga + gb;
        }
        for (; r < hi; r = r + step) {
            let gi = g[r * cols + c];
            sw.x = sw.x + gi * (x[r * cols + c] - mean[r]) * rstd[r];
            sb.x = sb.x + gi;
        }
    }
    lane_sums[lid] = vec2<f32>((sw.x + sw.y) + (sw.z + sw.w), (sb.x + sb.y) + (sb.z + sb.w));
    workgroupBarrier();
    for (var s = 128u; s >= gc; s = s >> 1u) {  // lid and lid + s hold the same column: s is a multiple of gc
        if (lid < s) { lane_sums[lid] = lane_sums[lid] + lane_sums[lid + s]; }
        workgroupBarrier();
    }
    if (lid < gc && c < cols) {
        let sums = lane_sums[lid];
        if (params.splits == 1u) {
            g_weight[c] = sums.x;
            g_bias[c] = sums.y;
        } else {
            partials[split * cols + c] = sums.x;
            partials[(params.splits + split) * cols + c] = sums.y;
        }
    }
}

// g_weight and g_bias: the column sums of the splits' partials (2, splits, C), one thread per column.
@compute @workgroup_size(256)
fn layernorm_param_grads_finish_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                                     @builtin(local_invocation_index) lid: u32) {
    let c = element_index(wg, nwg, lid);
    let cols = params.cols;
    if (c >= cols) { return; }
    var sums = vec2<f32>(0.0);
    for (var split = 0u; split < params.splits; split = split + 1u) {
        sums = sums + vec2<f32>(partials[split * cols + c], partials[(params.splits + split) * cols + c]);
    }
    g_weight[c] = sums.x;
    g_bias[c] = sums.y;
}
