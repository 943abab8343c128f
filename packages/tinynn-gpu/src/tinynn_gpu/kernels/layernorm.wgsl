// LayerNorm over the last axis (C): forward and input gradient one 256-thread workgroup per row, each a
// single kernel (statistics and normalisation fused); the weight and bias gradients sum column-wise over
// chunks of rows into partials (one pass for both), which a second kernel adds up.
// Bindings: 0:x 1:weight 2:bias 3:params 4:out 5:mean 6:rstd 7:g 8:out2 9:partials
// A missing weight or bias is bound as ones or zeros by the launcher, so one kernel serves every case.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

struct Params {
    rows: u32, cols: u32, eps: f32,
    chunk: u32, chunks: u32,  // the parameter gradients: rows per chunk, chunks
}
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(7) var<storage, read> g: array<f32>;
@group(0) @binding(8) var<storage, read_write> out2: array<f32>;
@group(0) @binding(9) var<storage, read_write> partials: array<f32>;

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

// out = dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * weight
@compute @workgroup_size(256)
fn layernorm_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wg, nwg);
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
        out[base + j] = r * (g[base + j] * weight[j] - m1 - xhat * m2);
    }
}

// The weight and bias gradients in one pass over g and x, then one small finish. Thread (chunk, c) of
// layernorm_param_grads_main writes its chunk's sum g * xhat and sum g to partials (2, chunks, C);
// consecutive threads take consecutive columns, so every row is read coalesced.
@compute @workgroup_size(256)
fn layernorm_param_grads_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let cols = params.cols;
    let chunks = params.chunks;
    if (i >= chunks * cols) { return; }
    let c = i % cols;
    let chunk = i / cols;
    let start = chunk * params.chunk;
    let stop = min(start + params.chunk, params.rows);
    var gw = 0.0;
    var gb = 0.0;
    for (var row = start; row < stop; row = row + 1u) {
        let gi = g[row * cols + c];
        gw = gw + gi * (x[row * cols + c] - mean[row]) * rstd[row];
        gb = gb + gi;
    }
    partials[i] = gw;
    partials[chunks * cols + i] = gb;
}

// out = weight gradient, out2 = bias gradient: the column sums of partials. A workgroup takes 32 columns,
// 8 threads each folding every 8th chunk (short chains of loads), then adds its 8 lanes.
var<workgroup> lane_sums: array<vec2<f32>, 256>;

@compute @workgroup_size(256)
fn layernorm_param_grads_finish_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                                     @builtin(local_invocation_index) lid: u32) {
    let cols = params.cols;
    let chunks = params.chunks;
    let c = row_index(wg, nwg) * 32u + lid % 32u;
    let lane = lid / 32u;
    var sums = vec2<f32>(0.0);
    if (c < cols) {
        for (var chunk = lane; chunk < chunks; chunk = chunk + 8u) {
            sums = sums + vec2<f32>(partials[chunk * cols + c], partials[(chunks + chunk) * cols + c]);
        }
    }
    lane_sums[lid] = sums;
    workgroupBarrier();
    if (lane == 0u && c < cols) {
        for (var l = 1u; l < 8u; l = l + 1u) { sums = sums + lane_sums[lid + 32u * l]; }
        out[c] = sums.x;
        out2[c] = sums.y;
    }
}
