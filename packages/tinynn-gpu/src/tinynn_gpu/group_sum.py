"""Kernel files that sum across a workgroup, compiled with subgroup operations where the device has them.

A file with a `{{GROUP_SUM}}` line gets `group_sum(lanes, x)` from kernels/group_sum_subgroup.wgsl when the
device was opened with the `subgroup` feature, else from kernels/group_sum_workgroup.wgsl (a tree in
workgroup memory). TINYNN_SUBGROUPS=0 forces the workgroup-memory path (tests run both). Each variant is
compiled once and kept in the runtime's kernels under its own name.
"""
from __future__ import annotations

import os

from tinynn_gpu.context import kernel_file, kernel_source


def uses_subgroups(ctx) -> bool:
    return "subgroup" in ctx.features and os.environ.get("TINYNN_SUBGROUPS") != "0"


def snippet(subgroups: bool) -> str:
    """The group_sum that a template's {{GROUP_SUM}} line becomes (`kernel_source`'s fills)."""
    return kernel_file(f"group_sum_{'subgroup' if subgroups else 'workgroup'}")


def shader(rt, name: str):
    """kernels/<name>.wgsl with the device's group_sum, compiled on first use (a runtime Shader)."""
    key = f"{name}[{'subgroup' if uses_subgroups(rt.ctx) else 'workgroup'}]"
    found = rt.kernels.get(key)
    if found is None:
        code = kernel_source(name, {"GROUP_SUM": snippet(uses_subgroups(rt.ctx))})
        found = rt.kernels[key] = rt.shader(code, key)
    return found
