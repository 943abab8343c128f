// The positional parameter block, for the kernel files that do not yet declare their own named
// `struct Params` (context.py's POSITIONAL lists them): 32 u32 slots, f32 values passed as bitcast bits.
// Python passes these kernels a tuple of values in slot order.

struct Params { v: array<vec4<u32>, 8> }

fn param(i: u32) -> u32 { return params.v[i / 4u][i % 4u]; }
fn paramf(i: u32) -> f32 { return bitcast<f32>(param(i)); }
