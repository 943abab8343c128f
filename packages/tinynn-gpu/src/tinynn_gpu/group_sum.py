"""Kernel files that sum across a workgroup, compiled with subgroup operations where the device has them.

A file with a `{{GROUP_SUM}}` line gets `group_sum(lanes, x)` from kernels/group_sum_subgroup.wgsl when the
device was opened with the `subgroup` feature, else from kernels/group_sum_workgroup.wgsl (a tree in
workgroup memory). One with a `{{ROW_SUM}}` line gets the row teams (a subgroup, or 32 threads, per row;
TEAM_ROWS rows per workgroup) and `row_sum(team, x)` from kernels/row_sum_subgroup.wgsl or
row_sum_workgroup.wgsl the same way. TINYNN_SUBGROUPS=0 forces the workgroup-memory path (tests run both);
the runtime reads it once, into `Runtime.subgroups` (an eager forward asks for these kernels at every
LayerNorm). Each variant is compiled once and kept in the runtime's kernels under (name, subgroups, team width).
"""
from __future__ import annotations

import os

from tinynn_gpu.context import kernel_file, kernel_source


def uses_subgroups(ctx) -> bool:
    return "subgroup" in ctx.features and os.environ.get("TINYNN_SUBGROUPS") != "0"


TEMPLATES = ("reduce", "layernorm", "cross_entropy")  # the kernel files compiled through `shader`
TEAM_ROWS = 8  # rows per 256-thread workgroup of the row-team kernels (layernorm, cross_entropy's forward)
TEAM_WIDTH = 32  # threads per row team without subgroups


def snippet(subgroups: bool) -> str:
    """The group_sum that a template's {{GROUP_SUM}} line becomes (`kernel_source`'s fills)."""
    return kernel_file(f"group_sum_{'subgroup' if subgroups else 'workgroup'}")


def fills(subgroups: bool) -> dict:
    """`kernel_source`'s fills for a file using group_sum or the row teams ({{ROWS}}: inside the row teams)."""
    teams = kernel_file(f"row_sum_{'subgroup' if subgroups else 'workgroup'}")
    return {"GROUP_SUM": snippet(subgroups), "ROW_SUM": teams, "ROWS": TEAM_ROWS, "TEAM_WIDTH": TEAM_WIDTH}


def variant(rt) -> tuple:
    """What picks a template's compiled form on this runtime: subgroups or not, and the team width. An op that
    caches its launches keys them with this, so that a hit needs no `shader` lookup."""
    return rt.subgroups, TEAM_WIDTH


def shader(rt, name: str):
    """kernels/<name>.wgsl with the runtime's group_sum or row teams, compiled on first use (a runtime Shader)."""
    subgroups = rt.subgroups
    key = (name, *variant(rt))
    found = rt.kernels.get(key)
    if found is None:
        label = f"{name}[{'subgroup' if subgroups else f'workgroup x{TEAM_WIDTH}'}]"
        found = rt.kernels[key] = rt.shader(kernel_source(name, fills(subgroups)), label)
    return found
