// Prepended by the loader to every kernel file except lesson.wgsl (which is self-contained).

// 1-D work over a 2-D grid of 256-wide workgroups, so counts above 65535 * 256 still fit one dispatch. `Grid`, a
// workgroup's place in it, is most entry points' first parameter, the thread's index a parameter of its own: WGSL's
// uniformity analysis takes a struct parameter as a whole, and that index would make the workgroup's non-uniform.
struct Grid {
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
}

fn element_index(grid: Grid, lid: u32) -> u32 {
    return row_index(grid) * 256u + lid;
}

// One workgroup per row, rows laid over a 2-D grid for the same reason.
fn row_index(grid: Grid) -> u32 {
    return grid.wg.y * grid.nwg.x + grid.wg.x;
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

// A counter-based hash (PCG's output function): independent bits per input, no state.
fn pcg(x: u32) -> u32 {
    let state = x * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
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
// x sigmoid(2u): one exp and a division in place of WGSL's tanh, which makes a matmul epilogue several times as
// costly (BENCHMARKS.md, "Kernel tuning notes"). Nothing in it overflows, since WGSL lets an implementation assume
// no infinities: u from x clamped to +-GELU_EDGE, beyond which sigmoid(2u) is 0 or 1 in f32, and exp of -|2u| <= 0
// only. One definition for the elementwise op and every matmul epilogue, so the fused and the separate forms
// round alike. The NumPy reference (tinynn/numpy_formulas.py's gelu_sigmoid) computes the same sigmoid, from
// IEEE infinities.
const GELU_EDGE: f32 = 12.0;

fn gelu_sigmoid(x: f32) -> f32 {
    let c = clamp(x, -GELU_EDGE, GELU_EDGE);
    let z = 2.0 * GELU_C * (c + 0.044715 * c * c * c);
    let e = exp(-abs(z));
    let r = 1.0 / (1.0 + e);
    return select(e * r, r, z >= 0.0);
}

fn gelu(x: f32) -> f32 { return x * gelu_sigmoid(x); }

// g * GELU'(x): the gradient of GELU's input from its output's, g (elementwise.wgsl and the matmul epilogue).
// With s = sigmoid(2u): GELU' = s + 2 x s (1 - s) u', x clamped in the second term (s (1 - s) is 0 beyond the
// edge), so that it is finite for every finite x.
fn gelu_grad(x: f32, g: f32) -> f32 {
    let s = gelu_sigmoid(x);
    let c = clamp(x, -GELU_EDGE, GELU_EDGE);
    let d_inner = GELU_C * (1.0 + 3.0 * 0.044715 * c * c);
    return g * (s + 2.0 * c * s * (1.0 - s) * d_inner);
}
