// group_sum(lanes, x): the sum of x over a 256-thread workgroup, every thread getting it; a tree in
// workgroup memory (eight barrier rounds), for devices without subgroup operations. Call it from uniform
// control flow. group_sum_subgroup.wgsl is the same function with subgroup operations.

struct Lanes { @builtin(local_invocation_index) lid: u32 }

var<workgroup> sum_scratch: array<f32, 256>;

fn group_sum(lanes: Lanes, x: f32) -> f32 {
    sum_scratch[lanes.lid] = x;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lanes.lid < s) { sum_scratch[lanes.lid] = sum_scratch[lanes.lid] + sum_scratch[lanes.lid + s]; }
        workgroupBarrier();
    }
    let total = sum_scratch[0];
    workgroupBarrier();  // all have read the total before the scratch is reused
    return total;
}
