"""The adapter limits the kernels need are the ones the context checks for."""
import re

import pytest

from tinynn_gpu.ops import group_sum
from tinynn_gpu.runtime import context, wgsl
from tinynn_gpu.runtime.webgpu import wgpu


def entry_points(source: str) -> list[str]:
    return re.findall(r"@compute\s+@workgroup_size\([^)]*\)\s*fn\s+(\w+)", source)


def build_every_kernel(storage_buffers: int) -> list[str]:
    """The entries of every kernel file whose pipeline fails on a device allowing this many storage buffers."""
    adapter = context.choose_adapter(wgpu.gpu.enumerate_adapters_sync())
    device = adapter.request_device_sync(required_limits={"max-storage-buffers-per-shader-stage": storage_buffers})
    failed = []
    sources = [wgsl.kernel_source(name) for name in context.KERNEL_FILES] + \
        [group_sum.source(name, subgroups=False) for name in ("layernorm", "cross_entropy")]  # no-subgroup form
    for code in sources:
        module = device.create_shader_module(code=code)
        for entry in entry_points(code):
            try:
                device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": entry})
            except Exception:
                failed.append(entry)
    return failed


def test_the_storage_buffer_count_checked_at_start_up_is_what_the_kernels_need(gpu):
    if gpu.ctx.limits["max-storage-buffers-per-shader-stage"] < context.STORAGE_BUFFERS_NEEDED:
        pytest.fail("the gpu fixture's adapter should have been refused")
    assert build_every_kernel(context.STORAGE_BUFFERS_NEEDED) == []
    assert build_every_kernel(context.STORAGE_BUFFERS_NEEDED - 1) != []  # the number is not larger than needed
