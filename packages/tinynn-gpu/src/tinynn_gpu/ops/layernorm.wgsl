// LayerNorm over the last axis (C). Each row belongs to one team of threads (a subgroup, or 32 threads
// adding through workgroup memory: row_sum_*.wgsl, filled in by group_sum.py), ROWS rows per 256-thread
// workgroup: a row of a few hundred floats is a few loads per thread, and its sums need no barrier where
// the adapter has subgroups (a workgroup per row would wait on eight-round workgroup trees). The backward is
// one dispatch for the input, weight and bias gradients.
// A template (group_sum.shader fills it in): a `Value` is 4 neighbouring columns (a vec4) where C is a multiple
// of 4, else one float, and params.cols counts Values; a row loop's step takes as many Values a lane as cover
// a row in one step (group_sum.row_values), up to 8. A lane then has four times the bytes in flight.
// Python binds the arrays by the names declared below (ops/layernorm.py).
// A missing weight or bias is bound as ones or zeros by the launcher, so one kernel serves every case.

alias Value = {{VALUE}};
const WIDTH: u32 = {{WIDTH}}u;  // floats in a Value
// Values a lane takes per step of a row loop (group_sum.row_values): a line holding the marker "$s" stands for
// STEP lines, the marker replaced by 0, 1, ..., and one holding "$r" for ROWS_AHEAD likewise
const STEP: u32 = {{STEP}}u;
const ROWS_AHEAD: u32 = {{ROWS_AHEAD}}u;  // rows a lane loads at once in the backward's column sums

// The sum of a Value's floats
fn total(v: Value) -> f32 { return {{TOTAL}}; }

@group(0) @binding(0) var<storage, read> x: array<Value>;
@group(0) @binding(1) var<storage, read> weight: array<Value>;
@group(0) @binding(2) var<storage, read> bias: array<Value>;

struct Params {
    rows: u32, cols: u32, eps: f32,  // cols: Values a row
    has_g_add: u32,
    param_groups: u32,  // the backward's column workgroups (0: no weight or bias gradient wanted)
    group_cols: u32,  // the Value columns of one column workgroup (a power of two up to 256)
    split_rows: u32, splits: u32,  // the rows each column workgroup sums, and how many splits cover them
}
@group(0) @binding(4) var<storage, read_write> out: array<Value>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(7) var<storage, read> g: array<Value>;
@group(0) @binding(8) var<storage, read> g_add: array<Value>;
@group(0) @binding(9) var<storage, read_write> partials: array<Value>;
@group(0) @binding(10) var<storage, read_write> g_weight: array<Value>;
@group(0) @binding(11) var<storage, read_write> g_bias: array<Value>;

{{ROW_SUM}}

// A row's sum as its mean: over the row's floats, every lane of the team getting it.
fn row_mean(team: Team, partial: vec2<f32>) -> vec2<f32> { return row_sum(team, partial) / f32(params.cols * WIDTH); }

// The row loops take a few of a lane's Values a step (j, j + w, ..., j + (STEP - 1) w: the `_step` functions), and
// load all of a step's operands before they store anything: the compiler may not move a load above a store to
// another binding (they could alias), and each load would otherwise wait out a trip to memory on its own. Whole
// steps first, then the row's last, partial step (`whole` false), whose Values past the row's end (j >= end) read
// its last Value (a clamped index, not a branch around the load, so that every load of the step is in flight at
// once) and count as zero, their stores skipped. `whole` is a constant in each call, so a whole step carries
// neither clamp nor check. That matters where a lane's row takes several steps (floats, or C > 1024).
// `end` > 0 where j < end, so end - 1 does not wrap.
fn at(j: u32, end: u32, whole: bool) -> u32 { return select(min(j, end - 1u), j, whole); }
fn inside(j: u32, end: u32, whole: bool) -> bool { return whole || j < end; }

// (x - mu)^p, p = 1 or 2, of a step's Values of the row at `base`, added up (zero past the row)
fn moment_step(base: u32, j: u32, w: u32, end: u32, whole: bool, mu: f32, p: u32) -> Value {
    let d$s = x[base + at(j + $su * w, end, whole)] - mu;
    var acc = Value(0.0);
    acc = acc + select(Value(0.0), select(d$s, d$s * d$s, p == 2u), inside(j + $su * w, end, whole));
    return acc;
}

// the sum over a team's Values of the row at `base` of (x - mu)^p
fn moment(base: u32, end: u32, team: Team, mu: f32, p: u32) -> f32 {
    let w = team.width;
    var acc = Value(0.0);
    var j = team.lane;
    for (; j + (STEP - 1u) * w < end; j = j + STEP * w) { acc = acc + moment_step(base, j, w, end, true, mu, p); }
    if (j < end) { acc = acc + moment_step(base, j, w, end, false, mu, p); }
    return total(acc);
}

// LayerNorm's output of a step's Values of the row at `base`
fn output_step(base: u32, j: u32, w: u32, end: u32, whole: bool, mu: f32, rs: f32) {
    let c$s = at(j + $su * w, end, whole);
    let y$s = (x[base + c$s] - mu) * rs * weight[c$s] + bias[c$s];
    if (inside(j + $su * w, end, whole)) { out[base + j + $su * w] = y$s; }
}

// out = y; mean, rstd per row.
@compute @workgroup_size(256)
fn layernorm_forward_main(grid: Grid, lanes: Lanes) {
    let team = team_of(lanes);
    let w = team.width;
    let rows_each = team_rows(team);
    for (var k = 0u; k < rows_each; k = k + 1u) {
        let tr = team_row(team, row_index(grid) * ROWS, k, params.rows, params.cols);
        let mu = row_mean(team, vec2<f32>(moment(tr.base, tr.end, team, 0.0, 1u), 0.0)).x;
        // two passes: E[(x - mu)^2] keeps its precision where E[x^2] - mu^2 would not
        let variance = row_mean(team, vec2<f32>(moment(tr.base, tr.end, team, mu, 2u), 0.0)).x;
        let rs = inverseSqrt(variance + params.eps);
        var j = team.lane;
        for (; j + (STEP - 1u) * w < tr.end; j = j + STEP * w) { output_step(tr.base, j, w, tr.end, true, mu, rs); }
        if (j < tr.end) { output_step(tr.base, j, w, tr.end, false, mu, rs); }
        if (team.lane == 0u && tr.end > 0u) {
            mean[tr.row] = mu;
            rstd[tr.row] = rs;
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
fn layernorm_backward_main(grid: Grid, lanes: Lanes) {
    let group = row_index(grid);
    if (group < params.param_groups) {
        param_grads(group, lanes.lid);
        return;
    }
    let team = team_of(lanes);
    let w = team.width;
    let rows_each = team_rows(team);
    for (var k = 0u; k < rows_each; k = k + 1u) {
        let tr = team_row(team, (group - params.param_groups) * ROWS, k, params.rows, params.cols);
        var mu = 0.0;
        var rs = 0.0;
        if (tr.end > 0u) {
            mu = mean[tr.row];
            rs = rstd[tr.row];
        }
        let m = row_mean(team, dx_sums(tr.base, tr.end, team, mu, rs));
        var j = team.lane;
        for (; j + (STEP - 1u) * w < tr.end; j = j + STEP * w) { dx_step(tr.base, j, w, tr.end, true, mu, rs, m); }
        if (j < tr.end) { dx_step(tr.base, j, w, tr.end, false, mu, rs, m); }
    }
}

// (sum of gw, sum of gw * xhat) over a step's Values of the row at `base` (zero past the row), gw = g * weight
fn sums_step(base: u32, j: u32, w: u32, end: u32, whole: bool, mu: f32, rs: f32) -> array<Value, 2> {
    let c$s = at(j + $su * w, end, whole);
    let gw$s = select(Value(0.0), g[base + c$s] * weight[c$s], inside(j + $su * w, end, whole));
    let xhat$s = (x[base + c$s] - mu) * rs;
    var gw = Value(0.0);
    var gw_xhat = Value(0.0);
    gw = gw + gw$s;
    gw_xhat = gw_xhat + gw$s * xhat$s;
    return array<Value, 2>(gw, gw_xhat);
}

// (sum of gw, sum of gw * xhat) over a team's Values of one row
fn dx_sums(base: u32, end: u32, team: Team, mu: f32, rs: f32) -> vec2<f32> {
    let w = team.width;
    var gw = Value(0.0);
    var gw_xhat = Value(0.0);
    var j = team.lane;
    for (; j + (STEP - 1u) * w < end; j = j + STEP * w) {
        let s = sums_step(base, j, w, end, true, mu, rs);
        gw = gw + s[0];
        gw_xhat = gw_xhat + s[1];
    }
    if (j < end) {
        let s = sums_step(base, j, w, end, false, mu, rs);
        gw = gw + s[0];
        gw_xhat = gw_xhat + s[1];
    }
    return vec2<f32>(total(gw), total(gw_xhat));
}

// dx of a step's Values of the row at `base`, m = (mean(gw), mean(gw * xhat)), plus g_add's
fn dx_step(base: u32, j: u32, w: u32, end: u32, whole: bool, mu: f32, rs: f32, m: vec2<f32>) {
    let c$s = at(j + $su * w, end, whole);
    var d$s = rs * (g[base + c$s] * weight[c$s] - m.x - (x[base + c$s] - mu) * rs * m.y);
    if (params.has_g_add == 1u) {
        d$s = d$s + g_add[base + c$s];
    }
    if (inside(j + $su * w, end, whole)) { out[base + j + $su * w] = d$s; }
}

var<workgroup> lane_weight_sums: array<Value, 256>;
var<workgroup> lane_bias_sums: array<Value, 256>;

// g * xhat and g of row r, Value column c
fn column_terms(r: u32, c: u32) -> array<Value, 2> {
    let gi = g[r * params.cols + c];
    return array<Value, 2>(gi * (x[r * params.cols + c] - mean[r]) * rstd[r], gi);
}

// Column workgroup w: group_cols Value columns, each summed by 256 / group_cols lanes over every lanes-th row of
// its split (ROWS_AHEAD rows in flight per lane), then the lanes added by a tree in workgroup memory. Neighbouring
// threads read neighbouring Values of a row. Few columns a workgroup make many workgroups, so a GPU's
// multiprocessors all share the columns' rows (a C-wide layer has C / (group_cols * WIDTH) of them).
fn param_grads(w: u32, lid: u32) {
    let cols = params.cols;
    let gc = params.group_cols;
    let strips = (cols + gc - 1u) / gc;
    let c = (w % strips) * gc + lid % gc;
    let split = w / strips;
    let row_stride = 256u / gc;
    let lo = split * params.split_rows;
    let hi = min(lo + params.split_rows, params.rows);
    var sw = Value(0.0);
    var sb = Value(0.0);
    if (c < cols) {
        var r = lo + lid / gc;
        for (; r + (ROWS_AHEAD - 1u) * row_stride < hi; r = r + ROWS_AHEAD * row_stride) {
            let t$r = column_terms(r + $ru * row_stride, c);
            sw = sw + t$r[0];
            sb = sb + t$r[1];
        }
        for (; r < hi; r = r + row_stride) {
            let t = column_terms(r, c);
            sw = sw + t[0];
            sb = sb + t[1];
        }
    }
    lane_weight_sums[lid] = sw;
    lane_bias_sums[lid] = sb;
    workgroupBarrier();
    for (var s = 128u; s >= gc; s = s >> 1u) {  // lid and lid + s hold the same column: s is a multiple of gc
        if (lid < s) {
            lane_weight_sums[lid] = lane_weight_sums[lid] + lane_weight_sums[lid + s];
            lane_bias_sums[lid] = lane_bias_sums[lid] + lane_bias_sums[lid + s];
        }
        workgroupBarrier();
    }
    if (lid < gc && c < cols) {
        if (params.splits == 1u) {
            g_weight[c] = lane_weight_sums[lid];
            g_bias[c] = lane_bias_sums[lid];
        } else {
            partials[split * cols + c] = lane_weight_sums[lid];
            partials[(params.splits + split) * cols + c] = lane_bias_sums[lid];
        }
    }
}

// g_weight and g_bias: the column sums of the splits' partials (2, splits, C), one thread per Value column.
@compute @workgroup_size(256)
fn layernorm_param_grads_finish_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let c = element_index(grid, lid);
    let cols = params.cols;
    if (c >= cols) { return; }
    var sw = Value(0.0);
    var sb = Value(0.0);
    for (var split = 0u; split < params.splits; split = split + 1u) {
        sw = sw + partials[split * cols + c];
        sb = sb + partials[(params.splits + split) * cols + c];
    }
    g_weight[c] = sw;
    g_bias[c] = sb;
}
