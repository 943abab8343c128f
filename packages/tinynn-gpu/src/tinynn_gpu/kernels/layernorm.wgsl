// LayerNorm over the last axis (C): the forward one 256-thread workgroup per row (statistics and
// normalisation fused), the backward one dispatch for the input, weight and bias gradients.
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

// out = y; mean, rstd per row.
@compute @workgroup_size(256)
fn layernorm_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wg, nwg);
    if (row >= params.rows) { return; }
    let cols = params.cols;
    let base = row * cols;
    var s = 0.0;
    for (var j = lid; j < cols; j = j + 256u) { s = s + x[base + j]; }
    let mu = workgroup_sum(lid, s) / f32(cols);
    var sq = 0.0;  // two passes: E[(x - mu)^2] keeps its precision where E[x^2] - mu^2 would not
    for (var j = lid; j < cols; j = j + 256u) { let d = x[base + j] - mu; sq = sq + d * d; }
    let r = inverseSqrt(workgroup_sum(lid, sq) / f32(cols) + params.eps);
    for (var j = lid; j < cols; j = j + 256u) {
        out[base + j] = (x[base + j] - mu) * r * weight[j] + bias[j];
    }
    if (lid == 0u) {
        mean[row] = mu;
        rstd[row] = r;
    }
}

// The backward in one dispatch: workgroups [0, param_groups) sum the weight and bias gradients down
// columns, the rest compute dx one row each. Both kinds only read g, x and the saved statistics, so they
// run side by side with no pass between them, and no finish when one split covers all rows (`splits` = 1,
// rows <= split_rows): a column workgroup then writes g_weight and g_bias itself. With more rows, split s
// leaves its sums in partials (2, splits, C) for layernorm_param_grads_finish_main.
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * weight, plus g_add where has_g_add:
// x's gradient from its other uses (the residual stream's), added here rather than by another kernel.
var<workgroup> lane_sums: array<vec2<f32>, 256>;

@compute @workgroup_size(256)
fn layernorm_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let w = row_index(wg, nwg);
    if (w < params.param_groups) {
        param_grads(w, lid);
        return;
    }
    let row = w - params.param_groups;
    if (row >= params.rows) { return; }
    let cols = params.cols;
    let base = row * cols;
    let mu = mean[row];
    let r = rstd[row];
    var s1 = 0.0;
    var s2 = 0.0;
    for (var j = lid; j < cols; j = j + 256u) {
        let gw = g[base + j] * weight[j];
        s1 = s1 + gw;
        s2 = s2 + gw * (x[base + j] - mu) * r;
    }
    let m1 = workgroup_sum(lid, s1) / f32(cols);
    let m2 = workgroup_sum(lid, s2) / f32(cols);
    for (var j = lid; j < cols; j = j + 256u) {
        let xhat = (x[base + j] - mu) * r;
        var dx = r * (g[base + j] * weight[j] - m1 - xhat * m2);
        if (params.has_g_add == 1u) { dx = dx + g_add[base + j]; }
        out[base + j] = dx;
    }
}

// Column workgroup w: 8 columns, each summed by 32 lanes over every 32nd row of its split (four rows in
// flight per lane), then the lanes added in a fixed order. Eight consecutive threads read one row's
// 8 columns: whole 32-byte sectors.
fn param_grads(w: u32, lid: u32) {
    let cols = params.cols;
    let strips = (cols + 7u) / 8u;
    let c = (w % strips) * 8u + lid % 8u;
    let split = w / strips;
    let lane = lid / 8u;
    let lo = split * params.split_rows;
    let hi = min(lo + params.split_rows, params.rows);
    var sw = vec4<f32>(0.0);
    var sb = vec4<f32>(0.0);
    if (c < cols) {
        var r = lo + lane;
        for (; r + 96u < hi; r = r + 128u) {
            let gs = vec4<f32>(g[r * cols + c], g[(r + 32u) * cols + c], g[(r + 64u) * cols + c],
                               g[(r + 96u) * cols + c]);
            let xs = vec4<f32>(x[r * cols + c], x[(r + 32u) * cols + c], x[(r + 64u) * cols + c],
                               x[(r + 96u) * cols + c]);
            let mus = vec4<f32>(mean[r], mean[r + 32u], mean[r + 64u], mean[r + 96u]);
            let rs = vec4<f32>(rstd[r], rstd[r + 32u], rstd[r + 64u], rstd[r + 96u]);
            sw = sw + gs * (xs - mus) * rs;
            sb = sb + gs;
        }
        for (; r < hi; r = r + 32u) {
            let gi = g[r * cols + c];
            sw.x = sw.x + gi * (x[r * cols + c] - mean[r]) * rstd[r];
            sb.x = sb.x + gi;
        }
    }
    lane_sums[lid] = vec2<f32>((sw.x + sw.y) + (sw.z + sw.w), (sb.x + sb.y) + (sb.z + sb.w));
    workgroupBarrier();
    if (lid < 8u && c < cols) {
        var sums = vec2<f32>(0.0);
        for (var l = 0u; l < 32u; l = l + 1u) { sums = sums + lane_sums[lid + 8u * l]; }
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
