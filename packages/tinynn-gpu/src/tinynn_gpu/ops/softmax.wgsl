// Softmax and log-softmax over the last axis, forward and backward: one 256-thread workgroup per row, the two
// forms sharing each pass (`log` picks the output). The causal variant masks keys after each query (rows are
// (..., T_q) queries over L = T_k keys) inside the same pass, so the masked scores are never written.
// Bindings: a, b, out, params.

struct Params {
    rows: u32,
    len: u32,        // L, the row length
    causal: u32,     // 0 or 1 (softmax only)
    t_q: u32,        // causal: queries per (batch, head)
    scale: f32,      // softmax of scale * x: attention's 1/sqrt(head size), fused (1 for log-softmax)
    log: u32,        // 1: log-softmax
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

// a = x: out = softmax(scale * x), or log-softmax(x)
@compute @workgroup_size(256)
fn softmax_forward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let row = row_index(grid);
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
    let log_s = log(s);
    for (var j = lid; j < len; j = j + 256u) {
        let z = scale * a[base + j] - m;
        if (params.log == 1u) {
            out[base + j] = z - log_s;
        } else {
            out[base + j] = select(0.0, exp(z) / s, j < visible);
        }
    }
}

// a = y, b = g: softmax's dx = scale * y * (g - sum(g * y)); log-softmax's (y the log-probabilities)
// dx = g - exp(y) * sum(g)
@compute @workgroup_size(256)
fn softmax_backward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let row = row_index(grid);
    if (row >= params.rows) { return; }
    let base = row * params.len;
    let log_form = params.log == 1u;
    var dot = 0.0;
    for (var j = lid; j < params.len; j = j + 256u) { dot = dot + b[base + j] * select(a[base + j], 1.0, log_form); }
    dot = workgroup_sum(lid, dot);
    for (var j = lid; j < params.len; j = j + 256u) {
        if (log_form) {
            out[base + j] = b[base + j] - exp(a[base + j]) * dot;
        } else {
            out[base + j] = params.scale * a[base + j] * (b[base + j] - dot);
        }
    }
}
