// The global gradient norm, and the clip coefficient, without leaving the GPU: multi_tensor.wgsl's
// sum_squares_main leaves per-workgroup sums of squares in `partials`; here one workgroup adds them, takes
// the square root and, where `clip` is set, turns it into min(1, max_norm / (norm + 1e-6)).
// Bindings: partials, norm, params, coefficient

@group(0) @binding(0) var<storage, read> partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> norm: array<f32>;
@group(0) @binding(4) var<storage, read_write> coefficient: array<f32>;

struct Params { count: u32, clip: u32, max_norm: f32 }

@compute @workgroup_size(256)
fn norm_finish_main(@builtin(local_invocation_index) lid: u32) {
    var s = vec4<f32>(0.0);  // four independent loads in flight per thread
    var i = lid;
    for (; i + 768u < params.count; i = i + 1024u) {
        s = s + vec4<f32>(partials[i], partials[i + 256u], partials[i + 512u], partials[i + 768u]);
    }
    for (; i < params.count; i = i + 256u) { s.x = s.x + partials[i]; }
    let total = workgroup_sum(lid, (s.x + s.y) + (s.z + s.w));
    if (lid == 0u) {
        let n = sqrt(total);
        norm[0] = n;
        if (params.clip == 1u) { coefficient[0] = min(1.0, params.max_norm / (n + 1e-6)); }
    }
}
