// Fused causal self-attention backward, FlashAttention-2 style and built like attention_tiled.wgsl's forward:
// the same inputs and output as attention.wgsl's two backward kernels (the gradient of qkv), in two dispatches.
// A template: attention.py fills in one tile (KEYS, QUERIES, SN) and head size, generates the unrolled inner
// steps of the products, and repeats each line holding $i, $j, $o, $u or $r once for each value of it (0..3,
// 0..SN-1, 0..KO-1, 0..QU-1, 0..R-1 or KR-1 on the K/V load lines, which hold $k). naga does not unroll
// loops, and an accumulator array indexed in a loop would live in slow local memory: so every accumulator
// and staging register is its own variable.
//
// attention_backward_kv_main: a workgroup owns KEYS keys of one (batch, head), their k and v staged once in
// workgroup memory, and walks over the queries that see them, QUERIES at a time (q, g = dL/dy, lse and
// delta = rowsum(g * y) staged per step). Per step:
//   S = scale q k^T and dP = g v^T: thread (sx, sy) owns queries 4sy..4sy+3 and keys sx + SX*j;
//   P = exp(S - lse) (0 where the key is later than the query), dS = P (dP - delta), both to workgroup
//       memory transposed (a key's 4 probabilities of a query quad are one vec4);
//   dV += P^T g and dK += dS^T q, kept in registers all along: thread (c, kg) owns vec4 column c of keys
//       kg + G*o;
//   dQ's part from these keys, dS k: thread (c, qg) owns column c of query quads qg + G*u, written to `part`
//       (this key block's slice). WGSL has no float atomics, and the sum must be the same on every run.
// The next step's q, g and y are loaded into registers while this step computes. Each thread loads R
// consecutive vec4s of one row, so its part of the row's delta is a sum of its own products; a row's RT
// parts are added in a fixed order where delta is used. Every key block a query sees adds up its delta again: a
// kernel of its own computing it once cost more than it saved here.
// attention_backward_q_main then adds each query's slices in key-block order: dQ = scale * sum.
// It runs in place of attention.wgsl's two per-row backward kernels where a tile fits, being faster
// (experiments/attention_tiles.py times both).
//
// Bindings: qkv (B, T, 3C), g (B, T, C), out (the gradient of qkv), params, lse (B, nh, T), y (B, T, C),
// part (the slices of dQ: per (batch, head), key block kb holds the rows kb*KEYS..T-1).

const HS4: u32 = {{HS4}}u;
const KEYS: u32 = {{KEYS}}u;  // keys per workgroup
const QUERIES: u32 = {{QUERIES}}u;  // queries per step
const SN: u32 = {{SN}}u;  // keys per thread in S and dP
const SX: u32 = KEYS / SN;
const SY: u32 = QUERIES / 4u;
const THREADS: u32 = SX * SY;
const R: u32 = QUERIES * HS4 / THREADS;  // vec4s of a query row (and of g's, y's) a thread loads
const RT: u32 = HS4 / R;  // threads loading one row
const G: u32 = THREADS / HS4;  // threads a column in the dK/dV and dQ products
const STRIDE: u32 = HS4 + 1u;  // row strides in vec4s, padded against bank conflicts
const P_STRIDE: u32 = SY + 1u;

var<workgroup> k_tile: array<array<vec4<f32>, STRIDE>, KEYS>;
var<workgroup> v_tile: array<array<vec4<f32>, STRIDE>, KEYS>;
var<workgroup> q_tile: array<array<vec4<f32>, STRIDE>, QUERIES>;
var<workgroup> g_tile: array<array<vec4<f32>, STRIDE>, QUERIES>;
var<workgroup> p_tile: array<array<vec4<f32>, P_STRIDE>, KEYS>;  // [key][query quad]
var<workgroup> ds_tile: array<array<vec4<f32>, P_STRIDE>, KEYS>;
var<workgroup> delta_part: array<f32, THREADS>;  // [row * RT + the loader's place in the row]
var<workgroup> lse_tile: array<f32, QUERIES>;

{{HEAD}}

// Vec4 c of row t's part (0 q, 1 k, 2 v); zeros past the sequence.
fn qkv_at(hd: Head, t: u32, part: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq) { return vec4<f32>(0.0); }
    return qkv[hd.qkv + t * 3u * params.n_head * HS4 + part * params.n_head * HS4 + c];
}

fn g_at(hd: Head, t: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq) { return vec4<f32>(0.0); }
    return g[hd.yg + t * params.n_head * HS4 + c];
}

fn y_at(hd: Head, t: u32, c: u32) -> vec4<f32> {
    if (t >= params.seq) { return vec4<f32>(0.0); }
    return y[hd.yg + t * params.n_head * HS4 + c];
}

// Key blocks in wg.y (the longest walks, kb = 0, start first), (batch, head) in wg.x.
@compute @workgroup_size(THREADS)
fn attention_backward_kv_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let hd = head(grid.wg.x);
    let kb = grid.wg.y;
    let k0 = kb * KEYS;
    let sx = lid % SX;
    let sy = lid / SX;
    let c = lid % HS4;
    let grp = lid / HS4;
    let e_$k = lid + $ku * THREADS;
    k_tile[e_$k / HS4][e_$k % HS4] = qkv_at(hd, k0 + e_$k / HS4, 1u, e_$k % HS4);
    v_tile[e_$k / HS4][e_$k % HS4] = qkv_at(hd, k0 + e_$k / HS4, 2u, e_$k % HS4);
    // this thread's R vec4s of a query-tile row, loaded a step ahead
    let load_row = lid / RT;
    let load_col = (lid % RT) * R;
    var q_next_$r = qkv_at(hd, k0 + load_row, 0u, load_col + $ru);
    var g_next_$r = g_at(hd, k0 + load_row, load_col + $ru);
    var y_next_$r = y_at(hd, k0 + load_row, load_col + $ru);
    var lse_next = lse[hd.bh * params.seq + min(k0 + min(lid, QUERIES - 1u), params.seq - 1u)];
    var dv_$o = vec4<f32>(0.0);
    var dk_$o = vec4<f32>(0.0);
    for (var q0 = k0; q0 < params.seq; q0 = q0 + QUERIES) {
        workgroupBarrier();  // the previous step's tiles are read (and the keys and values stored)
        q_tile[load_row][load_col + $ru] = q_next_$r;
        g_tile[load_row][load_col + $ru] = g_next_$r;
        var gy = vec4<f32>(0.0);
        gy = gy + g_next_$r * y_next_$r;
        delta_part[lid] = gy.x + gy.y + gy.z + gy.w;
        if (lid < QUERIES) { lse_tile[lid] = lse_next; }
        workgroupBarrier();
        let next = q0 + QUERIES + load_row;
        q_next_$r = qkv_at(hd, next, 0u, load_col + $ru);
        g_next_$r = g_at(hd, next, load_col + $ru);
        y_next_$r = y_at(hd, next, load_col + $ru);
        lse_next = lse[hd.bh * params.seq + min(q0 + QUERIES + min(lid, QUERIES - 1u), params.seq - 1u)];
        var s_$i_$j = 0.0;
        var dp_$i_$j = 0.0;
        for (var d = 0u; d < HS4; d = d + {{SCORE_STEP}}u) {
{{SCORES}}
        }
        let row_$i = 4u * sy + $iu;
        var delta_$i = 0.0;
        for (var t = 0u; t < RT; t = t + 1u) {
            delta_$i = delta_$i + delta_part[row_$i * RT + t];
        }
        let seen_$i_$j = k0 + sx + $ju * SX <= q0 + row_$i && q0 + row_$i < params.seq;
        let p_$i_$j = select(0.0, exp(params.scale * s_$i_$j - lse_tile[row_$i]), seen_$i_$j);
        let ds_$i_$j = p_$i_$j * (dp_$i_$j - delta_$i);
        p_tile[sx + $ju * SX][sy] = vec4<f32>(p_0_$j, p_1_$j, p_2_$j, p_3_$j);
        ds_tile[sx + $ju * SX][sy] = vec4<f32>(ds_0_$j, ds_1_$j, ds_2_$j, ds_3_$j);
        workgroupBarrier();  // P and dS are in place
        for (var iq = 0u; iq < SY; iq = iq + {{KV_STEP}}u) {
{{KV}}
        }
        var dq_$u_$i = vec4<f32>(0.0);
        for (var j = 0u; j < KEYS; j = j + {{Q_STEP}}u) {
{{Q}}
        }
        let dq_row_$u_$i = q0 + 4u * (grp + $uu * G) + $iu;
        if (dq_row_$u_$i < params.seq) { part[part_row(hd.bh, kb, dq_row_$u_$i) * HS4 + c] = dq_$u_$i; }
    }
    let key_$o = k0 + grp + $ou * G;
    let key_at_$o = hd.qkv + key_$o * 3u * params.n_head * HS4 + params.n_head * HS4 + c;
    if (key_$o < params.seq) { out[key_at_$o] = params.scale * dk_$o; }
    if (key_$o < params.seq) { out[key_at_$o + params.n_head * HS4] = dv_$o; }
}

{{DQ}}
