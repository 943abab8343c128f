// Layout kernels: every permute, broadcast, basic slice and concatenation is a copy between a contiguous
// array and a strided view of another (shape, strides, offset), up to 6 dims after merging. The copies
// move 32-bit words, never reading them as floats, so float32 and int32 arrays come out bit for bit.
// Strides are signed: a slice with a negative step walks back from its first element.
// Bindings: src, dst, params.

struct Params {
    n: u32,                          // elements of the view
    ndim: u32,
    offset: u32,                     // the view's first element
    shape: array<vec4<u32>, 2>,      // the view's shape and strides (elements), 6 used
    strides: array<vec4<i32>, 2>,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

fn view_offset(i: u32) -> u32 {
    var rest = i;
    var offset = i32(params.offset);  // a binding holds under 2^32 bytes: offsets of 4-byte words fit an i32
    for (var d = params.ndim; d > 0u; d = d - 1u) {
        let size = params.shape[(d - 1u) / 4u][(d - 1u) % 4u];
        offset = offset + i32(rest % size) * params.strides[(d - 1u) / 4u][(d - 1u) % 4u];
        rest = rest / size;
    }
    return u32(offset);
}

// dst (contiguous) <- the view of src
@compute @workgroup_size(256)
fn gather_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) { dst[i] = src[view_offset(i)]; }
}

// the view of dst <- src (contiguous); the view never repeats an element, so plain stores suffice
@compute @workgroup_size(256)
fn scatter_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let i = element_index(grid, lid);
    if (i < params.n) { dst[view_offset(i)] = src[i]; }
}
