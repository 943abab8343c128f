// group_sum(lanes, x): the sum of x over a 256-thread workgroup, every thread getting it, from subgroup
// operations (two barriers instead of eight). Each subgroup adds its values; its first lane leaves the sum
// in its own slot of a zeroed scratch; then every subgroup adds up the whole scratch, lane-strided. No
// assumption about which threads form a subgroup, and the same order of additions in every subgroup, so
// every thread gets the same total. Call it from uniform control flow. group_sum_workgroup.wgsl is the
// fallback for devices without the `subgroup` feature.

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) width: u32,
}

var<workgroup> sum_scratch: array<f32, 256>;

fn group_sum(lanes: Lanes, x: f32) -> f32 {
    let own = subgroupAdd(x);
    sum_scratch[lanes.lid] = select(0.0, own, lanes.lane == 0u);
    workgroupBarrier();
    var part = 0.0;
    for (var i = lanes.lane; i < 256u; i = i + lanes.width) { part = part + sum_scratch[i]; }
    let total = subgroupAdd(part);
    workgroupBarrier();  // all have read the scratch before it is reused
    return total;
}
