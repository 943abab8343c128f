// Multi-tensor optimizer kernels: one dispatch covers up to SLOTS parameters (64 where the device has
// the storage bindings: a GPT's whole AdamW update is one dispatch on an H200), instead of one dispatch
// per parameter (each costs the GPU ~5 us however small it is). The tensors are laid end to end in one
// index space: slot i covers [ends[i-1], ends[i]). WGSL cannot index bindings or pass storage pointers to
// functions, so multi_tensor.py writes one binding set and one unrolled branch per slot ({{...}} below).
// Bindings: 0:step 1:scale 2:partials 3:params 4:ends, then per slot i: 5+4i:param 6+4i:grad 7+4i:m 8+4i:v.
// p0 = total elements, p1 = beta1, p2 = beta2, p3 = eps, p4 = weight decay, p5 = first partials slot.

@group(0) @binding(0) var<storage, read> step: array<f32>;  // [lr, 1 - beta1^t, 1 - beta2^t]
@group(0) @binding(1) var<storage, read> scale: array<f32>;  // [gradient-clip coefficient]
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> ends: array<u32>;
{{BINDINGS}}

// AdamW with decoupled weight decay on element j of one slot's tensors
{{ADAMW_FUNCTIONS}}

@compute @workgroup_size(256)
fn adamw_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let e = element_index(wg, nwg, lid);
    if (e >= param(0u)) { return; }
{{ADAMW_SELECT}}
}

// Each workgroup adds the squares of a strided share of all slots' gradients into its partials slot.
@compute @workgroup_size(256)
fn sum_squares_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    var s = 0.0;
    for (var e = wg.x * 256u + lid; e < param(0u); e = e + nwg.x * 256u) {
{{SQUARES_SELECT}}
    }
    s = workgroup_sum(lid, s);
    if (lid == 0u) { partials[param(5u) + wg.x] = s; }
}
