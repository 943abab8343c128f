// A matmul's epilogue and split-K finish, shared by the register-blocked kernel (blocked.wgsl) and the
// tensor-core kernel (tensor.wgsl): the generators (epilogue.py) write this file's first part once into a module
// and its `problem` part once per problem, with {{P}} the problem's names' suffix ("" or a pair's "2").
//
// Epilogue, applied to each result as it is stored (flags in params):
//   has_bias:     + bias[n] (a linear layer)
//   activation:   1 = GELU (tanh form); the value before it is written to `pre`, which its backward needs
//   has_residual: + residual[i] last (the residual connection of a transformer block)
//   activation_grad: 1 = times GELU's derivative at pre[i], first (the backward: a matmul computing the
//                 gradient of a GELU's output stores its input's gradient instead)
//   row_sums:     sum over k of op(a)[m, k] into row_sums[batch, m] (the bias gradient of a weight gradient),
//                 written by the blocked kernel's product code, and for the tensor-core kernel by its scales
//                 pass (scales.wgsl)
// Split-K: with `splits` > 1 each split stores its raw sums into its own slice of `parts`, and
// matmul_finish_main adds the slices into the real output and applies the epilogue.

// The epilogue's element: 4 neighbouring columns of a row (a vec4) where the module stores quads, else one float.
alias Value = {{VALUE}};
const WIDTH: u32 = {{WIDTH}}u;  // floats in a Value

struct Params {
    m: u32, n: u32, k: u32, shared_b: u32, splits: u32, k_chunk: u32, has_bias: u32, activation: u32,
    has_residual: u32, row_sums: u32, batch: u32, y_offset: u32, z_offset: u32, activation_grad: u32,
}

@group(0) @binding(4) var<storage, read> bias: array<Value>;
@group(0) @binding(5) var<storage, read> residual: array<Value>;
@group(0) @binding(6) var<storage, read_write> pre: array<Value>;
@group(0) @binding(7) var<storage, read_write> row_sums: array<f32>;

// common.wgsl's GELU and its gradient on a Value, float by float
fn gelu_value(x: Value) -> Value { return {{GELU_VALUE}}; }
fn gelu_grad_value(x: Value, g: Value) -> Value { return {{GELU_GRAD_VALUE}}; }

// Split-K: out[b, i] = epilogue(sum over splits of parts[b, split, i]), i a Value; row sums likewise (a thread
// per row too: a matrix has at least as many Values as rows). A pair's splits finish in matmul_pair_finish_main.
@compute @workgroup_size(256)
fn matmul_finish_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    finish_split((wg.y * nwg.x + wg.x) * 256u + lid);
}
//:: problem
// Problem {{P}}: a {{A_LAYOUT}}, b {{B_LAYOUT}}, {{LOADS}}{{ALIGNED}}.
@group(0) @binding({{A_BINDING}}) var<storage, read> a{{P}}: array<{{ELEMENT}}>;
@group(0) @binding({{B_BINDING}}) var<storage, read> b{{P}}: array<{{ELEMENT}}>;
@group(0) @binding({{OUT_BINDING}}) var<storage, read_write> out{{P}}: array<Value>;
@group(0) @binding({{PARAMS_BINDING}}) var<uniform> params{{P}}: Params;
@group(0) @binding({{PARTS_BINDING}}) var<storage, read> parts{{P}}: array<Value>;  // split-K: the splits' slices
@group(0) @binding({{ROW_PARTS_BINDING}}) var<storage, read> row_parts{{P}}: array<f32>;  // and their row sums

fn load_a{{P}}(base: u32, m: u32, k: u32, k_end: u32) -> {{ELEMENT}} {
{{A_GUARD}}
    return a{{P}}[({{A_INDEX}}){{QUAD}}];
}

fn load_b{{P}}(base: u32, k: u32, n: u32, k_end: u32) -> {{ELEMENT}} {
{{B_GUARD}}
    return b{{P}}[({{B_INDEX}}){{QUAD}}];
}

// The epilogue for out[i] (a Value), whose first column is n and whose matmul sum is v.
fn finish{{P}}(i: u32, n: u32, v: Value) -> Value {
    var y = v;
    if (params{{P}}.activation_grad == 1u) { y = gelu_grad_value(pre[i], y); }
    if (params{{P}}.has_bias == 1u) { y = y + bias[n / WIDTH]; }
    if (params{{P}}.activation == 1u) {
        pre[i] = y;
        y = gelu_value(y);
    }
    if (params{{P}}.has_residual == 1u) { y = y + residual[i]; }
    return y;
}

// Split-K's finish of Value i (of batch x m x n / WIDTH; nothing past them): the splits' slices added in order, the
// epilogue applied; a thread i < batch x m also adds up row i's sums.
fn finish_split{{P}}(i: u32) {
    let mn = params{{P}}.m * params{{P}}.n / WIDTH;  // Values in a matrix
    if (i >= params{{P}}.batch * mn) { return; }
    let batch = i / mn;
    let j = i % mn;
    var s = Value(0.0);
    for (var split = 0u; split < params{{P}}.splits; split = split + 1u) {
        s = s + parts{{P}}[(batch * params{{P}}.splits + split) * mn + j];
    }
    out{{P}}[i] = finish{{P}}(i, j * WIDTH % params{{P}}.n, s);
    if (params{{P}}.row_sums == 1u && i < params{{P}}.batch * params{{P}}.m) {
        let rb = i / params{{P}}.m;
        var r = 0.0;
        for (var split = 0u; split < params{{P}}.splits; split = split + 1u) {
            r = r + row_parts{{P}}[(rb * params{{P}}.splits + split) * params{{P}}.m + i % params{{P}}.m];
        }
        row_sums[i] = r;
    }
}

fn store_value{{P}}(i: u32, n: u32, v: Value, raw: bool) {
    if (n >= params{{P}}.n) { return; }
    if (raw) {
        out{{P}}[i] = v;
    } else {
        out{{P}}[i] = finish{{P}}(i, n, v);
    }
}

// Row m's results in columns n..n+3 (n a multiple of 4): one Value, or four.
fn store{{P}}(base: u32, m: u32, n: u32, acc: vec4<f32>, raw: bool) {
    if (m >= params{{P}}.m) { return; }
    let i = base + m * params{{P}}.n + n;
{{STORE_VALUES}}
}

