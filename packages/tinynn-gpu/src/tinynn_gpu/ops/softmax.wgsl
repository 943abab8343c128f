// Softmax and log-softmax over the last axis, forward and backward: one 256-thread workgroup per row.
// The causal variant masks keys after each query (rows are (..., T_q) queries over L = T_k keys) inside
// the same pass, so the masked scores are never written.
// Bindings: a, b, out, params.

struct Params {
    rows: u32,
    len: u32,        // L, the row length
    causal: u32,     // 0 or 1
    t_q: u32,        // causal: queries per (batch, head)
    scale: f32,      // softmax of scale * x: attention's 1/sqrt(head size), fused
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

// a = x: out = softmax(scale * x)
@compute @workgroup_size(256)
fn softmax_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wg, nwg);
    if (row >= params.rows) { return; }  // the same for the whole workgroup, so no barrier is split
    let len = params.len;
    var visible = len;
    if (params.causal == 1u) { visible = row % params.t_q + len - params.t_q + 1u; }
    let base = row * len;
    let scale = params.scale;
    var m = neg_inf();
    for (var j = lid; j < visible; j = j + 256u) { m = max(m, scale * a[base + j]); }
    m = workgroup_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < visible; j = j + 256u) { s = s + exp(scale * a[base + j] - m); }
    s = workgroup_sum(lid, s);
    for (var j = lid; j < len; j = j + 256u) {
        out[base + j] = select(0.0, exp(scale * a[base + j] - m) / s, j < visible);
    }
}

// a = y, b = g: dx = scale * y * (g - sum(g * y))
@compute @workgroup_size(256)
fn softmax_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wg, nwg);
    if (row >= params.rows) { return; }
    let len = params.len;
    let base = row * len;
    var dot = 0.0;
    for (var j = lid; j < len; j = j + 256u) { dot = dot + a[base + j] * b[base + j]; }
    dot = workgroup_sum(lid, dot);
    let scale = params.scale;
    for (var j = lid; j < len; j = j + 256u) { out[base + j] = scale * a[base + j] * (b[base + j] - dot); }
}

// a = x
@compute @workgroup_size(256)
fn log_softmax_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wg, nwg);
    if (row >= params.rows) { return; }
    let len = params.len;
    let base = row * len;
    var m = neg_inf();
    for (var j = lid; j < len; j = j + 256u) { m = max(m, a[base + j]); }
    m = workgroup_max(lid, m);
    var s = 0.0;
    for (var j = lid; j < len; j = j + 256u) { s = s + exp(a[base + j] - m); }
    let log_s = log(workgroup_sum(lid, s));
    for (var j = lid; j < len; j = j + 256u) { out[base + j] = a[base + j] - m - log_s; }
}

// a = y (log-probabilities), b = g: dx = g - exp(y) * sum(g)
@compute @workgroup_size(256)
fn log_softmax_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                             @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wg, nwg);
    if (row >= params.rows) { return; }
    let len = params.len;
    let base = row * len;
    var total = 0.0;
    for (var j = lid; j < len; j = j + 256u) { total = total + b[base + j]; }
    total = workgroup_sum(lid, total);
    for (var j = lid; j < len; j = j + 256u) { out[base + j] = b[base + j] - exp(a[base + j]) * total; }
}
