// Row teams for the kernels that give each row to a few threads (layernorm.wgsl, cross_entropy.wgsl): each
// subgroup is a team, and row_sum (row_max) adds (compares) a value over its team with one subgroup
// operation, no barrier. Built on the subgroup builtins (subgroup_id, num_subgroups), so nothing is assumed
// about which invocations form a subgroup or how wide it is (32 on NVIDIA, 64 on some AMD, 4 to 32
// elsewhere). row_sum_workgroup.wgsl is the same for adapters without the `subgroup` feature; both come
// after row_teams.wgsl.

struct Lanes {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) team: u32,
    @builtin(num_subgroups) teams: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) width: u32,
}

fn team_of(lanes: Lanes) -> Team { return Team(lanes.lid, lanes.team, lanes.teams, lanes.lane, lanes.width); }

var<workgroup> team_count: u32;

// How many of a workgroup's ROWS each team takes (the last ones may run past them). The team count goes
// through workgroup memory: read back by workgroupUniformLoad it is uniform to WGSL's uniformity analysis,
// which the subgroup operations in the loop over rows need; `team` (which holds the lane index) is not.
// Call it once, from uniform control flow (it holds a barrier).
fn team_rows(team: Team) -> u32 {
    if (team.lid == 0u) { team_count = team.count; }
    let count = workgroupUniformLoad(&team_count);
    return (ROWS + count - 1u) / count;
}

// The sum over the team, every lane getting it: two values at once (LayerNorm's backward needs two per row)
fn row_sum(team: Team, x: vec2<f32>) -> vec2<f32> { return subgroupAdd(x); }

// The maximum over the team; which of a NaN and a number wins is left to the implementation
fn row_max(team: Team, x: f32) -> f32 { return subgroupMax(x); }
