// The global gradient norm for clipping, without leaving the GPU: multi_tensor.wgsl's sum_squares_main
// leaves per-workgroup sums of squares in `partials`; here one workgroup adds them and takes the square
// root, and one thread turns that into the clip coefficient min(1, max_norm / (norm + 1e-6)).
// Bindings: 0:a 2:out 3:params

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

// a = partials; p0 = slots. out = [norm]
@compute @workgroup_size(256)
fn norm_finish_main(@builtin(local_invocation_index) lid: u32) {
    var s = 0.0;
    for (var i = lid; i < param(0u); i = i + 256u) { s = s + a[i]; }
    s = workgroup_sum(lid, s);
    if (lid == 0u) { out[0] = sqrt(s); }
}

// a = [norm]; p0 = max_norm bits. out = [coefficient]
@compute @workgroup_size(1)
fn clip_coefficient_main() {
    out[0] = min(1.0, paramf(0u) / (a[0] + 1e-6));
}
