// Fused causal self-attention backward on tensor cores (matmul precision "high"), FlashAttention-2 style and
// built like attention_backward_tiled.wgsl (the same bindings, dQ's per-key-block slices and the kernel adding
// them up): its five products S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q and dQ = dS K on 16 x 16 x 16
// f16 subgroup matrices summing in f32, the rest in f32 by threads. A template: attention_tensor_backward.py
// fills in one tile (KEYS, QUERIES, THREADS) and head size, generates the products (subgroup matrices, or plain
// WGSL computing the same where a test runs it without them), and repeats each line holding $q (the vec4s a
// thread stages of a query row), $k (of a key row) or $w (its scores) once for each value of it.
//
// attention_backward_kv_main: a workgroup owns KEYS keys of one (batch, head), staged once, and walks over the
// queries that see them, QUERIES at a time. Every product's output matrices are shared out over the subgroups
// (matrix c to subgroup c % SUBGROUPS) and stored to workgroup memory (`stage`), where threads read them: P and
// dS from S and dP, dK and dV added into each thread's f32 registers step by step, dQ's slice written out.
//
// Range: each f16 tile is multiplied by a power of two that brings its largest magnitude into [2^14, 2^15)
// before the rounding (range_scale: the whole tile's, found with a workgroup atomic max on the floats' bits,
// which order as the non-negative floats do), and each product's f32 result divided by its operands' scales:
// exact, so only f16's 10-bit mantissa remains, relative to each tile's largest value. K and V once; Q, dO and
// dS every step; P lies in [0, 1].
//
// Bindings: qkv (B, T, 3C), g (B, T, C), out (the gradient of qkv), params, lse (B, nh, T), y (B, T, C),
// part (the slices of dQ: per (batch, head), key block kb holds the rows kb*KEYS..T-1).

const HS4: u32 = {{HS4}}u;  // the head's vec4s
const HP4: u32 = {{HP4}}u;  // padded to whole matrices
const KEYS: u32 = {{KEYS}}u;  // keys per workgroup
const QUERIES: u32 = {{QUERIES}}u;  // queries per step
const THREADS: u32 = {{THREADS}}u;
const TQ: u32 = THREADS / QUERIES;  // threads a query row: its vec4 columns h + TQ q, scores h + TQ w
const TK: u32 = THREADS / KEYS;  // threads a key row: its vec4 columns kh + TK k
const T_STRIDE: u32 = {{T_STRIDE}}u;  // halves between the rows of the q, g, k and v tiles: 4 HP4 and 8
const P_STRIDE: u32 = {{P_STRIDE}}u;  // halves between the rows of P and dS: KEYS and 8
const S_STRIDE: u32 = {{S_STRIDE}}u;  // floats between the stage's rows

{{HALF}}

var<workgroup> q_tile: array<half, QUERIES * T_STRIDE>;  // scaled, [query][head column]
var<workgroup> g_tile: array<half, QUERIES * T_STRIDE>;  // dO
var<workgroup> k_tile: array<half, KEYS * T_STRIDE>;
var<workgroup> v_tile: array<half, KEYS * T_STRIDE>;
var<workgroup> p_tile: array<half, QUERIES * P_STRIDE>;  // [query][key]
var<workgroup> ds_tile: array<half, QUERIES * P_STRIDE>;
// S | dP ([query][key], side by side), then dV over dK ([key][head column]), then dQ ([query][head column])
var<workgroup> stage: array<f32, {{STAGE}}>;
var<workgroup> delta_part: array<f32, THREADS>;  // [row * TQ + the thread's place in the row]
var<workgroup> lse_tile: array<f32, QUERIES>;
var<workgroup> largest: array<atomic<u32>, 3>;  // the step's largest magnitudes of Q, dO and dS (K and V first)

{{HEAD}}

// Vec4 c of row t's part (0 q, 1 k, 2 v); zeros past the sequence and past the head.
fn qkv_at(hd: Head, t: u32, part: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq || c >= HS4) { return vec4<f32>(0.0); }
    return qkv[hd.qkv + t * 3u * params.n_head * HS4 + part * params.n_head * HS4 + c];
}

fn g_at(hd: Head, t: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq || c >= HS4) { return vec4<f32>(0.0); }
    return g[hd.yg + t * params.n_head * HS4 + c];
}

fn y_at(hd: Head, t: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq || c >= HS4) { return vec4<f32>(0.0); }
    return y[hd.yg + t * params.n_head * HS4 + c];
}

fn bits(v: vec4<f32>) -> u32 {
    let a = abs(v);
    return bitcast<u32>(max(max(a.x, a.y), max(a.z, a.w)));
}

// 2^(15 - e) for a largest magnitude in [2^(e-1), 2^e), within f32's normal range; 1 for zero, an infinity or
// a NaN: scales.wgsl's range_scale, from the bits of a non-negative float.
fn range_scale(amax_bits: u32) -> f32 {
    let amax = bitcast<f32>(amax_bits);
    if (amax_bits == 0u || (amax_bits & 0x7f800000u) == 0x7f800000u) { return 1.0; }
    return ldexp(1.0, clamp(15 - frexp(amax).exp, -126, 126));
}

// Key blocks in wg.y (the longest walks, kb = 0, start first), (batch, head) in wg.x.
@compute @workgroup_size(THREADS)
fn attention_backward_kv_main(grid: Grid, @builtin(local_invocation_index) lid: u32{{BUILTINS}}) {
    let hd = head(grid.wg.x);
    let kb = grid.wg.y;
    let k0 = kb * KEYS;
{{SUBGROUP}}
    let row = lid / TQ;  // the query row this thread stages, scores and writes dQ of, each step
    let h = lid % TQ;
    let key = lid / TK;  // the key row it stages and accumulates dK and dV of
    let kh = lid % TK;
    // K and V, scaled by their tiles' largest magnitudes (the maxima cleared first: modules compiled without the
    // implementation's runtime checks, runtime/unchecked.py, may leave workgroup memory as the last workgroup did)
    let k_$k = qkv_at(hd, k0 + key, 1u, kh + TK * $ku);
    let v_$k = qkv_at(hd, k0 + key, 2u, kh + TK * $ku);
    if (lid < 3u) { atomicStore(&largest[lid], 0u); }
    workgroupBarrier();
    atomicMax(&largest[0], bits(k_$k));
    atomicMax(&largest[1], bits(v_$k));
    workgroupBarrier();
    let k_scale = range_scale(atomicLoad(&largest[0]));
    let v_scale = range_scale(atomicLoad(&largest[1]));
    let kv_at_$k = key * T_STRIDE + 4u * (kh + TK * $ku);
    k_tile[kv_at_$k] = to_half(k_$k.x * k_scale); k_tile[kv_at_$k + 1u] = to_half(k_$k.y * k_scale);
    k_tile[kv_at_$k + 2u] = to_half(k_$k.z * k_scale); k_tile[kv_at_$k + 3u] = to_half(k_$k.w * k_scale);
    v_tile[kv_at_$k] = to_half(v_$k.x * v_scale); v_tile[kv_at_$k + 1u] = to_half(v_$k.y * v_scale);
    v_tile[kv_at_$k + 2u] = to_half(v_$k.z * v_scale); v_tile[kv_at_$k + 3u] = to_half(v_$k.w * v_scale);
    var dk_$k = vec4<f32>(0.0);
    var dv_$k = vec4<f32>(0.0);
    for (var q0 = k0; q0 < params.seq; q0 = q0 + QUERIES) {
        let q_$q = qkv_at(hd, q0 + row, 0u, h + TQ * $qu);
        let g_$q = g_at(hd, q0 + row, h + TQ * $qu);
        var gy = vec4<f32>(0.0);
        gy = gy + g_$q * y_at(hd, q0 + row, h + TQ * $qu);
        workgroupBarrier();  // the previous step's maxima and stage are read
        if (lid < 3u) { atomicStore(&largest[lid], 0u); }
        workgroupBarrier();
        atomicMax(&largest[0], bits(q_$q));
        atomicMax(&largest[1], bits(g_$q));
        delta_part[lid] = gy.x + gy.y + gy.z + gy.w;
        if (lid < QUERIES) { lse_tile[lid] = lse[hd.bh * params.seq + min(q0 + lid, params.seq - 1u)]; }
        workgroupBarrier();
        let q_scale = range_scale(atomicLoad(&largest[0]));
        let g_scale = range_scale(atomicLoad(&largest[1]));
        let q_at_$q = row * T_STRIDE + 4u * (h + TQ * $qu);
        q_tile[q_at_$q] = to_half(q_$q.x * q_scale); q_tile[q_at_$q + 1u] = to_half(q_$q.y * q_scale);
        q_tile[q_at_$q + 2u] = to_half(q_$q.z * q_scale); q_tile[q_at_$q + 3u] = to_half(q_$q.w * q_scale);
        g_tile[q_at_$q] = to_half(g_$q.x * g_scale); g_tile[q_at_$q + 1u] = to_half(g_$q.y * g_scale);
        g_tile[q_at_$q + 2u] = to_half(g_$q.z * g_scale); g_tile[q_at_$q + 3u] = to_half(g_$q.w * g_scale);
        workgroupBarrier();  // Q and dO are in place
{{SCORES}}
        workgroupBarrier();  // S and dP are in place
        var delta = 0.0;
        for (var t = 0u; t < TQ; t = t + 1u) { delta = delta + delta_part[row * TQ + t]; }
        let s_at = row * S_STRIDE;
        let col_$w = h + TQ * $wu;
        let seen_$w = k0 + col_$w <= q0 + row && q0 + row < params.seq;
        let s_$w = stage[s_at + col_$w] / q_scale / k_scale * params.scale;
        let p_$w = select(0.0, exp(s_$w - lse_tile[row]), seen_$w);
        let ds_$w = p_$w * (stage[s_at + KEYS + col_$w] / g_scale / v_scale - delta);
        p_tile[row * P_STRIDE + col_$w] = to_half(p_$w);
        atomicMax(&largest[2], bitcast<u32>(abs(ds_$w)));
        workgroupBarrier();  // every dS is found (and S and dP read)
        let ds_scale = range_scale(atomicLoad(&largest[2]));
        ds_tile[row * P_STRIDE + col_$w] = to_half(ds_$w * ds_scale);
        workgroupBarrier();  // P and dS are in place
{{KV}}
        workgroupBarrier();  // the step's dV and dK are in place
        let kv_$k = key * S_STRIDE + 4u * (kh + TK * $ku);
        dv_$k = dv_$k + vec4<f32>(stage[kv_$k], stage[kv_$k + 1u], stage[kv_$k + 2u], stage[kv_$k + 3u]) / g_scale;
        let dk_at_$k = kv_$k + KEYS * S_STRIDE;
        let dk_step_$k = vec4<f32>(stage[dk_at_$k], stage[dk_at_$k + 1u], stage[dk_at_$k + 2u], stage[dk_at_$k + 3u]);
        dk_$k = dk_$k + dk_step_$k / ds_scale / q_scale;
        workgroupBarrier();  // dV and dK are read
{{Q}}
        workgroupBarrier();  // the step's dQ slice is in place
        let dq_at_$q = row * S_STRIDE + 4u * (h + TQ * $qu);
        let dq_$q = vec4<f32>(stage[dq_at_$q], stage[dq_at_$q + 1u], stage[dq_at_$q + 2u], stage[dq_at_$q + 3u]);
        let dq_col_$q = h + TQ * $qu;
        let dq_row = part_row(hd.bh, kb, min(q0 + row, params.seq - 1u)) * HS4;
        if (q0 + row < params.seq && dq_col_$q < HS4) { part[dq_row + dq_col_$q] = dq_$q / ds_scale / k_scale; }
    }
    let key_at = hd.qkv + (k0 + key) * 3u * params.n_head * HS4 + params.n_head * HS4;
    let out_col_$k = kh + TK * $ku;
    if (k0 + key < params.seq && out_col_$k < HS4) { out[key_at + out_col_$k] = params.scale * dk_$k; }
    if (k0 + key < params.seq && out_col_$k < HS4) { out[key_at + params.n_head * HS4 + out_col_$k] = dv_$k; }
}

{{DQ}}
