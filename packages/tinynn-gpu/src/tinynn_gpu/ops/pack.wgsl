// pack and unpack: up to SLOTS arrays copied into one flat array, laid end to end, or back out of it, in
// one dispatch (data-parallel training reads every gradient back, and writes their sum, as one buffer).
// Slot i covers flat[first + ends[i-1], first + ends[i]): a binary search over ends finds an element's slot.
// WGSL cannot index bindings, so pack.py writes one binding and one switch case per slot ({{...}} below; a
// switch, since Tint refuses an if-else chain longer than 127), and the access of each side: pack reads the
// slots and writes flat, unpack the reverse. Words are copied as u32, so any 32-bit dtype moves bit for bit.
// Bindings: flat, params, ends, and slot_i for each slot i.

struct Params {
    count: u32,  // elements in this group's slots
    first: u32,  // where the group starts in flat
}

@group(0) @binding(2) var<storage, {{FLAT_ACCESS}}> flat: array<u32>;
@group(0) @binding(4) var<storage, read> ends: array<u32>;
{{BINDINGS}}

@compute @workgroup_size(256)
fn {{OP}}_main(grid: Grid, @builtin(local_invocation_index) lid: u32) {
    let e = element_index(grid, lid);
    if (e >= params.count) { return; }
    let o = params.first + e;
    var lo = 0u;  // the first slot whose end lies past e (unused slots repeat the last end)
    var hi = {{SLOTS}}u - 1u;
    while (lo < hi) {
        let mid = (lo + hi) / 2u;
        if (e < ends[mid]) { hi = mid; } else { lo = mid + 1u; }
    }
    var start = 0u;
    if (lo > 0u) { start = ends[lo - 1u]; }
    switch lo {
{{CASES}}
        default: {}
    }
}
