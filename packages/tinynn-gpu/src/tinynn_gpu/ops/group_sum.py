"""Kernel files that sum across a workgroup, compiled with subgroup operations where the device has them.

A file with a `{{GROUP_SUM}}` line gets `group_sum(lanes, x)` from group_sum_subgroup.wgsl when the
device was opened with the `subgroup` feature, else from group_sum_workgroup.wgsl (a tree in
workgroup memory). One with a `{{ROW_SUM}}` line gets the row teams (a subgroup, or 32 threads, per row;
TEAM_ROWS rows per workgroup) and `row_sum(team, x)` from row_sum_subgroup.wgsl or
row_sum_workgroup.wgsl the same way; layernorm.wgsl also gets its Values' width and step (`row_values`).
TINYNN_SUBGROUPS=0 forces the workgroup-memory path (tests run both); the runtime reads it once, into
`Runtime.subgroups` (an eager forward asks for these kernels at every LayerNorm). Each variant is compiled once
and kept in the runtime's kernels under (name, subgroups, team width, Value width, step).
"""
from __future__ import annotations

from tinynn_gpu.runtime.wgsl import kernel_file, kernel_source, unroll


TEMPLATES = ("reduce", "layernorm", "cross_entropy")  # the kernel files compiled through `shader`
TEAM_ROWS = 8  # rows per 256-thread workgroup of the row-team kernels (layernorm, cross_entropy's forward)
TEAM_WIDTH = 32  # threads per row team without subgroups
ROWS_AHEAD = 8  # rows a lane of layernorm.wgsl's column sums loads at once


def snippet(subgroups: bool) -> str:
    """The group_sum that a template's {{GROUP_SUM}} line becomes (`kernel_source`'s fills)."""
    return kernel_file(f"group_sum_{'subgroup' if subgroups else 'workgroup'}")


def fills(subgroups: bool, width: int = 1, step: int = 1) -> dict:
    """`kernel_source`'s fills for a file using group_sum or the row teams ({{ROWS}}: inside the row teams), and
    layernorm.wgsl's Value of `width` floats (4: a vec4, else 1), `step` of them a lane per step of a row loop."""
    if width not in (1, 4):
        raise ValueError(f"a Value is 1 or 4 floats, not {width}")
    teams = kernel_file("row_teams") + kernel_file(f"row_sum_{'subgroup' if subgroups else 'workgroup'}")
    value = ({"VALUE": "vec4<f32>", "TOTAL": "(v.x + v.y) + (v.z + v.w)"} if width == 4
             else {"VALUE": "f32", "TOTAL": "v"})
    return {"GROUP_SUM": snippet(subgroups), "ROW_SUM": teams, "ROWS": TEAM_ROWS, "TEAM_WIDTH": TEAM_WIDTH,
            "WIDTH": width, "STEP": step, "ROWS_AHEAD": ROWS_AHEAD, **value}


def row_values(cols: int) -> tuple[int, int]:
    """layernorm.wgsl's (width, step) for rows of `cols` floats: Values of 4 floats (a vec4 a load) where the rows
    split into quads, else 1; and the Values a lane takes per loop step, enough to cover a row in one step of a
    32-wide team (a power of two, at most 8): a step's Values past the row's end are loaded and computed for
    nothing, and each step is another trip to memory."""
    width = 4 if cols % 4 == 0 else 1
    per_lane = -(-cols // (width * 32))
    return width, min(8, 1 << (per_lane - 1).bit_length())


def variant(rt) -> tuple:
    """What picks a template's compiled form on this runtime: subgroups or not, and the team width. An op that
    caches its launches keys them with this, so that a hit needs no `shader` lookup."""
    return rt.subgroups, TEAM_WIDTH


def shader(rt, name: str, width: int = 1, step: int = 1):
    """<name>.wgsl with the runtime's group_sum or row teams (and layernorm.wgsl's Values: `row_values`),
    compiled on first use (a runtime Shader)."""
    subgroups = rt.subgroups
    key = (name, *variant(rt), width, step)
    found = rt.kernels.files.get(key)
    if found is None:
        label = (f"{name}[{'subgroup' if subgroups else f'workgroup x{TEAM_WIDTH}'}"
                 f"{f', vec4 x{step}' if width == 4 else f', x{step}' if step > 1 else ''}]")
        found = rt.kernels.files[key] = rt.shader(source(name, subgroups, width, step), label)
    return found


def source(name: str, subgroups: bool, width: int = 1, step: int = 1) -> str:
    """The WGSL that `shader` compiles: the template filled in, its marked lines unrolled (layernorm.wgsl's)."""
    return unroll(kernel_source(name, fills(subgroups, width, step)), {"$s": step, "$r": ROWS_AHEAD})
