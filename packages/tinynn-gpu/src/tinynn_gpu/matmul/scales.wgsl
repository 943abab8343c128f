// The range scales of a tensor-core matmul out = op(a) @ op(b) (tensor.wgsl), in one dispatch: for every row
// of op(a) and every column of op(b), a power of two that brings the line's largest magnitude into
// [2^14, 2^15), and for op(a)'s rows, where asked, their sums (the bias gradient of a weight gradient).
//
// The tensor cores multiply f16: its 5-bit exponent flushes magnitudes under 6e-8 to zero and overflows above
// 65504, and a backward's gradients lie far below that range. Scaling each line of an operand by a power of two
// before the conversion, and each result by the inverse of its row's and column's scales after the f32 sum,
// is exact: only the rounding to f16's 10-bit mantissa remains, relative to each line's largest value.
//
// A line is `k` floats, `k_stride` apart, lines `line_stride` apart, batches `batch_stride` apart. The
// workgroups of op(a)'s lines come first (a_groups of them), then op(b)'s. Where k is contiguous, 64 threads
// read a line's neighbouring floats (4 lines a workgroup); else 4 threads a line, neighbouring threads on
// neighbouring lines (64 a workgroup). Each workgroup reads one chunk of k, 16 floats a thread, so that a long
// k over few lines (a weight's columns, a weight gradient's rows) still spreads over the whole GPU; where an
// operand has several chunks, matmul_scales_finish_main combines their partial results in order.

struct Params {
    a_batches: u32, a_lines: u32, a_k: u32, a_line_stride: u32, a_k_stride: u32, a_batch_stride: u32,
    b_batches: u32, b_lines: u32, b_k: u32, b_line_stride: u32, b_k_stride: u32, b_batch_stride: u32,
    a_groups: u32, sums: u32, a_chunks: u32, b_chunks: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> a_scales: array<f32>;  // [batch][line]
@group(0) @binding(3) var<storage, read_write> b_scales: array<f32>;
@group(0) @binding(4) var<storage, read_write> row_sums: array<f32>;  // op(a)'s rows, where params.sums is 1
@group(0) @binding(5) var<uniform> params: Params;
// (largest magnitude, sum) of each chunk, two floats: op(a)'s [batch][chunk][line], then op(b)'s
@group(0) @binding(6) var<storage, read_write> parts: array<f32>;

const LOADS: u32 = 16u;  // floats a thread reads per chunk

var<workgroup> largest: array<f32, 256>;
var<workgroup> partial: array<f32, 256>;

// 2^(15 - e) for a largest magnitude in [2^(e-1), 2^e), within f32's normal range; 1 for zero, an infinity or
// a NaN (the product is then non-finite, as f32's would be). Those two are told by their exponent bits: WGSL lets
// a compiler assume floats are finite, and every finite magnitude up to f32's largest has a scale.
fn range_scale(amax: f32) -> f32 {
    if (amax == 0.0 || (bitcast<u32>(amax) & 0x7f800000u) == 0x7f800000u) { return 1.0; }
    return ldexp(1.0, clamp(15 - frexp(amax).exp, -126, 126));
}

fn load(which: u32, i: u32) -> f32 {
    if (which == 0u) { return a[i]; }
    return b[i];
}

// A line's result: its scale, and op(a)'s row sum where asked.
fn finish_line(which: u32, out: u32, amax: f32, total: f32) {
    if (which == 0u) {
        a_scales[out] = range_scale(amax);
        if (params.sums == 1u) { row_sums[out] = total; }
    } else {
        b_scales[out] = range_scale(amax);
    }
}

@compute @workgroup_size(256)
fn matmul_scales_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let id = wg.y * nwg.x + wg.x;
    let which = select(0u, 1u, id >= params.a_groups);
    let group = select(id, id - params.a_groups, which == 1u);
    let batches = select(params.a_batches, params.b_batches, which == 1u);
    let lines = select(params.a_lines, params.b_lines, which == 1u);
    let k = select(params.a_k, params.b_k, which == 1u);
    let line_stride = select(params.a_line_stride, params.b_line_stride, which == 1u);
    let k_stride = select(params.a_k_stride, params.b_k_stride, which == 1u);
    let batch_stride = select(params.a_batch_stride, params.b_batch_stride, which == 1u);
    let chunks = select(params.a_chunks, params.b_chunks, which == 1u);

    let k_fast = k_stride == 1u;
    let per_line = select(4u, 64u, k_fast);  // threads a line
    let per_group = 256u / per_line;  // lines a workgroup
    let groups_per_batch = (lines + per_group - 1u) / per_group;
    let chunk = group % chunks;
    let batch = group / chunks / groups_per_batch;
    let first = (group / chunks % groups_per_batch) * per_group;
    let line = first + select(lid % per_group, lid / per_line, k_fast);
    let phase = select(lid / per_group, lid % per_line, k_fast);
    let k_end = min(k, (chunk + 1u) * LOADS * per_line);
    var amax = 0.0;
    var total = 0.0;
    if (batch < batches && line < lines) {
        let base = batch * batch_stride + line * line_stride;
        for (var i = chunk * LOADS * per_line + phase; i < k_end; i = i + per_line) {
            let x = load(which, base + i * k_stride);
            amax = max(amax, abs(x));
            total = total + x;
        }
    }
    largest[lid] = amax;
    partial[lid] = total;
    workgroupBarrier();
    let mine = first + lid;  // the line thread lid finishes
    if (lid < per_group && batch < batches && mine < lines) {
        var m = 0.0;
        var s = 0.0;
        for (var j = 0u; j < per_line; j = j + 1u) {
            let slot = select(lid + j * per_group, lid * per_line + j, k_fast);
            m = max(m, largest[slot]);
            s = s + partial[slot];
        }
        if (chunks == 1u) {
            finish_line(which, batch * lines + mine, m, s);
        } else {
            let offset = select(0u, params.a_batches * params.a_chunks * params.a_lines, which == 1u);
            let at = 2u * (offset + (batch * chunks + chunk) * lines + mine);
            parts[at] = m;
            parts[at + 1u] = s;
        }
    }
}

// The chunks' partial results of each line of an operand split into chunks, combined in order: a thread per
// line of op(a) (where it has chunks), then of op(b).
@compute @workgroup_size(256)
fn matmul_scales_finish_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                             @builtin(local_invocation_index) lid: u32) {
    let id = (wg.y * nwg.x + wg.x) * 256u + lid;
    let a_count = select(0u, params.a_batches * params.a_lines, params.a_chunks > 1u);
    let which = select(0u, 1u, id >= a_count);
    let i = select(id, id - a_count, which == 1u);
    let lines = select(params.a_lines, params.b_lines, which == 1u);
    let chunks = select(params.a_chunks, params.b_chunks, which == 1u);
    let batches = select(params.a_batches, params.b_batches, which == 1u);
    if (i >= batches * lines || chunks == 1u) { return; }
    let offset = select(0u, params.a_batches * params.a_chunks * params.a_lines, which == 1u);
    let batch = i / lines;
    var m = 0.0;
    var s = 0.0;
    for (var chunk = 0u; chunk < chunks; chunk = chunk + 1u) {
        let at = 2u * (offset + (batch * chunks + chunk) * lines + i % lines);
        m = max(m, parts[at]);
        s = s + parts[at + 1u];
    }
    finish_line(which, i, m, s);
}
