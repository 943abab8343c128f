// Reduction over the middle axis of a (outer, R, inner) view: any set of adjacent axes reduces this way.
// Each thread folds one chunk of R for one (outer, inner) pair; a long R is split into chunks and the
// partial results are reduced again by a second dispatch of the same kernel.
// Bindings: 0:a 2:out 3:params. p0 = outer, p1 = R, p2 = inner, p3 = op (0 sum, 1 max),
// p4 = chunk length, p5 = chunk count. out is (outer, chunks, inner).

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(256)
fn reduce_main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    let inner = param(2u);
    let chunks = param(5u);
    if (i >= param(0u) * chunks * inner) { return; }
    let o = i / (chunks * inner);
    let ch = (i / inner) % chunks;
    let j = i % inner;
    let r_len = param(1u);
    let start = ch * param(4u);
    let stop = min(start + param(4u), r_len);
    let is_max = param(3u) == 1u;
    var acc = select(0.0, neg_inf(), is_max);  // 0 or -inf
    for (var r = start; r < stop; r = r + 1u) {
        let x = a[(o * r_len + r) * inner + j];
        if (!is_max) {
            acc = acc + x;
        } else if (x != x) {
            acc = x;  // NaN wins, as in NumPy
            break;
        } else {
            acc = max(acc, x);
        }
    }
    out[i] = acc;
}
