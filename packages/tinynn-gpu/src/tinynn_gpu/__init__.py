"""tinynn-gpu: WebGPU kernels for tinynn, plugged into core through the `tinynn.backends` entry point, run on
wgpu-native (wgpu-py) or, with TINYNN_WEBGPU=dawn, on Dawn (wgpudawn): runtime/webgpu.py.

Installing this package is all it takes: core's `auto` device then uses a hardware GPU when one is present,
and the CPU otherwise. `create_backend` is the entry point: it opens the GPU once per process and raises
`BackendUnavailable` with the reason when it cannot (no wgpu or wgpudawn, no adapter, no driver, a kernel that
fails to compile). Importing this package does not import either.
"""
from tinynn_gpu.numpy_ops import add_data, matmul_data, relu_data, scale_data

__version__ = "0.1.0"
__all__ = ["create_backend", "matmul_data", "scale_data", "add_data", "relu_data", "__version__"]


def create_backend():
    from tinynn_gpu.runtime.context import create
    ctx = create()  # first: it names the reason when wgpu (wgpudawn) is missing, which importing the backend would hide
    from tinynn_gpu.backend import WgpuBackend
    return WgpuBackend(ctx)
