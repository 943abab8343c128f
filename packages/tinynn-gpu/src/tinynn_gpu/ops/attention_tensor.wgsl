// Fused causal self-attention forward on tensor cores (matmul precision "high"): FlashAttention-2 style, with the
// products S = Q K^T and O += P V on 16 x 16 x 16 f16 subgroup matrices summing in f32, and the online softmax
// in f32 by threads. The same outputs and bindings as attention_tiled.wgsl (y and the per-row logsumexp), so
// the float32 backward takes them. A template: attention_tensor.py fills in one tile (QUERIES, KEYS, THREADS)
// and head size, generates the two products (subgroup matrices, or plain WGSL computing the same where a test
// runs the kernel on an adapter without them), and repeats each line holding $q, $k, $v, $w or $u once for each
// value of it (the vec4s a thread stages of a query, key or value row, its scores, its output vec4s).
//
// A workgroup owns QUERIES queries of one (batch, head), TPR threads a query row, and walks over the keys they
// see, KEYS at a time. Its subgroups of 32 form QUERIES / 16 rows of SG_COLS: each computes the scores of its 16
// query rows against its share of the step's keys, then P V for the same rows and its share of the head's
// columns. WGSL has no access to a matrix's elements, so every product goes through workgroup memory: the
// scores are stored (`stage`), the threads of each row read them, keep the running maximum and sum, and write
// P (f16, in [0, 1]); the step's P V is stored in turn and each thread adds its part of the row into its f32
// registers, rescaling what it held: the accumulator is never rescaled. The head is padded with zeros to whole
// matrices (HP = 4 HP4 columns, a multiple of 16).
//
// Range: f16 flushes magnitudes under 6e-8 and overflows above 65504. Each line of a product's operands is
// multiplied by a power of two that brings its largest magnitude into [2^14, 2^15) (range_scale, as the
// matmul's scales.wgsl) before the rounding to f16, and each f32 result divided by its lines' scales: exact, so
// only f16's 10-bit mantissa remains, relative to each line's largest value. A head's row lies whole in a tile,
// so the scales are found while staging: per query row (Q) and key row (K) for S, per value column over the
// step's keys for P V (the lines of that product's sum); P needs none.
//
// Bindings: qkv (B, T, 3C), out = y (B, T, C), params, lse (B, nh, T).

const HS4: u32 = {{HS4}}u;  // the head's vec4s
const HP4: u32 = {{HP4}}u;  // padded to whole matrices
const QUERIES: u32 = {{QUERIES}}u;  // queries per workgroup
const KEYS: u32 = {{KEYS}}u;  // keys per step
const THREADS: u32 = {{THREADS}}u;
const TPR: u32 = THREADS / QUERIES;  // threads a query row: vec4 columns h + TPR u, score columns h + TPR w
const SG_COLS: u32 = {{SG_COLS}}u;
const T_STRIDE: u32 = {{T_STRIDE}}u;  // halves between the rows of the q, k and v tiles: 4 HP4 and a pad of 8
const P_STRIDE: u32 = {{P_STRIDE}}u;  // halves between P's rows: KEYS and 8
const S_STRIDE: u32 = {{S_STRIDE}}u;  // floats between the stage's rows: the wider of KEYS and 4 HP4, and 4
const TK: u32 = THREADS / KEYS;  // threads staging a key row: vec4 columns k_col + TK k
const G: u32 = THREADS / HP4;  // threads staging a value column: keys v_group + G v
// Masked scores: exp(NEG_BIG - m) is exactly 0 for any finite m; a finite sentinel, because a constant -inf
// is rejected by Tint.
const NEG_BIG: f32 = -3.0e38;

{{HALF}}

var<workgroup> q_tile: array<half, QUERIES * T_STRIDE>;  // scaled, [query][head column]
var<workgroup> k_tile: array<half, KEYS * T_STRIDE>;
var<workgroup> v_tile: array<half, KEYS * T_STRIDE>;
var<workgroup> p_tile: array<half, QUERIES * P_STRIDE>;  // [query][key]
var<workgroup> stage: array<f32, QUERIES * S_STRIDE>;  // the step's scores, then its P V
var<workgroup> part: array<f32, THREADS>;  // each thread's largest magnitude of a row, or its part of a row's sum
var<workgroup> v_part: array<vec4<f32>, THREADS>;
var<workgroup> k_inv: array<f32, KEYS>;  // 1 / each key row's scale
var<workgroup> v_inv: array<vec4<f32>, HP4>;  // 1 / each value column's scale over the step's keys

{{HEAD}}

// Vec4 c of row t's part (0 q, 1 k, 2 v); zeros past the sequence and past the head.
fn qkv_at(hd: Head, t: u32, part: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq || c >= HS4) { return vec4<f32>(0.0); }
    return qkv[hd.qkv + t * 3u * params.n_head * HS4 + part * params.n_head * HS4 + c];
}

fn largest(v: vec4<f32>) -> f32 {
    let a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}

// 2^(15 - e) for a largest magnitude in [2^(e-1), 2^e), within f32's normal range; 1 for zero, an infinity or
// a NaN (the scores are then non-finite, as f32's would be): scales.wgsl's range_scale.
fn range_scale(amax: f32) -> f32 {
    if (amax == 0.0 || (bitcast<u32>(amax) & 0x7f800000u) == 0x7f800000u) { return 1.0; }
    return ldexp(1.0, clamp(15 - frexp(amax).exp, -126, 126));
}

// Query blocks in wg.y, the last (which walks the most keys) first, and (batch, head) in wg.x, as in
// attention_tiled.wgsl.
@compute @workgroup_size(THREADS)
fn attention_forward_main(grid: Grid, @builtin(local_invocation_index) lid: u32{{BUILTINS}}) {
    let hd = head(grid.wg.x);
    let q0 = (grid.nwg.y - 1u - grid.wg.y) * QUERIES;
{{SUBGROUP}}
    let sr = sg / SG_COLS * 16u;  // the subgroup's first query row, key of the step and head column
    let sk = sg % SG_COLS * (KEYS / SG_COLS);
    let sd = sg % SG_COLS * (4u * HP4 / SG_COLS);
    let row = lid / TPR;  // this thread's query row, staged, scored and written by its TPR threads
    let h = lid % TPR;  // its part: vec4 columns h + TPR u of the row, score columns h + TPR w
    let q_$q = qkv_at(hd, q0 + row, 0u, h + TPR * $qu);
    var q_amax = 0.0;
    q_amax = max(q_amax, largest(q_$q));
    part[lid] = q_amax;
    workgroupBarrier();
    var q_top = 0.0;
    for (var t = 0u; t < TPR; t = t + 1u) { q_top = max(q_top, part[row * TPR + t]); }
    let q_scale = range_scale(q_top);
    workgroupBarrier();  // the maxima are read: `part` is the keys' next
    let q_at_$q = row * T_STRIDE + 4u * (h + TPR * $qu);
    q_tile[q_at_$q] = to_half(q_$q.x * q_scale); q_tile[q_at_$q + 1u] = to_half(q_$q.y * q_scale);
    q_tile[q_at_$q + 2u] = to_half(q_$q.z * q_scale); q_tile[q_at_$q + 3u] = to_half(q_$q.w * q_scale);
    let q_inv = params.scale / q_scale;  // the row's scores are stage * q_inv * k_inv
    let k_row = lid / TK;
    let k_col = lid % TK;
    let v_col = lid % HP4;
    let v_group = lid / HP4;  // threads past G * HP4 stage no values
    var m = NEG_BIG;  // the row's running maximum, the same in both threads of the row
    var l = 0.0;  // this thread's part of the row's sum
    var o_$u = vec4<f32>(0.0);
    let key_end = min(params.seq, q0 + QUERIES);  // the last key any query of the block sees, plus one
    for (var k0 = 0u; k0 < key_end; k0 = k0 + KEYS) {
        // the step's keys and values, and their largest magnitudes per key row and value column
        let k_$k = qkv_at(hd, k0 + k_row, 1u, k_col + TK * $ku);
        var k_amax = 0.0;
        k_amax = max(k_amax, largest(k_$k));
        part[lid] = k_amax;
        let v_key_$v = v_group + G * $vu;
        let v_$v = select(vec4<f32>(0.0), qkv_at(hd, k0 + v_key_$v, 2u, v_col), v_key_$v < KEYS);
        var v_amax = vec4<f32>(0.0);
        v_amax = max(v_amax, abs(v_$v));
        v_part[lid] = v_amax;
        workgroupBarrier();  // the maxima are in place (and the previous step's tiles, scales and stage read)
        var k_top = 0.0;
        for (var t = 0u; t < TK; t = t + 1u) { k_top = max(k_top, part[k_row * TK + t]); }
        let k_scale = range_scale(k_top);
        let k_at_$k = k_row * T_STRIDE + 4u * (k_col + TK * $ku);
        k_tile[k_at_$k] = to_half(k_$k.x * k_scale); k_tile[k_at_$k + 1u] = to_half(k_$k.y * k_scale);
        k_tile[k_at_$k + 2u] = to_half(k_$k.z * k_scale); k_tile[k_at_$k + 3u] = to_half(k_$k.w * k_scale);
        if (k_col == 0u) { k_inv[k_row] = 1.0 / k_scale; }
        if (v_group < G) {
            var v_top = vec4<f32>(0.0);
            for (var t = 0u; t < G; t = t + 1u) { v_top = max(v_top, v_part[v_col + t * HP4]); }
            let v_scale = vec4<f32>(range_scale(v_top.x), range_scale(v_top.y), range_scale(v_top.z),
                                    range_scale(v_top.w));
            let v_at_$v = v_key_$v * T_STRIDE + 4u * v_col;
            let vs_$v = v_$v * v_scale;
            if (v_key_$v < KEYS) { v_tile[v_at_$v] = to_half(vs_$v.x); v_tile[v_at_$v + 1u] = to_half(vs_$v.y); }
            if (v_key_$v < KEYS) { v_tile[v_at_$v + 2u] = to_half(vs_$v.z); v_tile[v_at_$v + 3u] = to_half(vs_$v.w); }
            if (v_group == 0u) { v_inv[v_col] = 1.0 / v_scale; }
        }
        workgroupBarrier();  // the tiles are in place
{{SCORES}}
        workgroupBarrier();  // the scores are in place
        // the row's scores: each of its threads reads them all for the maximum, and keeps its own part
        let s_at = row * S_STRIDE;
        var top = m;  // key 0 is in the first step and every query sees it: top is finite from then on
        for (var j = 0u; j < KEYS; j = j + 1u) {
            top = max(top, select(NEG_BIG, stage[s_at + j] * q_inv * k_inv[j], k0 + j <= q0 + row));
        }
        let mine_$w = h + TPR * $wu;
        let s_$w = select(NEG_BIG, stage[s_at + mine_$w] * q_inv * k_inv[mine_$w], k0 + mine_$w <= q0 + row);
        let f = exp(m - top);
        m = top;
        l = l * f;
        let p_$w = exp(s_$w - m);
        l = l + p_$w;
        p_tile[row * P_STRIDE + mine_$w] = to_half(p_$w);
        workgroupBarrier();  // P is in place, and the scores read
{{VALUES}}
        workgroupBarrier();  // the step's P V is in place
        let o_at_$u = s_at + 4u * (h + TPR * $uu);
        let pv_$u = vec4<f32>(stage[o_at_$u], stage[o_at_$u + 1u], stage[o_at_$u + 2u], stage[o_at_$u + 3u]);
        o_$u = o_$u * f + pv_$u * v_inv[h + TPR * $uu];
    }
    // the row's sum from its threads, in a fixed order
    workgroupBarrier();
    part[lid] = l;
    workgroupBarrier();
    var total = 0.0;
    for (var t = 0u; t < TPR; t = t + 1u) { total = total + part[row * TPR + t]; }
    let out_row = q0 + row;
    let out_at = hd.yg + out_row * params.n_head * HS4;
    let out_col_$u = h + TPR * $uu;
    if (out_row < params.seq && out_col_$u < HS4) { out[out_at + out_col_$u] = o_$u / total; }
    if (out_row < params.seq && h == 0u) { lse[hd.bh * params.seq + out_row] = m + log(total); }
}
