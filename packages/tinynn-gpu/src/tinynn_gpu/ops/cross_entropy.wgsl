// Cross entropy over logits (N, C) with integer targets, softmax fused in.
// forward_rows: one team of threads per row (a subgroup: a row of a vocabulary's width is a few values per
// thread) writes the row's probabilities and (loss, valid) pair;
// forward_mean: one workgroup averages the valid rows' losses into result[0], their count into count[0];
// backward: one thread per logit, scaled by that count (count_main counts them where the caller has none).
// A target outside [0, C) that is not ignore_index sets bit TARGET_ERROR in `errors`, which the runtime
// raises at the next read-back (the NumPy backend raises the same error at once).
// Bindings: logits, targets, probs, params, rows, result, g_loss, grad, errors, count

struct Params { n: u32, cols: u32, ignore_index: i32 }  // logits are (n, cols)

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<i32>;
@group(0) @binding(2) var<storage, read_write> probs: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read_write> rows: array<f32>;
@group(0) @binding(5) var<storage, read_write> result: array<f32>;
@group(0) @binding(6) var<storage, read> g_loss: array<f32>;
@group(0) @binding(7) var<storage, read_write> grad: array<f32>;
@group(0) @binding(8) var<storage, read_write> errors: array<atomic<u32>>;
@group(0) @binding(9) var<storage, read_write> count: array<f32>;

const TARGET_ERROR: u32 = 2u;  // runtime.py's KERNEL_ERRORS

fn is_valid(t: i32) -> bool { return t != params.ignore_index; }

// Whether a valid target is a column of the row; flags one that is not.
fn in_range(t: i32) -> bool {
    let ok = t >= 0 && t < i32(params.cols);
    if (!ok) { atomicOr(&errors[0], TARGET_ERROR); }
    return ok;
}

{{ROW_SUM}}

@compute @workgroup_size(256)
fn cross_entropy_forward_rows_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                                   lanes: Lanes) {
    let team = team_of(lanes);
    let cols = params.cols;
    let rows_each = team_rows(team);
    for (var k = 0u; k < rows_each; k = k + 1u) {
        let r = team.id + k * team.count;
        let row = row_index(wg, nwg) * ROWS + r;
        let end = select(0u, cols, r < ROWS && row < params.n);  // 0: no row for this team, which still sums
        let base = row * cols;
        var m = neg_inf();
        for (var j = team.lane; j < end; j = j + team.width) { m = max(m, logits[base + j]); }
        m = row_max(team, m);
        var s = 0.0;
        for (var j = team.lane; j < end; j = j + team.width) { s = s + exp(logits[base + j] - m); }
        s = row_sum(team, vec2<f32>(s, 0.0)).x;
        for (var j = team.lane; j < end; j = j + team.width) { probs[base + j] = exp(logits[base + j] - m) / s; }
        if (team.lane == 0u && end > 0u) {
            let t = targets[row];
            let valid = is_valid(t);
            var loss = 0.0;
            if (valid && in_range(t)) { loss = log(s) + m - logits[base + u32(t)]; }
            rows[2u * row] = loss;
            rows[2u * row + 1u] = select(0.0, 1.0, valid);
        }
    }
}

@compute @workgroup_size(256)
fn cross_entropy_forward_mean_main(@builtin(local_invocation_index) lid: u32) {
    var total = 0.0;
    var valid = 0.0;
    for (var r = lid; r < params.n; r = r + 256u) {
        total = total + rows[2u * r];
        valid = valid + rows[2u * r + 1u];
    }
    total = workgroup_sum(lid, total);
    valid = workgroup_sum(lid, valid);
    if (lid == 0u) {
        result[0] = total / valid;  // no valid target: 0/0 = NaN, as in PyTorch
        count[0] = valid;
    }
}

@compute @workgroup_size(256)
fn cross_entropy_count_main(@builtin(local_invocation_index) lid: u32) {
    var valid = 0.0;
    for (var r = lid; r < params.n; r = r + 256u) {
        if (is_valid(targets[r])) { valid = valid + 1.0; }
    }
    valid = workgroup_sum(lid, valid);
    if (lid == 0u) { count[0] = valid; }
}

// grad = (probs - onehot(target)) * g_loss / count, zero on ignored rows; column 0's threads check the targets'
// range.
@compute @workgroup_size(256)
fn cross_entropy_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                               @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let n = params.n;
    let cols = params.cols;
    if (i >= n * cols) { return; }
    let t = targets[i / cols];
    if (i % cols == 0u && is_valid(t)) { _ = in_range(t); }
    let hit = select(0.0, 1.0, i32(i % cols) == t);
    let scale = g_loss[0] / max(count[0], 1.0);
    grad[i] = select(0.0, (probs[i] - hit) * scale, is_valid(t));
}
