// Row teams without subgroup operations: teams of TEAM_WIDTH consecutive threads (256 / 32 = 8 per workgroup),
// row_sum (row_max) adding (comparing) over a team through a tree in workgroup memory (five barrier rounds).
// Every thread of the workgroup must call them the same number of times: a team with no row left adds zeros.
// row_sum_subgroup.wgsl is the same with subgroup operations; both come after row_teams.wgsl.

struct Lanes { @builtin(local_invocation_index) lid: u32 }

const TEAM_WIDTH: u32 = {{TEAM_WIDTH}}u;  // group_sum.TEAM_WIDTH (32; tests also take 64: two rows a team)

fn team_of(lanes: Lanes) -> Team {
    return Team(lanes.lid, lanes.lid / TEAM_WIDTH, 256u / TEAM_WIDTH, lanes.lid % TEAM_WIDTH, TEAM_WIDTH);
}

// How many of a workgroup's ROWS each team takes: a constant, so loops over them stay uniform
fn team_rows(team: Team) -> u32 { return (ROWS + 256u / TEAM_WIDTH - 1u) / (256u / TEAM_WIDTH); }

var<workgroup> row_scratch: array<vec2<f32>, 256>;

fn row_sum(team: Team, x: vec2<f32>) -> vec2<f32> {
    row_scratch[team.lid] = x;
    workgroupBarrier();
    for (var s = TEAM_WIDTH / 2u; s > 0u; s = s >> 1u) {
        if (team.lane < s) { row_scratch[team.lid] = row_scratch[team.lid] + row_scratch[team.lid + s]; }
        workgroupBarrier();
    }
    let total = row_scratch[team.lid - team.lane];
    workgroupBarrier();  // all have read the total before the scratch is reused
    return total;
}

var<workgroup> max_scratch: array<f32, 256>;

// The maximum over the team; which of a NaN and a number wins is left to the implementation, as with
// subgroupMax in row_sum_subgroup.wgsl
fn row_max(team: Team, x: f32) -> f32 {
    max_scratch[team.lid] = x;
    workgroupBarrier();
    for (var s = TEAM_WIDTH / 2u; s > 0u; s = s >> 1u) {
        if (team.lane < s) { max_scratch[team.lid] = max(max_scratch[team.lid], max_scratch[team.lid + s]); }
        workgroupBarrier();
    }
    let best = max_scratch[team.lid - team.lane];
    workgroupBarrier();
    return best;
}
