// SGD with momentum, in place, one dispatch per parameter (AdamW, the hot path, is multi_tensor.wgsl).
// Values that change every step (the learning rate) come in the small `step` buffer rather than the
// uniform, so the uniform and the bind group of each parameter stay the same from step to step.
// `scale` is the gradient-clip coefficient (1 without clipping), computed on the GPU: no host sync.
// Bindings (by name, as Python binds them): param_, grad, buf1 (the momentum buffer), params, step, scale

@group(0) @binding(0) var<storage, read_write> param_: array<f32>;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> buf1: array<f32>;

struct Params { n: u32, momentum: f32, weight_decay: f32 }
@group(0) @binding(5) var<storage, read> step: array<f32>;
@group(0) @binding(6) var<storage, read> scale: array<f32>;

// SGD with momentum. buf1 = momentum buffer; step = [lr].
@compute @workgroup_size(256)
fn sgd_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.n) { return; }
    let g = grad[i] * scale[0] + params.weight_decay * param_[i];
    let b = params.momentum * buf1[i] + g;
    buf1[i] = b;
    param_[i] = param_[i] - step[0] * b;
}
