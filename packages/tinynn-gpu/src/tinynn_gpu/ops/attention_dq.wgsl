// What both tiled attention backwards share (attention_backward_tiled.wgsl, attention_tensor_backward.wgsl; each
// declares HS4 and KEYS): dQ's per-key-block slices, where a slice holds a query row, and the kernel that adds a
// row's slices up.

@group(0) @binding(6) var<storage, read_write> part: array<vec4<f32>>;

// Where key block kb's slice of part holds query row i (i >= kb * KEYS).
fn part_row(bh: u32, kb: u32, i: u32) -> u32 {
    let blocks = (params.seq + KEYS - 1u) / KEYS;
    let per_head = blocks * params.seq - KEYS * (blocks * (blocks - 1u) / 2u);
    return bh * per_head + kb * params.seq - KEYS * (kb * (kb - 1u) / 2u) + i - kb * KEYS;
}

// dQ = scale * the sum of a query's slices, in key-block order: a thread a vec4, (batch, head) in wg.y.
@compute @workgroup_size(256)
fn attention_backward_q_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let hd = head(grid.wg.y);
    let e = grid.wg.x * 256u + lid;
    let i = e / HS4;
    let c = e % HS4;
    if (i >= params.seq) { return; }
    var s = vec4<f32>(0.0);
    for (var kb = 0u; kb <= i / KEYS; kb = kb + 1u) { s = s + part[part_row(hd.bh, kb, i) * HS4 + c]; }
    out[hd.qkv + i * 3u * params.n_head * HS4 + c] = params.scale * s;
}
