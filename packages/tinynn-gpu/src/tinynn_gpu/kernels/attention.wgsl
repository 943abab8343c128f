// Fused causal self-attention, FlashAttention-2 style: forward and backward without a T x T array in memory.
// A template: attention.py fills {{HS4}} (head size / 4), {{LANES}}, {{ROWS}}, {{SPLITS}}, {{RPT}} and the
// body of lane_sum, and unrolls it: a line holding $n is repeated for n = 0 .. NV-1, one holding $r for
// r = 0 .. RPT-1. naga does not unroll loops, and an accumulator array indexed in a loop would live in slow
// local memory, not in registers: so every accumulator is its own variable. q, k and v are read straight from the qkv projection's output
// (B, T, 3C) = [q | k | v], head h in columns h*hs:(h+1)*hs of each part; y and the gradients are written in
// the same row layout.
//
// A workgroup owns ROWS rows of one (batch, head): queries (forward, dQ) or keys (dK/dV), RPT neighbouring
// rows to a thread (each row read from the other side then serves RPT rows: less traffic from the cache to
// the threads, which bounds these kernels). LANES neighbouring threads share their rows, each holding
// NV = HS4 / LANES of a row's vec4s (lane, lane + LANES, ...) in registers, so a row's dot product is a sum over its lanes (lane_sum: subgroup shuffles, or nothing when
// LANES = 1, the form for adapters without subgroups; it assumes, as every driver does for a 1-D workgroup,
// that LANES consecutive invocations sit in one subgroup). The rows of the other side are read straight
// from memory, all threads of a subgroup reading the same row (a broadcast, cached): no workgroup memory
// and no barrier in the loop. SPLITS groups of threads walk over the other side's rows interleaved
// (split s takes rows s, s + SPLITS, ...) so that short sequences still fill the GPU; at the end they add
// their partial results in split order through workgroup memory (the same sum on every run).
//
// The forward's softmax is online with a lazy maximum: a row's running sum and accumulator are kept
// relative to a reference m and rescaled only when a score exceeds m by RESCALE_AT (exp(8) leaves fp32 more
// than enough range), the same arithmetic as rescaling at every new maximum but with the rescale rare.
//
// The backward needs delta = rowsum(g * y) per query. The dQ kernel, which runs first, computes it for
// the queries it owns and saves it for the dK/dV kernel (FlashAttention-2's separate pre-pass would cost a
// dispatch for a few microseconds of work).
//
// Bindings: 0 qkv, 1 g (the gradient of y), 2 out (y, or the gradient of qkv), 3 params, 4 lse (B, nh, T),
// 5 y (read by the backward), 6 delta (B, nh, T).

const HS4: u32 = {{HS4}}u;
const LANES: u32 = {{LANES}}u;
const NV: u32 = HS4 / LANES;
const ROWS: u32 = {{ROWS}}u;
const SPLITS: u32 = {{SPLITS}}u;
const RPT: u32 = {{RPT}}u;
const SLOTS: u32 = ROWS / RPT;  // the thread groups of a split, RPT rows each
const THREADS: u32 = SLOTS * LANES * SPLITS;
const PAD: u32 = HS4 + 1u;  // a row's stride in `partial`, in vec4s: neighbouring rows in other memory banks
// Masked scores: exp(NEG_BIG - m) is exactly 0 for any finite m; a finite sentinel, because a constant -inf
// is rejected by Tint.
const NEG_BIG: f32 = -3.0e38;
const RESCALE_AT: f32 = 8.0;

struct Params { seq: u32, n_head: u32, scale: f32 }

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;
@group(0) @binding(5) var<storage, read> y: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> delta: array<f32>;

var<workgroup> partial: array<vec4<f32>, SPLITS * ROWS * PAD>;  // the splits' accumulators, to be added
var<workgroup> split_m: array<f32, SPLITS * ROWS>;  // the forward's splits' reference maxima and sums
var<workgroup> split_l: array<f32, SPLITS * ROWS>;

fn lane_sum(x: f32) -> f32 {
{{LANE_SUM}}
}

// A thread's place: its slot (rows slot * RPT ..) among the SLOTS, its lane within the rows, its split;
// `rank` numbers the LANES * SPLITS threads of a slot.
struct Role { slot: u32, lane: u32, split: u32, rank: u32 }

fn role(lid: u32) -> Role {
    let lane = lid % LANES;
    let split = lid / (LANES * SLOTS);
    return Role((lid / LANES) % SLOTS, lane, split, split * LANES + lane);
}

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

fn partial_at(row: u32, split: u32, c: u32) -> u32 {
    return (split * ROWS + row) * PAD + c;
}

// The sum over the splits of vec4 column c of a row of the workgroup, in split order (after a barrier).
fn splits_sum(row: u32, c: u32) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < SPLITS; k = k + 1u) { s = s + partial[partial_at(row, k, c)]; }
    return s;
}

// y = softmax(scale * q k^T, causal) v and lse, one workgroup per ROWS queries of one (batch, head).
@compute @workgroup_size(THREADS)
fn attention_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = head(wg.y);
    let q0 = wg.x * ROWS;
    let me = role(lid);
    let row_$r = me.slot * RPT + $ru;
    let i_$r = q0 + row_$r;
    let qi_$r = qkv_row(hd, min(i_$r, params.seq - 1u), 0u) + me.lane;  // rows past the end compute, unwritten
    let q_$r_$n = qkv[qi_$r + $nu * LANES];
    var m_$r = NEG_BIG;
    var l_$r = 0.0;
    var acc_$r_$n = vec4<f32>(0.0);
    let key_end = min(params.seq, q0 + ROWS);  // the last key any query of the tile sees, plus one
    for (var j = me.split; j < key_end; j = j + SPLITS) {
        let kj = qkv_row(hd, j, 1u) + me.lane;
        let vj = kj + params.n_head * HS4;
        let k_$n = qkv[kj + $nu * LANES];
        let v_$n = qkv[vj + $nu * LANES];  // loaded with k, not after the score: one wait on memory, not two
        var d_$r = vec4<f32>(0.0);
        d_$r = d_$r + q_$r_$n * k_$n;
        let s_$r = params.scale * lane_sum(d_$r.x + d_$r.y + d_$r.z + d_$r.w);
        let visible_$r = j <= i_$r;
        let up_$r = visible_$r && s_$r > m_$r + RESCALE_AT;
        let f_$r = select(1.0, exp(m_$r - s_$r), up_$r);
        if (up_$r) { acc_$r_$n = acc_$r_$n * f_$r; }
        l_$r = l_$r * f_$r;
        m_$r = select(m_$r, s_$r, up_$r);
        let p_$r = select(0.0, exp(s_$r - m_$r), visible_$r);
        l_$r = l_$r + p_$r;
        acc_$r_$n = acc_$r_$n + p_$r * v_$n;
    }
    // the splits' states on one maximum, then added
    if (me.lane == 0u) {
        split_m[me.split * ROWS + row_$r] = m_$r;
        split_l[me.split * ROWS + row_$r] = l_$r;
    }
    workgroupBarrier();
    var top_$r = NEG_BIG;
    var total_$r = 0.0;
    for (var k = 0u; k < SPLITS; k = k + 1u) {
        top_$r = max(top_$r, split_m[k * ROWS + row_$r]);
    }
    for (var k = 0u; k < SPLITS; k = k + 1u) {
        total_$r = total_$r + split_l[k * ROWS + row_$r] * exp(split_m[k * ROWS + row_$r] - top_$r);
    }
    partial[partial_at(row_$r, me.split, me.lane + $nu * LANES)] = acc_$r_$n * exp(m_$r - top_$r);
    workgroupBarrier();
    for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) {
        if (i_$r < params.seq) { out[yg_row(hd, i_$r) + c] = splits_sum(row_$r, c) / total_$r; }
    }
    if (i_$r < params.seq && me.rank == 0u) { lse[hd.bh * params.seq + i_$r] = top_$r + log(total_$r); }
}

// The backward, first dispatch: dQ for ROWS queries of one (batch, head), over the keys they see:
// ds = p (g.v - delta), dq += scale ds k. Saves delta for the second.
@compute @workgroup_size(THREADS)
fn attention_backward_q_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = head(wg.y);
    let q0 = wg.x * ROWS;
    let me = role(lid);
    let row_$r = me.slot * RPT + $ru;
    let i_$r = q0 + row_$r;
    let ic_$r = min(i_$r, params.seq - 1u);
    let qi_$r = qkv_row(hd, ic_$r, 0u) + me.lane;
    let gi_$r = yg_row(hd, ic_$r) + me.lane;
    let q_$r_$n = qkv[qi_$r + $nu * LANES];
    let g_$r_$n = g[gi_$r + $nu * LANES];
    var gy_$r = vec4<f32>(0.0);
    gy_$r = gy_$r + g_$r_$n * y[gi_$r + $nu * LANES];
    let di_$r = lane_sum(gy_$r.x + gy_$r.y + gy_$r.z + gy_$r.w);
    if (i_$r < params.seq && me.rank == 0u) { delta[hd.bh * params.seq + i_$r] = di_$r; }
    let li_$r = lse[hd.bh * params.seq + ic_$r];
    var dq_$r_$n = vec4<f32>(0.0);
    let key_end = min(params.seq, q0 + ROWS);
    for (var j = me.split; j < key_end; j = j + SPLITS) {
        let kj = qkv_row(hd, j, 1u) + me.lane;
        let vj = kj + params.n_head * HS4;
        let k_$n = qkv[kj + $nu * LANES];
        let v_$n = qkv[vj + $nu * LANES];
        var a_$r = vec4<f32>(0.0);
        var b_$r = vec4<f32>(0.0);
        a_$r = a_$r + q_$r_$n * k_$n;
        b_$r = b_$r + g_$r_$n * v_$n;
        let s_$r = params.scale * lane_sum(a_$r.x + a_$r.y + a_$r.z + a_$r.w);
        let dp_$r = lane_sum(b_$r.x + b_$r.y + b_$r.z + b_$r.w);
        let p_$r = select(0.0, exp(s_$r - li_$r), j <= i_$r);
        let ds_$r = p_$r * (dp_$r - di_$r);
        dq_$r_$n = dq_$r_$n + ds_$r * k_$n;
    }
    partial[partial_at(row_$r, me.split, me.lane + $nu * LANES)] = dq_$r_$n;
    workgroupBarrier();
    for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) {
        if (i_$r < params.seq) { out[qkv_row(hd, i_$r, 0u) + c] = params.scale * splits_sum(row_$r, c); }
    }
}

// The backward, second dispatch: dK and dV for ROWS keys of one (batch, head), over the queries that see
// them: p = exp(scale * q.k - lse), dv += p g, ds = p (g.v - delta), dk += scale ds q.
@compute @workgroup_size(THREADS)
fn attention_backward_kv_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hd = head(wg.y);
    let k0 = wg.x * ROWS;
    let me = role(lid);
    let row_$r = me.slot * RPT + $ru;
    let j_$r = k0 + row_$r;
    let kj_$r = qkv_row(hd, min(j_$r, params.seq - 1u), 1u) + me.lane;
    let vj_$r = kj_$r + params.n_head * HS4;
    let k_$r_$n = qkv[kj_$r + $nu * LANES];
    let v_$r_$n = qkv[vj_$r + $nu * LANES];
    var dk_$r_$n = vec4<f32>(0.0);
    var dv_$r_$n = vec4<f32>(0.0);
    for (var i = k0 + me.split; i < params.seq; i = i + SPLITS) {
        let qi = qkv_row(hd, i, 0u) + me.lane;
        let gi = yg_row(hd, i) + me.lane;
        let q_$n = qkv[qi + $nu * LANES];
        let g_$n = g[gi + $nu * LANES];
        let li = lse[hd.bh * params.seq + i];
        let di = delta[hd.bh * params.seq + i];
        var a_$r = vec4<f32>(0.0);
        var b_$r = vec4<f32>(0.0);
        a_$r = a_$r + q_$n * k_$r_$n;
        b_$r = b_$r + g_$n * v_$r_$n;
        let s_$r = params.scale * lane_sum(a_$r.x + a_$r.y + a_$r.z + a_$r.w);
        let dp_$r = lane_sum(b_$r.x + b_$r.y + b_$r.z + b_$r.w);
        let p_$r = select(0.0, exp(s_$r - li), i >= j_$r);
        let ds_$r = p_$r * (dp_$r - di);
        dv_$r_$n = dv_$r_$n + p_$r * g_$n;
        dk_$r_$n = dk_$r_$n + ds_$r * q_$n;
    }
    partial[partial_at(row_$r, me.split, me.lane + $nu * LANES)] = dv_$r_$n;
    workgroupBarrier();
    for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) {
        if (j_$r < params.seq) { out[qkv_row(hd, j_$r, 2u) + c] = splits_sum(row_$r, c); }
    }
    workgroupBarrier();  // every split's dv is read before dk takes its place
    partial[partial_at(row_$r, me.split, me.lane + $nu * LANES)] = dk_$r_$n;
    workgroupBarrier();
    for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) {
        if (j_$r < params.seq) { out[qkv_row(hd, j_$r, 1u) + c] = params.scale * splits_sum(row_$r, c); }
    }
}
