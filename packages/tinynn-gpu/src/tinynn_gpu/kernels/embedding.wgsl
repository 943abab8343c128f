// Embedding lookup and its gradient. The backward gives each (row v, column c) of the table one thread that
// sums the gradients of the positions whose index is v: no atomics, deterministic order.
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

// p0 = V * C, p1 = C, p2 = N
@compute @workgroup_size(256)
fn embedding_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i >= param(0u)) { return; }
    let cols = param(1u);
    let v = i32(i / cols);
    let c = i % cols;
    var acc = 0.0;
    for (var n = 0u; n < param(2u); n = n + 1u) {
        if (idx[n] == v) { acc = acc + g[n * cols + c]; }
    }
    out[i] = acc;
}
