"""Kernel files that sum across a workgroup, compiled with subgroup operations where the device has them.

A file with a `{{GROUP_SUM}}` line gets `group_sum(lanes, x)` from kernels/group_sum_subgroup.wgsl when the
device was opened with the `subgroup` feature, else from kernels/group_sum_workgroup.wgsl (a tree in
workgroup memory); one with a `{{ROW_SUM}}` line gets the row teams and `row_sum(team, x)` of
kernels/row_sum_subgroup.wgsl or row_sum_workgroup.wgsl the same way. TINYNN_SUBGROUPS=0 forces the workgroup-memory path (tests run both). Each variant is
compiled once and kept in the runtime's kernels under its own name.
"""
from __future__ import annotations

import os

from tinynn_gpu.context import kernel_file, kernel_source


def uses_subgroups(ctx) -> bool:
    return "subgroup" in ctx.features and os.environ.get("TINYNN_SUBGROUPS") != "0"


def snippet(subgroups: bool, kind: str = "group_sum") -> str:
    """The group_sum (or row_sum) that a template's {{GROUP_SUM}} ({{ROW_SUM}}) line becomes (`kernel_source`'s
    fills)."""
    return kernel_file(f"{kind}_{'subgroup' if subgroups else 'workgroup'}")


def shader(rt, name: str):
    """kernels/<name>.wgsl with the device's group_sum, compiled on first use (a runtime Shader)."""
    key = f"{name}[{'subgroup' if uses_subgroups(rt.ctx) else 'workgroup'}]"
    found = rt.kernels.get(key)
    if found is None:
        subgroups = uses_subgroups(rt.ctx)
        code = kernel_source(name, {"GROUP_SUM": snippet(subgroups), "ROW_SUM": snippet(subgroups, "row_sum")})
        found = rt.kernels[key] = rt.shader(code, key)
    return found
