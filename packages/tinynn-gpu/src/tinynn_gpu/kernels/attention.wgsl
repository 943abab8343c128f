// Fused causal self-attention, FlashAttention-2 style: forward and backward without a T x T array in memory.
// A template: attention.py fills {{HS4}} (head size / 4), {{ROWS}}, {{COLS}} and {{R}} per head size and tile,
// and unrolls it: a line holding $c is repeated for c = 0 .. HS4-1, one holding $n for
// n = 0 .. HS4/R - 1, one holding $j for j = 0 .. COLS-1. naga does not unroll loops, and an accumulator array
// indexed in a loop would live in slow local memory, not in registers: so every accumulator is its own
// variable. q, k and v are read straight from the qkv projection's output (B, T, 3C) = [q | k | v], head h
// in columns h*hs:(h+1)*hs of each part; y and the gradients are written in the same row layout.
//
// Each workgroup owns ROWS rows of one (batch, head) (queries, or keys in the dK/dV kernel) and walks over
// the other side in tiles of COLS rows, both held in workgroup memory. R threads share an owned row (R
// divides HS4), each accumulating NV = HS4 / R vec4 columns of it: part, part + R, ..., so neighbouring
// threads read neighbouring vec4s. Tile rows are padded by one vec4 (score rows by one float) so that
// threads reading different rows of a tile hit different memory banks.
//
// The backward needs delta = rowsum(g * y) per query. The dQ kernel, which runs first, computes it for
// the queries it owns and saves it for the dK/dV kernel (FlashAttention-2's separate pre-pass would cost a
// dispatch for a few microseconds of work).
//
// Bindings: 0 qkv, 1 g (the gradient of y), 2 out (y, or the gradient of qkv), 3 params, 4 lse (B, nh, T),
// 5 y (read by the backward), 6 delta (B, nh, T).

const HS4: u32 = {{HS4}}u;
const ROWS: u32 = {{ROWS}}u;
const COLS: u32 = {{COLS}}u;
const R: u32 = {{R}}u;
const THREADS: u32 = ROWS * R;
const PAD: u32 = HS4 + 1u;  // a tile row's stride in vec4s
const PCOLS: u32 = COLS + 1u;  // a score row's stride in floats
// Masked scores: exp(NEG_BIG - m) is exactly 0 for any finite row maximum m; a finite sentinel, because a
// constant -inf is rejected by Tint.
const NEG_BIG: f32 = -3.0e38;

struct Params { seq: u32, n_head: u32, scale: f32 }

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;
@group(0) @binding(5) var<storage, read> y: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> delta: array<f32>;

var<workgroup> own_a: array<vec4<f32>, ROWS * PAD>;  // the owned rows: q (forward, dQ) or k (dK/dV)
var<workgroup> own_b: array<vec4<f32>, ROWS * PAD>;  // g's rows (dQ) or v (dK/dV)
var<workgroup> col_a: array<vec4<f32>, COLS * PAD>;  // the current tile: k (forward, dQ) or q (dK/dV)
var<workgroup> col_b: array<vec4<f32>, COLS * PAD>;  // v (forward, dQ) or g's rows (dK/dV)
var<workgroup> tile_p: array<f32, ROWS * PCOLS>;  // scores (forward) or probabilities (dK/dV)
var<workgroup> tile_ds: array<f32, ROWS * PCOLS>;  // the scores' gradient
var<workgroup> own_lse: array<f32, ROWS>;  // lse and delta of the owned queries (dQ)
var<workgroup> own_delta: array<f32, ROWS>;
var<workgroup> col_lse: array<f32, COLS>;  // ... or of the current query tile (dK/dV)
var<workgroup> col_delta: array<f32, COLS>;

// Where one (batch, head) starts, in vec4s: its q in qkv, its row in y / g (B, T, C).
struct Head { bh: u32, qkv: u32, yg: u32 }

fn head(bh: u32) -> Head {
    let nh = params.n_head;
    let b = bh / nh;
    let h = bh % nh;
    return Head(bh, b * params.seq * 3u * nh * HS4 + h * HS4, b * params.seq * nh * HS4 + h * HS4);
}

fn qkv_row(hd: Head, t: u32, part: u32) -> u32 {  // part 0 q, 1 k, 2 v
    return hd.qkv + t * 3u * params.n_head * HS4 + part * params.n_head * HS4;
}

fn yg_row(hd: Head, t: u32) -> u32 {
    return hd.yg + t * params.n_head * HS4;
}

// Cooperative tile loads: rows t0 .. t0 + n of one part, zeros past the sequence's end.
fn load_own_a(lid: u32, hd: Head, t0: u32, part: u32) {
    for (var e = lid; e < ROWS * HS4; e = e + THREADS) {
        let r = e / HS4;
        let c = e % HS4;
        var v = vec4<f32>(0.0);
        if (t0 + r < params.seq) { v = qkv[qkv_row(hd, t0 + r, part) + c]; }
        own_a[r * PAD + c] = v;
    }
}

fn load_own_b(lid: u32, hd: Head, t0: u32, part: u32) {
    for (var e = lid; e < ROWS * HS4; e = e + THREADS) {
        let r = e / HS4;
        let c = e % HS4;
        var v = vec4<f32>(0.0);
        if (t0 + r < params.seq) { v = qkv[qkv_row(hd, t0 + r, part) + c]; }
        own_b[r * PAD + c] = v;
    }
}

fn load_own_b_grad(lid: u32, hd: Head, t0: u32) {
    for (var e = lid; e < ROWS * HS4; e = e + THREADS) {
        let r = e / HS4;
        let c = e % HS4;
        var v = vec4<f32>(0.0);
        if (t0 + r < params.seq) { v = g[yg_row(hd, t0 + r) + c]; }
        own_b[r * PAD + c] = v;
    }
}

fn load_col_a(lid: u32, hd: Head, t0: u32, part: u32) {
    for (var e = lid; e < COLS * HS4; e = e + THREADS) {
        let r = e / HS4;
        let c = e % HS4;
        var v = vec4<f32>(0.0);
        if (t0 + r < params.seq) { v = qkv[qkv_row(hd, t0 + r, part) + c]; }
        col_a[r * PAD + c] = v;
    }
}

fn load_col_b(lid: u32, hd: Head, t0: u32, part: u32) {
    for (var e = lid; e < COLS * HS4; e = e + THREADS) {
        let r = e / HS4;
        let c = e % HS4;
        var v = vec4<f32>(0.0);
        if (t0 + r < params.seq) { v = qkv[qkv_row(hd, t0 + r, part) + c]; }
        col_b[r * PAD + c] = v;
    }
}

fn load_col_b_grad(lid: u32, hd: Head, t0: u32) {
    for (var e = lid; e < COLS * HS4; e = e + THREADS) {
        let r = e / HS4;
        let c = e % HS4;
        var v = vec4<f32>(0.0);
        if (t0 + r < params.seq) { v = g[yg_row(hd, t0 + r) + c]; }
        col_b[r * PAD + c] = v;
    }
}

fn dot_own_a_col_a(r: u32, j: u32) -> f32 {
    var s = vec4<f32>(0.0);
    s = s + own_a[r * PAD + $cu] * col_a[j * PAD + $cu];
    return s.x + s.y + s.z + s.w;
}

fn dot_own_b_col_b(r: u32, j: u32) -> f32 {
    var s = vec4<f32>(0.0);
    s = s + own_b[r * PAD + $cu] * col_b[j * PAD + $cu];
    return s.x + s.y + s.z + s.w;
}

// lse and delta of query t (0 past the sequence's end, where nothing reads them).
fn lse_of(hd: Head, t: u32) -> f32 {
    if (t >= params.seq) { return 0.0; }
    return lse[hd.bh * params.seq + t];
}

fn delta_of(hd: Head, t: u32) -> f32 {
    if (t >= params.seq) { return 0.0; }
    return delta[hd.bh * params.seq + t];
}

fn rowsum_g_y(hd: Head, t: u32) -> f32 {
    let base = yg_row(hd, t);
    var s = vec4<f32>(0.0);
    s = s + g[base + $cu] * y[base + $cu];
    return s.x + s.y + s.z + s.w;
}

// y = softmax(scale * q k^T, causal) v and lse, one workgroup per ROWS queries of one (batch, head); the
// softmax is online: a running maximum m and sum l per row, the accumulator rescaled when m grows.
@compute @workgroup_size(THREADS)
fn attention_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = head(wg.y);
    let q0 = wg.x * ROWS;
    let row = lid / R;
    let part = lid % R;
    let i = q0 + row;
    load_own_a(lid, hd, q0, 0u);
    var m = NEG_BIG;
    var l = 0.0;
    var acc_$n = vec4<f32>(0.0);
    let key_end = min(params.seq, q0 + ROWS);  // the last key any query of the tile sees, plus one
    for (var k0 = 0u; k0 < key_end; k0 = k0 + COLS) {
        workgroupBarrier();  // the previous tile is no longer read
        load_col_a(lid, hd, k0, 1u);
        load_col_b(lid, hd, k0, 2u);
        workgroupBarrier();
        for (var e = lid; e < ROWS * COLS; e = e + THREADS) {
            let r = e / COLS;
            let j = e % COLS;
            tile_p[r * PCOLS + j] = select(NEG_BIG, params.scale * dot_own_a_col_a(r, j), k0 + j <= q0 + r);
        }
        workgroupBarrier();
        let s_$j = tile_p[row * PCOLS + $ju];
        var m_new = m;
        m_new = max(m_new, s_$j);
        let rescale = exp(m - m_new);
        let p_$j = exp(s_$j - m_new);
        l = l * rescale;
        l = l + p_$j;
        acc_$n = acc_$n * rescale;
        acc_$n = acc_$n + p_$j * col_b[$ju * PAD + part + $nu * R];
        m = m_new;
    }
    if (i < params.seq) {
        out[yg_row(hd, i) + part + $nu * R] = acc_$n / l;
        if (part == 0u) { lse[hd.bh * params.seq + i] = m + log(l); }
    }
}

// The backward, first dispatch: dQ for ROWS queries of one (batch, head), walking over the keys they see in
// tiles of COLS: ds = p (g.v - delta), dq += scale ds k. Saves delta for the second.
@compute @workgroup_size(THREADS)
fn attention_backward_q_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = head(wg.y);
    let q0 = wg.x * ROWS;
    let row = lid / R;
    let part = lid % R;
    let i = q0 + row;
    load_own_a(lid, hd, q0, 0u);
    load_own_b_grad(lid, hd, q0);
    for (var r = lid; r < ROWS; r = r + THREADS) {
        own_lse[r] = lse_of(hd, q0 + r);
        var d = 0.0;
        if (q0 + r < params.seq) {
            d = rowsum_g_y(hd, q0 + r);
            delta[hd.bh * params.seq + q0 + r] = d;
        }
        own_delta[r] = d;
    }
    var dq_$n = vec4<f32>(0.0);
    let key_end = min(params.seq, q0 + ROWS);
    for (var k0 = 0u; k0 < key_end; k0 = k0 + COLS) {
        workgroupBarrier();
        load_col_a(lid, hd, k0, 1u);
        load_col_b(lid, hd, k0, 2u);
        workgroupBarrier();
        for (var e = lid; e < ROWS * COLS; e = e + THREADS) {
            let r = e / COLS;
            let c = e % COLS;
            let p = select(0.0, exp(params.scale * dot_own_a_col_a(r, c) - own_lse[r]), k0 + c <= q0 + r);
            tile_ds[r * PCOLS + c] = p * (dot_own_b_col_b(r, c) - own_delta[r]);
        }
        workgroupBarrier();
        let ds_$j = tile_ds[row * PCOLS + $ju];
        dq_$n = dq_$n + ds_$j * col_a[$ju * PAD + part + $nu * R];
    }
    if (i < params.seq) {
        out[qkv_row(hd, i, 0u) + part + $nu * R] = params.scale * dq_$n;
    }
}

// The backward, second dispatch: dK and dV for ROWS keys of one (batch, head), walking over the queries that
// see them (from the first key on) in tiles of COLS: p = exp(scale * q.k - lse), dv += p g,
// ds = p (g.v - delta), dk += scale ds q.
@compute @workgroup_size(THREADS)
fn attention_backward_kv_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = head(wg.y);
    let k0 = wg.x * ROWS;
    let row = lid / R;
    let part = lid % R;
    let j = k0 + row;
    load_own_a(lid, hd, k0, 1u);
    load_own_b(lid, hd, k0, 2u);
    var dk_$n = vec4<f32>(0.0);
    var dv_$n = vec4<f32>(0.0);
    for (var q0 = k0; q0 < params.seq; q0 = q0 + COLS) {
        workgroupBarrier();
        load_col_a(lid, hd, q0, 0u);
        load_col_b_grad(lid, hd, q0);
        for (var c = lid; c < COLS; c = c + THREADS) {
            col_lse[c] = lse_of(hd, q0 + c);
            col_delta[c] = delta_of(hd, q0 + c);
        }
        workgroupBarrier();
        for (var e = lid; e < ROWS * COLS; e = e + THREADS) {
            let r = e / COLS;
            let c = e % COLS;
            let visible = k0 + r <= q0 + c && q0 + c < params.seq;
            let p = select(0.0, exp(params.scale * dot_own_a_col_a(r, c) - col_lse[c]), visible);
            tile_p[r * PCOLS + c] = p;
            tile_ds[r * PCOLS + c] = p * (dot_own_b_col_b(r, c) - col_delta[c]);
        }
        workgroupBarrier();
        let p_$j = tile_p[row * PCOLS + $ju];
        let ds_$j = tile_ds[row * PCOLS + $ju];
        dv_$n = dv_$n + p_$j * col_b[$ju * PAD + part + $nu * R];
        dk_$n = dk_$n + ds_$j * col_a[$ju * PAD + part + $nu * R];
    }
    if (j < params.seq) {
        out[qkv_row(hd, j, 1u) + part + $nu * R] = params.scale * dk_$n;
        out[qkv_row(hd, j, 2u) + part + $nu * R] = dv_$n;
    }
}
