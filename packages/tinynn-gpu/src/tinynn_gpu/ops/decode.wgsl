// Generation: the kernels of a decode step whose sequence state lives on the GPU, so the step's dispatches
// are recorded once and replayed (capture.py). `tokens` is a ring of token ids (token i of sequence b at
// [b * H + i % H]) and length[0] counts them; no kernel needs a value from the host that changes per token.
// NumPy references: numpy_backend.py (embed_window, kv_cache_write_, attention_decode, sample_tokens_,
// advance_).
// Bindings are named for what they hold; a cache read and a cache written are two bindings of their own.

struct Params {
    size: u32,         // threads with work (elements, or workgroups of (sequence, head) / sequences)
    count: u32,        // positions in the window embedded or written
    cols: u32,         // C, the model's width
    ring: u32,         // H, the token ring's slots per sequence
    block: u32,        // block_size: the window, and the caches' rows
    n_head: u32,
    head_size: u32,
    vocab: u32,
    top_k: u32,
    seed: u32,
    scale: f32,        // attention's 1 / sqrt(head size)
    temperature: f32,  // 0: greedy
    step: i32,         // advance_'s increment
}

// every entry point: the sequence length (and params, bound by op_params.wgsl)
@group(0) @binding(5) var<storage, read_write> length: array<i32>;
// embed_window: the token and position tables, the token ring, the embedded window
@group(0) @binding(9) var<storage, read> wte: array<f32>;
@group(0) @binding(10) var<storage, read> wpe: array<f32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
// kv_cache_write: the step's qkv into the caches
@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(12) var<storage, read_write> k_cache_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache_out: array<f32>;
// attention_decode: qkv's query against the caches, into out
@group(0) @binding(1) var<storage, read> k_cache: array<f32>;
@group(0) @binding(8) var<storage, read> v_cache: array<f32>;
// sample_tokens: the logits, the ids drawn (and the token ring)
@group(0) @binding(11) var<storage, read> logits: array<f32>;
@group(0) @binding(7) var<storage, read_write> ids: array<i32>;

const LOWEST = -3.0e38;  // below every finite score: a start for maxima that is not a constant infinity

// Element i of a (B, count, C) array of the step's new positions: its row (sequence, t), its sequence, its
// place t among the count and its column.
struct Slot { row: u32, seq: u32, t: u32, col: u32 }

fn slot(i: u32) -> Slot {
    let row = i / params.cols;
    return Slot(row, row / params.count, row % params.count, i % params.cols);
}

// out = x (B, count, C); size = B * count * C
@compute @workgroup_size(256)
fn embed_window_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.size) { return; }
    let at = slot(i);
    let n = u32(length[0]);
    let index = n - params.count + at.t;  // the token's place in the whole sequence
    let position = index - (max(n, params.block) - params.block);  // counted from the window's start
    let token = u32(tokens[at.seq * params.ring + index % params.ring]);
    out[i] = wte[token * params.cols + at.col] + wpe[position * params.cols + at.col];
}

// qkv (B, T, 3C); the caches (B, block_size, C); count = T, size = B * T * C
@compute @workgroup_size(256)
fn kv_cache_write_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.size) { return; }
    let at = slot(i);
    let cols = params.cols;
    let block = params.block;
    let dst = (at.seq * block + min(u32(length[0]), block) - params.count + at.t) * cols + at.col;
    k_cache_out[dst] = qkv[at.row * 3u * cols + cols + at.col];
    v_cache_out[dst] = qkv[at.row * 3u * cols + 2u * cols + at.col];
}

// One workgroup per (sequence, head), head size <= 256 (decode.py sends larger heads to the CPU). Keys come
// 256 at a time with a running maximum and sum (online softmax), so the cache length is not bounded by
// workgroup memory: a thread per key for the scores, then threads (g, d) sum probs * values over every
// groups-th key for output element d, and the groups' partials meet at the end. Loops are unrolled by four:
// independent loads in flight instead of one latency per step.
// qkv (B, 1, 3C), the caches (B, block_size, C), out = y (B, 1, C); size = B * n_head
var<workgroup> probs: array<f32, 256>;
var<workgroup> query: array<f32, 256>;
var<workgroup> cached_rows: u32;

@compute @workgroup_size(256)
fn attention_decode_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let bh = row_index(grid);
    if (bh >= params.size) { return; }  // the same for the whole workgroup, so no barrier is split
    let hs = params.head_size;
    let cols = params.cols;
    let seq = bh / params.n_head;
    let head = (bh % params.n_head) * hs;
    let kv = seq * params.block * cols + head;  // row 0 of this head in the caches
    let groups = 256u / hs;
    let g = lid / hs;
    let d = lid % hs;
    if (lid < hs) { query[lid] = qkv[seq * 3u * cols + head + lid] * params.scale; }
    if (lid == 0u) { cached_rows = min(u32(length[0]), params.block); }
    let rows = workgroupUniformLoad(&cached_rows);  // the loop below has barriers: its bound must be uniform
    var m = LOWEST;
    var total = 0.0;
    var acc = 0.0;  // this thread's share of y[d]: its group's keys
    for (var start = 0u; start < rows; start = start + 256u) {
        let j = start + lid;
        var s = LOWEST;
        if (j < rows) {
            let key = kv + j * cols;
            var dot = 0.0;
            var e = 0u;
            for (; e + 4u <= hs; e = e + 4u) {
                dot = dot + query[e] * k_cache[key + e] + query[e + 1u] * k_cache[key + e + 1u]
                          + query[e + 2u] * k_cache[key + e + 2u] + query[e + 3u] * k_cache[key + e + 3u];
            }
            for (; e < hs; e = e + 1u) { dot = dot + query[e] * k_cache[key + e]; }
            s = dot;
        }
        let m_new = max(m, workgroup_max(lid, s));
        let p = select(0.0, exp(s - m_new), j < rows);
        probs[lid] = p;
        let rescale = exp(m - m_new);
        total = total * rescale + workgroup_sum(lid, p);  // its barriers also publish probs
        acc = acc * rescale;
        if (g < groups) {
            let chunk = min(256u, rows - start);
            let value = kv + start * cols + d;
            var i = g;
            for (; i + 3u * groups < chunk; i = i + 4u * groups) {
                acc = acc + probs[i] * v_cache[value + i * cols] + probs[i + groups] * v_cache[value + (i + groups) * cols]
                          + probs[i + 2u * groups] * v_cache[value + (i + 2u * groups) * cols]
                          + probs[i + 3u * groups] * v_cache[value + (i + 3u * groups) * cols];
            }
            for (; i < chunk; i = i + groups) { acc = acc + probs[i] * v_cache[value + i * cols]; }
        }
        m = m_new;
        workgroupBarrier();  // every thread is done with probs before the next chunk overwrites it
    }
    probs[lid] = select(0.0, acc, g < groups);
    workgroupBarrier();
    if (lid < hs) {
        var y = 0.0;
        for (var t = 0u; t < groups; t = t + 1u) { y = y + probs[t * hs + lid]; }
        out[seq * cols + head + lid] = y / total;
    }
}

// One workgroup per sequence. Greedy: the first largest logit. Otherwise the top-k cutoff, the k-th largest
// logit's order-preserving bit key, found four bits at a time (8 rounds of a 16-bin histogram of the keys
// that share the bits found so far), then p = exp((logit - max) / temperature) over the kept logits, summed
// per thread over a contiguous chunk; thread 0 scans the chunk sums and picks the chunk where u * sum falls,
// and that chunk's thread walks it to the token.
// logits (B, V); size = B
var<workgroup> best_index: array<u32, 256>;
var<workgroup> chunk_sums: array<f32, 256>;
var<workgroup> chosen: vec2<u32>;  // (chunk, its first token's running sum as f32 bits)
var<workgroup> bins: array<atomic<u32>, 16>;
var<workgroup> found: vec2<u32>;  // (the cutoff's bits found so far, the rank still wanted below them)

fn order_key(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    return select(bits | 0x80000000u, ~bits, (bits >> 31u) == 1u);
}

@compute @workgroup_size(256)
fn sample_tokens_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let seq = row_index(grid);
    if (seq >= params.size) { return; }
    let vocab = params.vocab;
    let base = seq * vocab;
    let n = u32(length[0]);
    // the largest logit and its first index: per thread, then a tree that prefers the lower index on ties
    var best = LOWEST;
    var best_i = vocab;
    for (var j = lid; j < vocab; j = j + 256u) {
        if (logits[base + j] > best || best_i == vocab) { best = logits[base + j]; best_i = j; }
    }
    scratch[lid] = best;
    best_index[lid] = best_i;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let other = scratch[lid + s];
            let other_i = best_index[lid + s];
            if (other_i < vocab && (best_index[lid] == vocab || other > scratch[lid]
                                    || (other == scratch[lid] && other_i < best_index[lid]))) {
                scratch[lid] = other;
                best_index[lid] = other_i;
            }
        }
        workgroupBarrier();
    }
    let top = scratch[0];
    var token = best_index[0];
    workgroupBarrier();
    let temperature = params.temperature;
    if (temperature > 0.0) {
        var cutoff = 0u;  // the k-th largest key: top_k logits or more are at or above it
        if (params.top_k < vocab) {
            if (lid == 0u) { found = vec2<u32>(0u, params.top_k); }
            for (var shift = 28i; shift >= 0i; shift = shift - 4i) {
                if (lid < 16u) { atomicStore(&bins[lid], 0u); }
                workgroupBarrier();
                let prefix = found.x;
                let above = select(0xffffffffu << u32(shift + 4i), 0u, shift == 28i);  // the bits already found
                for (var j = lid; j < vocab; j = j + 256u) {
                    let key = order_key(logits[base + j]);
                    if ((key & above) == prefix) { atomicAdd(&bins[(key >> u32(shift)) & 15u], 1u); }
                }
                workgroupBarrier();
                if (lid == 0u) {
                    var wanted = found.y;
                    var digit = 15u;
                    loop {  // the highest digit whose keys, with the higher digits', reach the wanted rank
                        let count = atomicLoad(&bins[digit]);
                        if (wanted <= count || digit == 0u) { break; }
                        wanted = wanted - count;
                        digit = digit - 1u;
                    }
                    found = vec2<u32>(prefix | (digit << u32(shift)), wanted);
                }
                workgroupBarrier();
            }
            cutoff = found.x;
        }
        let per = (vocab + 255u) / 256u;
        let lo = min(lid * per, vocab);
        let hi = min(lo + per, vocab);
        var part = 0.0;
        for (var j = lo; j < hi; j = j + 1u) {
            if (order_key(logits[base + j]) >= cutoff) { part = part + exp((logits[base + j] - top) / temperature); }
        }
        chunk_sums[lid] = part;
        workgroupBarrier();
        if (lid == 0u) {
            let used = (vocab + per - 1u) / per;  // chunks that hold logits
            var sum = 0.0;
            for (var t = 0u; t < used; t = t + 1u) { sum = sum + chunk_sums[t]; }
            let h = pcg(pcg(pcg(n) ^ seq) ^ params.seed);
            let goal = f32(h >> 8u) * (1.0 / 16777216.0) * sum;
            var running = 0.0;
            chosen = vec2<u32>(256u, 0u);
            for (var t = 0u; t < used; t = t + 1u) {
                if (chunk_sums[t] > 0.0) {
                    chosen = vec2<u32>(t, bitcast<u32>(running));  // the last chunk with mass, unless...
                    if (running + chunk_sums[t] > goal) { break; }  // ...the goal falls in this one
                }
                running = running + chunk_sums[t];
            }
            chunk_sums[0] = goal;
        }
        workgroupBarrier();
        let goal = chunk_sums[0];
        if (lid == chosen.x) {
            var running = bitcast<f32>(chosen.y);
            for (var j = lo; j < hi; j = j + 1u) {
                if (order_key(logits[base + j]) >= cutoff) {
                    token = j;  // the last kept one, should rounding leave the goal above every sum
                    running = running + exp((logits[base + j] - top) / temperature);
                    if (running > goal) { break; }
                }
            }
        }
    }
    if ((temperature > 0.0 && lid == chosen.x) || (temperature <= 0.0 && lid == 0u)) {
        ids[seq] = i32(token);
        tokens[seq * params.ring + n % params.ring] = i32(token);
    }
}

// length[0] += step (one thread)
@compute @workgroup_size(1)
fn advance_main() {
    length[0] = length[0] + params.step;
}
