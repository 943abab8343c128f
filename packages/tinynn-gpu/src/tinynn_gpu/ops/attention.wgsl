// Fused causal self-attention, FlashAttention-2 style: forward and backward without a T x T array in memory.
// A template: attention.py fills {{HS4}} (head size / 4), {{LANES}}, {{ROWS}}, {{SPLITS}} and the body of
// lane_sum, and unrolls it: a line holding $n is repeated for n = 0 .. NV-1. naga does not unroll loops, and
// an accumulator array indexed in a loop would live in slow local memory, not in registers: so every
// accumulator is its own variable. q, k and v are read straight from the qkv projection's output
// (B, T, 3C) = [q | k | v], head h in columns h*hs:(h+1)*hs of each part; y and the gradients are written in
// the same row layout.
//
// A workgroup owns ROWS rows of one (batch, head): queries (forward, dQ) or keys (dK/dV). LANES neighbouring
// threads share an owned row, each holding NV = HS4 / LANES of its vec4s (lane, lane + LANES, ...) in
// registers, so a row's dot product is a sum over its lanes (lane_sum: subgroup shuffles, or nothing when
// LANES = 1, the form for adapters without subgroups; it assumes, as every driver does for a 1-D workgroup,
// that LANES consecutive invocations sit in one subgroup). The rows of the other side are read straight
// from memory, all threads of a subgroup reading the same row (a broadcast, cached): no workgroup memory
// and no barrier in the loop. SPLITS groups of threads walk over the other side's rows interleaved
// (split s takes rows s, s + SPLITS, ...) so that short sequences still fill the GPU; at the end they add
// their partial results in split order through workgroup memory (the same sum on every run).
// Every thread of a workgroup takes the same number of steps over the other side (a split whose row lies
// past the end on the last step loads a clamped row and masks it): a subgroup operation is defined only
// where all of a subgroup's invocations reach it together, and a subgroup may hold threads of several
// splits (LANES x ROWS below the subgroup's size: 2 lanes a row, or AMD's 64-wide subgroups).
//
// The forward's softmax is online with a lazy maximum: a row's running sum and accumulator are kept
// relative to a reference m and rescaled only when a score exceeds m by RESCALE_AT (exp(8) leaves fp32 more
// than enough range): in exact arithmetic the result of rescaling at every new maximum, with the rescale rare.
//
// The backward needs delta = rowsum(g * y) per query. The dQ kernel, which runs first, computes it for
// the queries it owns and saves it for the dK/dV kernel (FlashAttention-2's separate pre-pass would cost a
// dispatch for a few microseconds of work).
//
// Bindings: qkv, g (the gradient of y), out (y, or the gradient of qkv), params, lse (B, nh, T), y (read by
// the backward), delta (B, nh, T).

const HS4: u32 = {{HS4}}u;
const LANES: u32 = {{LANES}}u;
const NV: u32 = HS4 / LANES;
const ROWS: u32 = {{ROWS}}u;
const SPLITS: u32 = {{SPLITS}}u;
const THREADS: u32 = ROWS * LANES * SPLITS;
const PAD: u32 = HS4 + 1u;  // a row's stride in `partial`, in vec4s: neighbouring rows in other memory banks
// Masked scores: exp(NEG_BIG - m) is exactly 0 for any finite m; a finite sentinel, because a constant -inf
// is rejected by Tint.
const NEG_BIG: f32 = -3.0e38;
const RESCALE_AT: f32 = 8.0;

@group(0) @binding(6) var<storage, read_write> delta: array<f32>;

var<workgroup> partial: array<vec4<f32>, SPLITS * ROWS * PAD>;  // the splits' accumulators, to be added
var<workgroup> split_m: array<f32, SPLITS * ROWS>;  // the forward's splits' reference maxima and sums
var<workgroup> split_l: array<f32, SPLITS * ROWS>;

fn lane_sum(x: f32) -> f32 {
{{LANE_SUM}}
}

// A thread's place: its row among the ROWS, its lane within the row, its split; `rank` numbers the
// LANES * SPLITS threads of a row.
struct Role { row: u32, lane: u32, split: u32, rank: u32 }

fn role(lid: u32) -> Role {
    let lane = lid % LANES;
    let split = lid / (LANES * ROWS);
    return Role((lid / LANES) % ROWS, lane, split, split * LANES + lane);
}

{{HEAD}}

fn qkv_row(hd: Head, t: u32, part: u32) -> u32 {  // part 0 q, 1 k, 2 v
    return hd.qkv + t * 3u * params.n_head * HS4 + part * params.n_head * HS4;
}

fn yg_row(hd: Head, t: u32) -> u32 {
    return hd.yg + t * params.n_head * HS4;
}

fn partial_at(me: Role, split: u32, c: u32) -> u32 {
    return (split * ROWS + me.row) * PAD + c;
}

// A backward workgroup's rows: ROWS queries (dQ) or keys (dK/dV) of one (batch, head) from `first`, the row
// blocks in wg.x and (batch, head) in wg.y.
struct Block { hd: Head, first: u32 }

fn block(grid: Grid) -> Block { return Block(head(grid.wg.y), grid.wg.x * ROWS); }

// Query row i of the backward for a thread's lane, the row clamped to the sequence (one past the end computes,
// unwritten): where its q is in qkv, its g and y, and its lse and delta.
struct Query { q: u32, gy: u32, stat: u32 }

fn query(hd: Head, i: u32, lane: u32) -> Query {
    let ic = min(i, params.seq - 1u);
    return Query(qkv_row(hd, ic, 0u) + lane, yg_row(hd, ic) + lane, hd.bh * params.seq + ic);
}

// One (query, key) pair's p and ds from a thread's lanes' products q * k and g * v, summed over the row's lanes:
// p = exp(scale q.k - lse), 0 where the key is not visible, and ds = p (g.v - delta). Both backward kernels'.
fn p_and_ds(qk: vec4<f32>, gv: vec4<f32>, lse_i: f32, delta_i: f32, visible: bool) -> vec2<f32> {
    let s = params.scale * lane_sum(qk.x + qk.y + qk.z + qk.w);
    let dp = lane_sum(gv.x + gv.y + gv.z + gv.w);
    let p = select(0.0, exp(s - lse_i), visible);
    return vec2<f32>(p, p * (dp - delta_i));
}

// The sum over the splits of vec4 column c of the thread's row, in split order (after a barrier).
fn splits_sum(me: Role, c: u32) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < SPLITS; k = k + 1u) { s = s + partial[partial_at(me, k, c)]; }
    return s;
}

// y = softmax(scale * q k^T, causal) v and lse, one workgroup per ROWS queries of one (batch, head): query
// blocks in wg.y, the last (the longest walk) first, as attention_tiled.wgsl's; (batch, head) in wg.x.
@compute @workgroup_size(THREADS)
fn attention_forward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let hd = head(grid.wg.x);
    let q0 = (grid.nwg.y - 1u - grid.wg.y) * ROWS;
    let me = role(lid);
    let i = q0 + me.row;
    let qi = qkv_row(hd, min(i, params.seq - 1u), 0u) + me.lane;  // rows past the end compute, unwritten
    let q_$n = qkv[qi + $nu * LANES];
    var m = NEG_BIG;
    var l = 0.0;
    var acc_$n = vec4<f32>(0.0);
    let key_end = min(params.seq, q0 + ROWS);  // the last key any query of the tile sees, plus one
    for (var j0 = 0u; j0 < key_end; j0 = j0 + SPLITS) {
        let j = j0 + me.split;
        let kj = qkv_row(hd, min(j, key_end - 1u), 1u) + me.lane;
        let vj = kj + params.n_head * HS4;
        let v_$n = qkv[vj + $nu * LANES];  // loaded with k, not after the score: one wait on memory, not two
        var d = vec4<f32>(0.0);
        d = d + q_$n * qkv[kj + $nu * LANES];
        let s = params.scale * lane_sum(d.x + d.y + d.z + d.w);
        let visible = j <= i && j < key_end;
        if (visible && s > m + RESCALE_AT) {
            let f = exp(m - s);
            l = l * f;
            acc_$n = acc_$n * f;
            m = s;
        }
        let p = select(0.0, exp(s - m), visible);
        l = l + p;
        acc_$n = acc_$n + p * v_$n;
    }
    // the splits' states on one maximum, then added
    if (me.lane == 0u) {
        split_m[me.split * ROWS + me.row] = m;
        split_l[me.split * ROWS + me.row] = l;
    }
    workgroupBarrier();
    var top = NEG_BIG;
    for (var k = 0u; k < SPLITS; k = k + 1u) { top = max(top, split_m[k * ROWS + me.row]); }
    var total = 0.0;
    for (var k = 0u; k < SPLITS; k = k + 1u) {
        total = total + split_l[k * ROWS + me.row] * exp(split_m[k * ROWS + me.row] - top);
    }
    let f = exp(m - top);
    partial[partial_at(me, me.split, me.lane + $nu * LANES)] = acc_$n * f;
    workgroupBarrier();
    if (i < params.seq) {
        for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) { out[yg_row(hd, i) + c] = splits_sum(me, c) / total; }
        if (me.rank == 0u) { lse[hd.bh * params.seq + i] = top + log(total); }
    }
}

// The backward, first dispatch: dQ for ROWS queries of one (batch, head), over the keys they see:
// ds = p (g.v - delta), dq += scale ds k. Saves delta for the second.
@compute @workgroup_size(THREADS)
fn attention_backward_q_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let blk = block(grid);
    let me = role(lid);
    let i = blk.first + me.row;
    let qr = query(blk.hd, i, me.lane);
    let q_$n = qkv[qr.q + $nu * LANES];
    let g_$n = g[qr.gy + $nu * LANES];
    var gy = vec4<f32>(0.0);
    gy = gy + g_$n * y[qr.gy + $nu * LANES];
    let di = lane_sum(gy.x + gy.y + gy.z + gy.w);
    if (i < params.seq && me.rank == 0u) { delta[qr.stat] = di; }
    let li = lse[qr.stat];
    var dq_$n = vec4<f32>(0.0);
    let key_end = min(params.seq, blk.first + ROWS);
    for (var j0 = 0u; j0 < key_end; j0 = j0 + SPLITS) {
        let j = j0 + me.split;
        let kj = qkv_row(blk.hd, min(j, key_end - 1u), 1u) + me.lane;
        let vj = kj + params.n_head * HS4;
        let k_$n = qkv[kj + $nu * LANES];
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        a = a + q_$n * k_$n;
        b = b + g_$n * qkv[vj + $nu * LANES];
        let pd = p_and_ds(a, b, li, di, j <= i && j < key_end);
        dq_$n = dq_$n + pd.y * k_$n;
    }
    partial[partial_at(me, me.split, me.lane + $nu * LANES)] = dq_$n;
    workgroupBarrier();
    if (i < params.seq) {
        for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) {
            out[qkv_row(blk.hd, i, 0u) + c] = params.scale * splits_sum(me, c);
        }
    }
}

// The backward, second dispatch: dK and dV for ROWS keys of one (batch, head), over the queries that see
// them: p = exp(scale * q.k - lse), dv += p g, ds = p (g.v - delta), dk += scale ds q.
@compute @workgroup_size(THREADS)
fn attention_backward_kv_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let blk = block(grid);
    let me = role(lid);
    let j = blk.first + me.row;
    let kj = qkv_row(blk.hd, min(j, params.seq - 1u), 1u) + me.lane;
    let vj = kj + params.n_head * HS4;
    let k_$n = qkv[kj + $nu * LANES];
    let v_$n = qkv[vj + $nu * LANES];
    var dk_$n = vec4<f32>(0.0);
    var dv_$n = vec4<f32>(0.0);
    for (var i0 = blk.first; i0 < params.seq; i0 = i0 + SPLITS) {
        let i = i0 + me.split;
        let qr = query(blk.hd, i, me.lane);
        let q_$n = qkv[qr.q + $nu * LANES];
        let g_$n = g[qr.gy + $nu * LANES];
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        a = a + q_$n * k_$n;
        b = b + g_$n * v_$n;
        let pd = p_and_ds(a, b, lse[qr.stat], delta[qr.stat], i >= j && i < params.seq);
        dv_$n = dv_$n + pd.x * g_$n;
        dk_$n = dk_$n + pd.y * q_$n;
    }
    partial[partial_at(me, me.split, me.lane + $nu * LANES)] = dv_$n;
    workgroupBarrier();
    if (j < params.seq) {
        for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) { out[qkv_row(blk.hd, j, 2u) + c] = splits_sum(me, c); }
    }
    workgroupBarrier();  // every split's dv is read before dk takes its place
    partial[partial_at(me, me.split, me.lane + $nu * LANES)] = dk_$n;
    workgroupBarrier();
    if (j < params.seq) {
        for (var c = me.rank; c < HS4; c = c + LANES * SPLITS) {
            out[qkv_row(blk.hd, j, 1u) + c] = params.scale * splits_sum(me, c);
        }
    }
}
