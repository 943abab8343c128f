// Cross entropy over logits (N, C) with integer targets, softmax fused in.
// forward_rows: one team of threads per row (a subgroup: a row of a vocabulary's width is a few values per
// thread) writes the row's probabilities and (loss, valid) pair;
// forward_mean: one workgroup averages the valid rows' losses into result[0], their count into count[0];
// backward: one thread per logit, scaled by that count (count_main counts them where the caller has none).
// classifier_rows: the fused classifier's rows (cross_entropy.py's classifier_forward), a chunk of a head's
// logits replaced in place by their gradient, a workgroup a row; only the first `vocab` columns are classes, the
// rest (the head's padding) get no probability and a zero gradient.
// A target outside [0, C) (the classifier: [0, vocab)) that is not ignore_index sets bit TARGET_ERROR in
// `errors`, which the runtime raises at the next read-back (the NumPy backend raises the same error at once).
// Bindings: logits, targets, probs, params, rows, result, g_loss, grad, errors, count, scores

struct Params {
    n: u32,             // logits are (n, cols)
    cols: u32,
    ignore_index: i32,
    vocab: u32,         // classifier_rows: the classes, the first columns (the rest pad the head)
    row0: u32,          // ... the chunk's first row in targets and rows
    with_grad: u32,     // ... 1: the logits' gradient replaces them
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<i32>;
@group(0) @binding(2) var<storage, read_write> probs: array<f32>;
@group(0) @binding(4) var<storage, read_write> rows: array<f32>;
@group(0) @binding(5) var<storage, read_write> result: array<f32>;
@group(0) @binding(6) var<storage, read> g_loss: array<f32>;
@group(0) @binding(7) var<storage, read_write> grad: array<f32>;
@group(0) @binding(8) var<storage, read_write> errors: array<atomic<u32>>;
@group(0) @binding(9) var<storage, read_write> count: array<f32>;
@group(0) @binding(10) var<storage, read_write> scores: array<f32>;  // classifier_rows: logits in, gradient out

const TARGET_ERROR: u32 = 2u;  // runtime.py's KERNEL_ERRORS

fn is_valid(t: i32) -> bool { return t != params.ignore_index; }

// Whether a valid target is a column of the row; flags one that is not.
fn in_range(t: i32, classes: u32) -> bool {
    let ok = t >= 0 && t < i32(classes);
    if (!ok) { atomicOr(&errors[0], TARGET_ERROR); }
    return ok;
}

{{ROW_SUM}}

@compute @workgroup_size(256)
fn cross_entropy_forward_rows_main(grid: Grid, lanes: Lanes) {
    let team = team_of(lanes);
    let rows_each = team_rows(team);
    for (var k = 0u; k < rows_each; k = k + 1u) {
        let tr = team_row(team, row_index(grid) * ROWS, k, params.n, params.cols);
        let base = tr.base;
        var m = neg_inf();
        for (var j = team.lane; j < tr.end; j = j + team.width) { m = max(m, logits[base + j]); }
        m = row_max(team, m);
        var s = 0.0;
        for (var j = team.lane; j < tr.end; j = j + team.width) { s = s + exp(logits[base + j] - m); }
        s = row_sum(team, vec2<f32>(s, 0.0)).x;
        for (var j = team.lane; j < tr.end; j = j + team.width) { probs[base + j] = exp(logits[base + j] - m) / s; }
        if (team.lane == 0u && tr.end > 0u) {
            let t = targets[tr.row];
            let valid = is_valid(t);
            var loss = 0.0;
            if (valid && in_range(t, params.cols)) { loss = log(s) + m - logits[base + u32(t)]; }
            rows[2u * tr.row] = loss;
            rows[2u * tr.row + 1u] = select(0.0, 1.0, valid);
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
fn cross_entropy_backward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    let n = params.n;
    let cols = params.cols;
    if (i >= n * cols) { return; }
    let t = targets[i / cols];
    if (i % cols == 0u && is_valid(t)) { _ = in_range(t, cols); }
    let hit = select(0.0, 1.0, i32(i % cols) == t);
    let scale = g_loss[0] / max(count[0], 1.0);
    grad[i] = select(0.0, (probs[i] - hit) * scale, is_valid(t));
}

// The fused classifier's rows, a workgroup a row (a vocabulary's row is tens of thousands of logits, and a chunk a
// thousand rows or so): the row's loss and validity into rows[row0 + row], and with with_grad its logits replaced
// by (softmax - onehot(target)) / count (count[0]: the valid targets of every chunk), zero past `vocab` and on an
// ignored row. The max and the sum of exponentials come from one pass (each thread's sum rescaled when its max
// rises), the gradient from a second; each thread reads and writes its own columns only (j = lid + k * 256), so
// in place is safe.
@compute @workgroup_size(256)
fn classifier_rows_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let row = row_index(grid);
    if (row >= params.n) { return; }
    let base = row * params.cols;
    var m = neg_inf();
    var s = 0.0;  // sum of exp(z - m) over this thread's columns; 0 until its first
    for (var j = lid; j < params.vocab; j = j + 256u) {
        let z = scores[base + j];
        if (s == 0.0) {
            m = z;
            s = 1.0;
        } else if (z > m) {
            s = s * exp(m - z) + 1.0;
            m = z;
        } else {
            s = s + exp(z - m);
        }
    }
    let row_max = workgroup_max(lid, m);
    var mine = 0.0;
    if (s > 0.0) { mine = s * exp(m - row_max); }
    let total = workgroup_sum(lid, mine);
    let t = targets[params.row0 + row];
    let valid = is_valid(t);
    let known = valid && in_range(t, params.vocab);
    // the thread of the target's column reads its logit, before that thread alone overwrites it
    if (lid == select(0u, u32(t) % 256u, known)) {
        var loss = 0.0;
        if (known) { loss = log(total) + row_max - scores[base + u32(t)]; }
        rows[2u * (params.row0 + row)] = loss;
        rows[2u * (params.row0 + row) + 1u] = select(0.0, 1.0, valid);
    }
    if (params.with_grad == 1u) {
        let scale = select(0.0, 1.0 / max(count[0], 1.0), valid);
        for (var j = lid; j < params.cols; j = j + 256u) {
            var p = 0.0;
            if (j < params.vocab) { p = exp(scores[base + j] - row_max) / total; }
            scores[base + j] = (p - select(0.0, 1.0, i32(j) == t)) * scale;
        }
    }
}
