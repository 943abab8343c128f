// Prepended by the loader to every kernel file except lesson.wgsl (which is self-contained). Each kernel
// file declares its own `struct Params` of named fields, bound at @binding(3) (params.py packs it).

// 1-D work over a 2-D grid of 256-wide workgroups, so counts above 65535 * 256 still fit one dispatch.
fn element_index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + lid;
}

// One workgroup per row, rows laid over a 2-D grid for the same reason.
fn row_index(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y * nwg.x + wg.x;
}

// Workgroup-wide reductions for the one-workgroup-per-row kernels (256 threads). Call them from uniform
// control flow only: they contain barriers.
var<workgroup> scratch: array<f32, 256>;

fn workgroup_sum(lid: u32, x: f32) -> f32 {
    scratch[lid] = x;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { scratch[lid] = scratch[lid] + scratch[lid + s]; }
        workgroupBarrier();
    }
    let total = scratch[0];
    workgroupBarrier();  // all have read the total before scratch is reused
    return total;
}

// NaN found from its bits (a compiler may fold `x != x` away), and a max that lets NaN win, as NumPy's does
// (WGSL's max leaves NaN to the implementation).
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn max_nan(x: f32, y: f32) -> f32 {
    if (is_nan(x)) { return x; }
    if (is_nan(y)) { return y; }
    return max(x, y);
}

fn workgroup_max(lid: u32, x: f32) -> f32 {
    scratch[lid] = x;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) { scratch[lid] = max_nan(scratch[lid], scratch[lid + s]); }
        workgroupBarrier();
    }
    let best = scratch[0];
    workgroupBarrier();
    return best;
}

// -inf and NaN built at run time: WGSL forbids a constant expression whose value is not finite (Tint
// rejects `bitcast<f32>(0xff800000u)`; naga lets it through), and reading a var is not a constant.
fn neg_inf() -> f32 { var bits = 0xff800000u; return bitcast<f32>(bits); }
fn nan() -> f32 { var bits = 0x7fc00000u; return bitcast<f32>(bits); }

const GELU_C: f32 = 0.7978845608028654;  // sqrt(2 / pi)

// tanh through exp overflows to inf/inf = NaN for |x| > ~44; it is +-1 to f32 precision beyond 15.
fn safe_tanh(x: f32) -> f32 { return tanh(clamp(x, -15.0, 15.0)); }

// GELU, tanh form (GPT-2's): 0.5 x (1 + tanh(u)), u = GELU_C (x + 0.044715 x^3), computed as the same function
// x sigmoid(2u) = x / (1 + exp(-2u)): one exp and a division. In big's MLP matmul epilogues WGSL's tanh cost
// 11 us a call (the forward's GELU) and 20 (the backward's gradient), the sigmoid 2 and 10 (H200, session 22).
// No clamp: where exp(-2u) overflows to inf the quotient is 0, GELU's limit. One definition for the elementwise
// op and every matmul epilogue, so the fused and the separate forms round alike.
fn gelu_sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(-2.0 * GELU_C * (x + 0.044715 * x * x * x))); }

fn gelu(x: f32) -> f32 { return x * gelu_sigmoid(x); }

// g * GELU'(x): the gradient of GELU's input from its output's, g (elementwise.wgsl and the matmul epilogue).
// With s = sigmoid(2u): GELU' = s + 2 x s (1 - s) u'.
fn gelu_grad(x: f32, g: f32) -> f32 {
    let s = gelu_sigmoid(x);
    let d_inner = GELU_C * (1.0 + 3.0 * 0.044715 * x * x);
    return g * (s + 2.0 * x * s * (1.0 - s) * d_inner);
}
