// Elementwise kernels, named like the NumPy backend's ops (unary, unary_backward, binary, scalar, ...).
// An op code picks the formula, so one pipeline serves every op of a family; the switch costs far less
// than the memory traffic. elementwise.py refuses an unknown op before dispatch (`code`); here an unknown code
// writes NaN (or INT_SENTINEL) rather than computing another op.
// Bindings: a, b, out, params, c, and for the int32 kernels a_int, b_int, out_int.

struct Params {
    n: u32,                          // elements
    op: u32,                         // op code
    ndim: u32,                       // binary: dims after merging (<= 6)
    t_q: u32,                        // causal_fill: queries and keys over the last two axes
    t_k: u32,
    seed: u32,                       // dropout_mask
    threshold: u32,                  // dropout_mask: drop where the hash is below p * 2^32
    value: f32,                      // the scalar operand; fill and causal_fill's value; dropout's 1 / (1 - p)
    int_value: i32,                  // the int32 kernels' scalar operand
    shape: array<vec4<u32>, 2>,      // binary: the output shape, then each input's strides (0: broadcast)
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> c: array<f32>;
@group(0) @binding(5) var<storage, read> a_int: array<i32>;
@group(0) @binding(6) var<storage, read> b_int: array<i32>;
@group(0) @binding(7) var<storage, read_write> out_int: array<i32>;

const INT_SENTINEL: i32 = -2147483647 - 1;

// Unary op codes: 0 neg, 1 exp, 2 log, 3 tanh, 4 relu, 5 gelu (tanh form).
fn unary_op(op: u32, x: f32) -> f32 {
    switch op {
        case 0u: { return -x; }
        case 1u: { return exp(x); }
        case 2u: { return log(x); }
        case 3u: { return safe_tanh(x); }
        case 4u: { return max(x, 0.0); }
        case 5u: { return gelu(x); }
        default: { return nan(); }
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
        case 5u: { return gelu_grad(x, g); }
        default: { return nan(); }
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

@compute @workgroup_size(256)
fn unary_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) { out[i] = unary_op(params.op, a[i]); }
}

// a = x, b = y, c = g
@compute @workgroup_size(256)
fn unary_backward_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) { out[i] = unary_grad(params.op, a[i], b[i], c[i]); }
}

// Int32 unary op codes: 0 neg, 4 relu (the float codes' numbers).
@compute @workgroup_size(256)
fn unary_int_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.n) { return; }
    switch params.op {
        case 0u: { out_int[i] = -a_int[i]; }
        case 4u: { out_int[i] = max(a_int[i], 0); }
        default: { out_int[i] = INT_SENTINEL; }
    }
}

fn shape_at(d: u32) -> u32 { return params.shape[d / 4u][d % 4u]; }
fn a_stride(d: u32) -> u32 { return params.a_strides[d / 4u][d % 4u]; }
fn b_stride(d: u32) -> u32 { return params.b_strides[d / 4u][d % 4u]; }

// The elements of a and b that output element i reads, under broadcasting.
fn broadcast_indices(i: u32) -> vec2<u32> {
    var rest = i;
    var ia = 0u;
    var ib = 0u;
    for (var d = params.ndim; d > 0u; d = d - 1u) {
        let size = shape_at(d - 1u);
        let coord = rest % size;
        rest = rest / size;
        ia = ia + coord * a_stride(d - 1u);
        ib = ib + coord * b_stride(d - 1u);
    }
    return vec2<u32>(ia, ib);
}

// Broadcasting binary op codes: 0 add, 1 sub, 2 mul, 3 div, 4 eq.
fn binary_op(op: u32, x: f32, y: f32) -> f32 {
    switch op {
        case 0u: { return x + y; }
        case 1u: { return x - y; }
        case 2u: { return x * y; }
        case 3u: { return x / y; }
        case 4u: { return select(0.0, 1.0, x == y); }
        default: { return nan(); }
    }
}

// int32's: 0 add, 1 sub, 2 mul (wrapping, as WGSL's i32 does), 4 eq; 3 (no integer division here) and unknown
// codes give INT_SENTINEL. Integer results cost next to nothing, so all are made and one is picked.
fn binary_int_op(op: u32, x: i32, y: i32) -> i32 {
    var results = array<i32, 5>(x + y, x - y, x * y, INT_SENTINEL, select(0, 1, x == y));
    return select(INT_SENTINEL, results[min(op, 4u)], op <= 4u);
}

@compute @workgroup_size(256)
fn binary_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) { let at = broadcast_indices(i); out[i] = binary_op(params.op, a[at.x], b[at.y]); }
}

@compute @workgroup_size(256)
fn binary_int_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) {
        let at = broadcast_indices(i);
        out_int[i] = binary_int_op(params.op, a_int[at.x], b_int[at.y]);
    }
}

// a op value: 0 add, 1 mul, 2 pow
@compute @workgroup_size(256)
fn scalar_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.n) { return; }
    let s = params.value;
    switch params.op {
        case 0u: { out[i] = a[i] + s; }
        case 1u: { out[i] = a[i] * s; }
        case 2u: { out[i] = power(a[i], s); }
        default: { out[i] = nan(); }
    }
}

// a op int_value on int32: 0 add, 1 mul
@compute @workgroup_size(256)
fn scalar_int_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.n) { return; }
    switch params.op {
        case 0u: { out_int[i] = a_int[i] + params.int_value; }
        case 1u: { out_int[i] = a_int[i] * params.int_value; }
        default: { out_int[i] = INT_SENTINEL; }
    }
}

@compute @workgroup_size(256)
fn fill_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) { out[i] = params.value; }
}

// Over the last two axes (T_q, T_k): keys after each query become `value`.
@compute @workgroup_size(256)
fn causal_fill_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i >= params.n) { return; }
    let key = i % params.t_k;
    let query = (i / params.t_k) % params.t_q;
    out[i] = select(a[i], params.value, key > query + params.t_k - params.t_q);
}

@compute @workgroup_size(256)
fn dropout_mask_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) { out[i] = select(params.value, 0.0, pcg(i ^ pcg(params.seed)) < params.threshold); }
}
