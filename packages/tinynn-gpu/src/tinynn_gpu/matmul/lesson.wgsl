// The lesson's shader module: four compute entries sharing one set of module-level bindings.
//   matmul_main  out[B,M,N] = op(a)[B,M,K] @ op(b)[B,K,N]   bindings 0:a 1:b 2:out 3:params
//   scale_main   out[i] = a[i] * s                           bindings 0:a     2:out 3:params
//   add_main     out[i] = a[i] + b[i]                        bindings 0:a 1:b 2:out 3:params
//   relu_main    out[i] = max(a[i], 0)                       bindings 0:a     2:out 3:params
// The tile edge TILE is substituted by the loader (8, 16 or 32; 16 is the lesson's choice).
//
// Two rules the lesson learned the hard way, kept here on purpose:
// 1. The shared tiles are laid out by (lid.x, lid.y): lid.x walks output rows, lid.y output columns.
//    Laying them out by (lid.y, lid.x) silently computes the wrong product (the loss stops falling).
// 2. No thread returns before a barrier, even when its output is out of range: the dispatch is rounded up
//    to whole tiles, and a workgroupBarrier() reached by only part of a workgroup is undefined behaviour.
//    Out-of-range reads load 0 instead; only the final write is guarded.

struct Params { p0: u32, p1: u32, p2: u32, p3: u32 }  // 16 bytes; f32 values travel as bitcast bits

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const TILE: u32 = {{TILE}}u;
var<workgroup> sh_a: array<f32, {{TILE_AREA}}>;
var<workgroup> sh_b: array<f32, {{TILE_AREA}}>;

// p0 = M, p1 = N, p2 = K, p3 = flags: bit 0 a is stored transposed (K x M), bit 1 b is stored transposed
// (N x K), bit 2 b is one matrix shared by every batch (a weight).
fn load_a(batch: u32, row: u32, k: u32) -> f32 {
    let m_rows = params.p0;
    let k_dim = params.p2;
    if (row >= m_rows || k >= k_dim) { return 0.0; }
    let base = batch * m_rows * k_dim;
    if ((params.p3 & 1u) != 0u) { return a[base + k * m_rows + row]; }
    return a[base + row * k_dim + k];
}

fn load_b(batch: u32, k: u32, col: u32) -> f32 {
    let n_cols = params.p1;
    let k_dim = params.p2;
    if (k >= k_dim || col >= n_cols) { return 0.0; }
    var base = batch * k_dim * n_cols;
    if ((params.p3 & 4u) != 0u) { base = 0u; }
    if ((params.p3 & 2u) != 0u) { return b[base + col * k_dim + k]; }
    return b[base + k * n_cols + col];
}

@compute @workgroup_size({{TILE}}, {{TILE}}, 1)
fn matmul_main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = gid.x;
    let col = gid.y;
    let batch = gid.z;
    let tiles = (params.p2 + TILE - 1u) / TILE;
    var acc = 0.0;
    for (var t = 0u; t < tiles; t = t + 1u) {
        sh_a[lid.x * TILE + lid.y] = load_a(batch, row, t * TILE + lid.y);
        sh_b[lid.x * TILE + lid.y] = load_b(batch, t * TILE + lid.x, col);
        workgroupBarrier();
        for (var k = 0u; k < TILE; k = k + 1u) {
            acc = acc + sh_a[lid.x * TILE + k] * sh_b[k * TILE + lid.y];
        }
        workgroupBarrier();
    }
    if (row < params.p0 && col < params.p1) {
        out[batch * params.p0 * params.p1 + row * params.p1 + col] = acc;
    }
}

// Elementwise entries: p0 = element count; the dispatch is 2-D so that it can exceed 65535 workgroups.
fn element_index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + lid;
}

@compute @workgroup_size(256)
fn scale_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < params.p0) { out[i] = a[i] * bitcast<f32>(params.p1); }
}

@compute @workgroup_size(256)
fn add_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < params.p0) { out[i] = a[i] + b[i]; }
}

@compute @workgroup_size(256)
fn relu_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < params.p0) { out[i] = max(a[i], 0.0); }
}
