// Elementwise kernels, named like the NumPy backend's ops (unary, unary_backward, binary, scalar, ...).
// An op code picks the formula, so one pipeline serves every op of a family; the switch costs far less
// than the memory traffic. Bindings: 0:a 1:b 2:out 3:params 4:c.

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> c: array<f32>;

const GELU_C: f32 = 0.7978845608028654;  // sqrt(2 / pi)

// tanh through exp overflows to inf/inf = NaN for |x| > ~44; it is +-1 to f32 precision beyond 15.
fn safe_tanh(x: f32) -> f32 { return tanh(clamp(x, -15.0, 15.0)); }

// Unary op codes: 0 neg, 1 exp, 2 log, 3 tanh, 4 relu, 5 gelu (tanh form).
fn unary_op(op: u32, x: f32) -> f32 {
    switch op {
        case 0u: { return -x; }
        case 1u: { return exp(x); }
        case 2u: { return log(x); }
        case 3u: { return safe_tanh(x); }
        case 4u: { return max(x, 0.0); }
        default: { return 0.5 * x * (1.0 + safe_tanh(GELU_C * (x + 0.044715 * x * x * x))); }
    }
}

// Gradient of y = unary_op(x), given x, y and the output gradient g.
fn unary_grad(op: u32, x: f32, y: f32, g: f32) -> f32 {
    switch op {
        case 0u: { return -g; }
        case 1u: { return g * y; }
        case 2u: { return g / x; }
        case 3u: { return g * (1.0 - y * y); }
        case 4u: { return select(0.0, g, x > 0.0); }
        default: {
            let t = safe_tanh(GELU_C * (x + 0.044715 * x * x * x));
            let d_inner = GELU_C * (1.0 + 3.0 * 0.044715 * x * x);
            return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner);
        }
    }
}

// x ** s with NumPy's meaning for negative x and integer s (WGSL's pow is undefined for x < 0).
fn power(x: f32, s: f32) -> f32 {
    if (s == 1.0) { return x; }
    if (s == 2.0) { return x * x; }
    if (s == -1.0) { return 1.0 / x; }
    if (s == 0.5) { return sqrt(x); }
    let r = pow(abs(x), s);
    if (x < 0.0) {
        if (fract(s) != 0.0) { return nan(); }  // NaN, as NumPy gives
        if (fract(s * 0.5) != 0.0) { return -r; }
    }
    return r;
}

// p0 = n, p1 = op
@compute @workgroup_size(256)
fn unary_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < param(0u)) { out[i] = unary_op(param(1u), a[i]); }
}

// a = x, b = y, c = g; p0 = n, p1 = op
@compute @workgroup_size(256)
fn unary_backward_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < param(0u)) { out[i] = unary_grad(param(1u), a[i], b[i], c[i]); }
}

// Broadcasting binary op. p0 = n, p1 = op (0 add, 1 sub, 2 mul, 3 div, 4 eq), p2 = ndim (<= 6),
// p3..p8 = output shape, p9..p14 = a's strides, p15..p20 = b's strides (0 along broadcast dims).
@compute @workgroup_size(256)
fn binary_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i >= param(0u)) { return; }
    var rest = i;
    var ia = 0u;
    var ib = 0u;
    for (var d = param(2u); d > 0u; d = d - 1u) {
        let size = param(2u + d);
        let coord = rest % size;
        rest = rest / size;
        ia = ia + coord * param(8u + d);
        ib = ib + coord * param(14u + d);
    }
    let x = a[ia];
    let y = b[ib];
    switch param(1u) {
        case 0u: { out[i] = x + y; }
        case 1u: { out[i] = x - y; }
        case 2u: { out[i] = x * y; }
        case 3u: { out[i] = x / y; }
        default: { out[i] = select(0.0, 1.0, x == y); }
    }
}

// p0 = n, p1 = op (0 add, 1 mul, 2 pow), p2 = the scalar's bits
@compute @workgroup_size(256)
fn scalar_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i >= param(0u)) { return; }
    let s = paramf(2u);
    switch param(1u) {
        case 0u: { out[i] = a[i] + s; }
        case 1u: { out[i] = a[i] * s; }
        default: { out[i] = power(a[i], s); }
    }
}

// p0 = n, p1 = the value's bits
@compute @workgroup_size(256)
fn fill_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < param(0u)) { out[i] = paramf(1u); }
}

// Over the last two axes (T_q, T_k): keys after each query become `value`.
// p0 = n, p1 = T_q, p2 = T_k, p3 = value bits
@compute @workgroup_size(256)
fn causal_fill_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i >= param(0u)) { return; }
    let t_k = param(2u);
    let key = i % t_k;
    let query = (i / t_k) % param(1u);
    out[i] = select(a[i], paramf(3u), key > query + t_k - param(1u));
}

// A counter-based hash (PCG output function): independent bits per (element, seed), no state.
fn hash(x: u32) -> u32 {
    let s = x * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

// p0 = n, p1 = seed, p2 = drop threshold (p * 2^32), p3 = bits of 1 / (1 - p)
@compute @workgroup_size(256)
fn dropout_mask_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < param(0u)) { out[i] = select(paramf(3u), 0.0, hash(i ^ hash(param(1u))) < param(2u)); }
}
