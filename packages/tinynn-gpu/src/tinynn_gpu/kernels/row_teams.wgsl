// What both forms of the row teams share (row_sum_subgroup.wgsl, row_sum_workgroup.wgsl, each filled in after
// this): a team, ROWS rows a workgroup, and which row a team takes on each step of its loop over them.

struct Team { lid: u32, id: u32, count: u32, lane: u32, width: u32 }

const ROWS: u32 = {{ROWS}}u;  // rows per 256-thread workgroup (group_sum.TEAM_ROWS)

// Row k of a team's rows, of a workgroup whose ROWS rows start at `first`, of n_rows rows of `cols` Values: its
// index, where it starts, and where the Values that the team holds (lane, lane + width, ...) end: 0 for a team
// with no row (past the workgroup's ROWS or the last row), which still calls row_sum, adding zeros.
struct TeamRow { row: u32, base: u32, end: u32 }

fn team_row(team: Team, first: u32, k: u32, n_rows: u32, cols: u32) -> TeamRow {
    let r = team.id + k * team.count;
    let row = first + r;
    return TeamRow(row, row * cols, select(0u, cols, r < ROWS && row < n_rows));
}
