// Layout kernels: every permute, broadcast, basic slice and concatenation is a copy between a contiguous
// array and a strided view of another (shape, strides, offset), up to 6 dims after merging.
// Bindings: 0:src 2:dst 3:params.
// p0 = n (elements of the view), p1 = ndim, p2 = view offset, p3..p8 = view shape, p9..p14 = view strides

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

fn view_offset(i: u32) -> u32 {
    var rest = i;
    var offset = param(2u);
    for (var d = param(1u); d > 0u; d = d - 1u) {
        let size = param(2u + d);
        offset = offset + (rest % size) * param(8u + d);
        rest = rest / size;
    }
    return offset;
}

// dst (contiguous) <- the view of src
@compute @workgroup_size(256)
fn gather_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < param(0u)) { dst[i] = src[view_offset(i)]; }
}

// the view of dst <- src (contiguous); the view never repeats an element, so plain stores suffice
@compute @workgroup_size(256)
fn scatter_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < param(0u)) { dst[view_offset(i)] = src[i]; }
}
