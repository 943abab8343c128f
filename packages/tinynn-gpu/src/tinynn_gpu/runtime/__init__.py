"""The runtime wing of the GPU package: the device and settings (context.py, settings.py), arrays and their pool
(arrays.py, pool.py), kernels and their bindings by name (wgsl.py, params.py, bindings.py, kernels.py), the
recording paths (recorder.py, native.py), transfers, profiling, and the capture and replay of whole steps.
`Runtime` (runtime.py) composes them. Importing this package imports nothing else: context.py names the reason
when wgpu is missing, which importing wgpu here would hide."""
