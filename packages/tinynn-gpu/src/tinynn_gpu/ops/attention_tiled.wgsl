// Fused causal self-attention forward, FlashAttention-2 style and built like a register-blocked matmul: the
// same outputs and bindings as attention.wgsl's attention_forward_main (y and the per-row logsumexp). A
// template: attention.py fills in one tile (ROWS, KEYS, SN) and head size, generates the unrolled inner
// steps of the two products, and repeats each line holding $i, $j, $q or $r once for each value of it
// (0..3, 0..SN-1, 0..NQ-1, 0..NR-1). naga does not unroll loops, and an accumulator array indexed in a
// loop would live in slow local memory: so every accumulator and staging register is its own variable.
//
// A workgroup owns ROWS queries of one (batch, head), staged once in workgroup memory, and walks over the
// keys they see, KEYS at a time. Thread (tx, ty) owns queries 4ty..4ty+3 of the block:
//   S = scale q k^T: 4 x SN scores, against keys tx + TX*j, from the staged queries and key tile (vec4s
//       along the head, rows padded by a vec4 so the threads reading different keys hit other banks);
//   the online softmax: the step's row maxima meet in workgroup memory (each thread reads all TX partial
//       maxima of its rows; no subgroup operations, so one form for every adapter), and each thread keeps
//       its own part of the row sums, added over the row's threads once at the end in a fixed order;
//   P goes to workgroup memory transposed (a key's 4 probabilities of a thread's rows are one vec4), the
//       value tile replaces the key tile, and O += P V: 4 rows x NQ vec4 columns (quads tx + TX*q).
// The next step's keys and values are loaded into registers (NR vec4s each a thread) while this step
// computes, and stored into the tile when it is free: global memory's latency hides behind the arithmetic.
// Columns past the head (NQ * TX > HS4) and rows past the sequence compute on zeros and are not written.
// It runs in place of attention.wgsl's per-row forward where a tile fits, being faster
// (experiments/attention_tiles.py times both).
//
// Bindings: qkv (B, T, 3C), out = y (B, T, C), params, lse (B, nh, T).

const HS4: u32 = {{HS4}}u;
const ROWS: u32 = {{ROWS}}u;  // queries per workgroup
const KEYS: u32 = {{KEYS}}u;  // keys per step
const SN: u32 = {{SN}}u;  // keys per thread and step
const TX: u32 = KEYS / SN;  // threads sharing a query row
const TY: u32 = ROWS / 4u;
const THREADS: u32 = TX * TY;
const Q_STRIDE: u32 = HS4 + 1u;  // row strides in vec4s, padded against bank conflicts
const KV_STRIDE: u32 = {{KV_STRIDE}}u;  // NQ * TX columns (at least HS4) and a pad
const P_STRIDE: u32 = TY + 1u;
// Masked scores: exp(NEG_BIG - m) is exactly 0 for any finite m; a finite sentinel, because a constant -inf
// is rejected by Tint.
const NEG_BIG: f32 = -3.0e38;

var<workgroup> q_tile: array<array<vec4<f32>, Q_STRIDE>, ROWS>;
var<workgroup> kv_tile: array<array<vec4<f32>, KV_STRIDE>, KEYS>;  // the keys, then the values
var<workgroup> p_tile: array<array<vec4<f32>, P_STRIDE>, KEYS>;  // [key][ty]: P of rows 4ty..4ty+3
var<workgroup> row_part: array<array<vec4<f32>, TY>, TX>;  // [tx][ty]: a thread's row maxima, then sums

{{HEAD}}

// Vec4 c of row t's part (0 q, 1 k, 2 v); zeros past the sequence.
fn qkv_at(hd: Head, t: u32, part: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq) { return vec4<f32>(0.0); }
    return qkv[hd.qkv + t * 3u * params.n_head * HS4 + part * params.n_head * HS4 + c];
}

// Query blocks in wg.y, the last (which walks the most keys) first, and (batch, head) in wg.x: the workgroups an
// SM is handed then mix long and short walks. With query blocks in x, the first first, the big config's four
// blocks a head put one block's workgroups on each SM (132 SMs are a multiple of 4), the last block's SMs walking
// four times the first's keys.
@compute @workgroup_size(THREADS)
fn attention_forward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let hd = head(grid.wg.x);
    let q0 = (grid.nwg.y - 1u - grid.wg.y) * ROWS;
    let tx = lid % TX;
    let ty = lid / TX;
    for (var e = lid; e < ROWS * HS4; e = e + THREADS) {
        q_tile[e / HS4][e % HS4] = qkv_at(hd, q0 + e / HS4, 0u, e % HS4);
    }
    // this thread's share of a key or value tile: vec4 e_r = lid + r * THREADS, row e_r / HS4
    let e_$r = lid + $ru * THREADS;
    let row_$r = e_$r / HS4;
    let col_$r = e_$r % HS4;
    var k_next_$r = qkv_at(hd, row_$r, 1u, col_$r);
    var v_next_$r = qkv_at(hd, row_$r, 2u, col_$r);
    var m = vec4<f32>(NEG_BIG);  // the rows' running maxima, the same in every thread of a row
    var l = vec4<f32>(0.0);  // this thread's part of the rows' sums
    var o_$i_$q = vec4<f32>(0.0);
    let key_end = min(params.seq, q0 + ROWS);  // the last key any query of the block sees, plus one
    for (var k0 = 0u; k0 < key_end; k0 = k0 + KEYS) {
        workgroupBarrier();  // the previous step's values and probabilities are read (and the queries stored)
        if (e_$r < KEYS * HS4) { kv_tile[row_$r][col_$r] = k_next_$r; }
        let v_$r = v_next_$r;
        workgroupBarrier();
        var s_$i_$j = 0.0;
        for (var d = 0u; d < HS4; d = d + {{SCORE_STEP}}u) {
{{SCORES}}
        }
        s_$i_$j = select(NEG_BIG, params.scale * s_$i_$j, k0 + tx + $ju * TX <= q0 + 4u * ty + $iu);
        row_part[tx][ty] = vec4<f32>({{ROW_MAXIMA}});
        workgroupBarrier();  // the keys are read and every thread's maxima written
        if (e_$r < KEYS * HS4) { kv_tile[row_$r][col_$r] = v_$r; }
        k_next_$r = qkv_at(hd, k0 + KEYS + row_$r, 1u, col_$r);
        v_next_$r = qkv_at(hd, k0 + KEYS + row_$r, 2u, col_$r);
        var top = m;  // key 0 is in the first step and every query sees it: top is finite from then on
        for (var t = 0u; t < TX; t = t + 1u) { top = max(top, row_part[t][ty]); }
        let f = exp(m - top);
        m = top;
        l = l * f;
        o_$i_$q = o_$i_$q * f[$i];
        let p_$i_$j = exp(s_$i_$j - m[$i]);
        l = l + vec4<f32>({{ROW_SUMS}});
        p_tile[tx + $ju * TX][ty] = vec4<f32>(p_0_$j, p_1_$j, p_2_$j, p_3_$j);
        workgroupBarrier();  // the values and probabilities are in place
        for (var k = 0u; k < KEYS; k = k + {{VALUE_STEP}}u) {
{{VALUES}}
        }
    }
    // the rows' sums over their TX threads, in a fixed order
    workgroupBarrier();
    row_part[tx][ty] = l;
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    for (var t = 0u; t < TX; t = t + 1u) { total = total + row_part[t][ty]; }
    let out_row_$i = q0 + 4u * ty + $iu;
    let out_col_$q = tx + $qu * TX;
    let out_at_$i = hd.yg + out_row_$i * params.n_head * HS4;
    if (out_row_$i < params.seq && out_col_$q < HS4) { out[out_at_$i + out_col_$q] = o_$i_$q / total[$i]; }
    if (out_row_$i < params.seq && tx == 0u) { lse[hd.bh * params.seq + out_row_$i] = m[$i] + log(total[$i]); }
}
