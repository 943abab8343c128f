// Multi-tensor optimizer kernels: one dispatch covers up to SLOTS parameters (64 where the device has
// the storage bindings: a GPT's whole AdamW update is then one dispatch), instead of one dispatch per
// parameter (each costs the GPU a few microseconds however small it is). multi_tensor.py fills in the {{...}}.
//
// Each tensor is cut into chunks of `chunk` elements, one workgroup per chunk. `table` gives each workgroup
// its slot, and each slot its first workgroup and size: two loads, the same for all the workgroup's
// threads (a scan over the slots would put a chain of dependent loads in front of every chunk). A switch
// then picks that slot's bindings: WGSL cannot index bindings or pass storage pointers to functions, so
// every slot has its own binding set and its own copy of the loop. Inside a chunk neighbouring threads
// take neighbouring elements: every load and store is coalesced.
//
// Bindings: step, scale, partials, params, table, then per slot i: param_i, grad_i, m_i, v_i
// (sum_squares_main binds only the grads, so it may have more slots: those past AdamW's declare only a grad).

struct Params {
    chunk: u32, workgroups: u32,
    first_partial: u32,  // sum_squares_main: where this group's partials start
    beta1: f32, beta2: f32, eps: f32,  // adamw_main
}

@group(0) @binding(0) var<storage, read> step: array<f32>;  // [lr, 1 - beta1^t, 1 - beta2^t]
@group(0) @binding(1) var<storage, read> scale: array<f32>;  // [gradient-clip coefficient]
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;
// table: [w] = workgroup w's slot (w < workgroups), then per slot i: [workgroups + 3i] its first workgroup,
// [workgroups + 3i + 1] its size, [workgroups + 3i + 2] its weight decay's bits (parameter groups that
// differ only in weight decay, nanoGPT's two, share a dispatch)
@group(0) @binding(4) var<storage, read> table: array<u32>;
{{BINDINGS}}

{{GROUP_SUM}}

// AdamW with decoupled weight decay on elements [lo, hi) of one slot's tensors
{{ADAMW_FUNCTIONS}}

// The sum of squares of elements [lo, hi) of one slot's gradient, four loads in flight per thread
{{SQUARES_FUNCTIONS}}

struct Work { slot: u32, lo: u32, hi: u32, weight_decay: f32 }

fn find_work(w: u32) -> Work {
    let slot = table[w];
    let entry = params.workgroups + 3u * slot;
    let lo = (w - table[entry]) * params.chunk;
    return Work(slot, lo, min(lo + params.chunk, table[entry + 1u]), bitcast<f32>(table[entry + 2u]));
}

@compute @workgroup_size(256)
fn adamw_main(grid: Grid, lanes: Lanes) {
    let w = row_index(grid);
    if (w >= params.workgroups) { return; }
    let work = find_work(w);
    switch work.slot {
{{ADAMW_CASES}}
        default: {}
    }
}

// Each workgroup leaves the sum of squares of its chunk in partials[first + workgroup].
@compute @workgroup_size(256)
fn sum_squares_main(grid: Grid, lanes: Lanes) {
    let w = row_index(grid);
    var s = 0.0;
    if (w < params.workgroups) {
        let work = find_work(w);
        switch work.slot {
{{SQUARES_CASES}}
            default: {}
        }
    }
    s = group_sum(lanes, s);
    if (lanes.lid == 0u && w < params.workgroups) { partials[params.first_partial + w] = s; }
}
