// The global gradient norm for clipping, without leaving the GPU: multi_tensor.wgsl's sum_squares_main
// leaves per-workgroup sums of squares in `partials`; here one workgroup adds them and takes the square
// root, and one thread turns that into the clip coefficient min(1, max_norm / (norm + 1e-6)).
// Bindings: 0:a 2:out 3:params

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

struct Params { count: u32, max_norm: f32 }

// a = partials (count of them). out = [norm]
@compute @workgroup_size(256)
fn norm_finish_main(@builtin(local_invocation_index) lid: u32) {
    var s = vec4<f32>(0.0);  // four independent loads in flight per thread
    var i = lid;
    for (; i + 768u < params.count; i = i + 1024u) {
        s = s + vec4<f32>(a[i], a[i + 256u], a[i + 512u], a[i + 768u]);
    }
    for (; i < params.count; i = i + 256u) { s.x = s.x + a[i]; }
    let total = workgroup_sum(lid, (s.x + s.y) + (s.z + s.w));
    if (lid == 0u) { out[0] = sqrt(total); }
}

// a = [norm]. out = [coefficient]
@compute @workgroup_size(1)
fn clip_coefficient_main() {
    out[0] = min(1.0, params.max_norm / (a[0] + 1e-6));
}
