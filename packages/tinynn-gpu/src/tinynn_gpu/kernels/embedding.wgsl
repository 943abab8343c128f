// Embedding lookup and its gradient. The backward gives each (chunk of positions, row v, column c) one
// thread that sums the gradients of the chunk's positions whose index is v: no atomics, a fixed order, and
// enough threads to fill the GPU; the launcher adds the chunks' partial tables.
// Bindings: 0:weight 1:idx 2:out 3:params 4:g

@group(0) @binding(0) var<storage, read> weight: array<f32>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> g: array<f32>;

// p0 = N * C, p1 = C
@compute @workgroup_size(256)
fn embedding_forward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let cols = param(1u);
    if (i < param(0u)) { out[i] = weight[u32(idx[i / cols]) * cols + i % cols]; }
}

// p0 = V * C, p1 = C, p2 = N, p3 = positions per chunk, p4 = chunks. out is (chunks, V, C).
@compute @workgroup_size(256)
fn embedding_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let table = param(0u);
    if (i >= table * param(4u)) { return; }
    let cols = param(1u);
    let chunk = i / table;
    let v = i32((i % table) / cols);
    let c = i % cols;
    let start = chunk * param(3u);
    let stop = min(start + param(3u), param(2u));
    var acc = 0.0;
    for (var n = start; n < stop; n = n + 1u) {
        if (idx[n] == v) { acc = acc + g[n * cols + c]; }
    }
    out[i] = acc;
}
