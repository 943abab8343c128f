"""Backend factories for the registry tests, loaded through hand-built EntryPoint objects."""
from tinynn.backends import Backend, BackendUnavailable
from tinynn.numpy_backend import NumpyBackend


class FakeGpu(NumpyBackend):
    """A 'GPU' that is NumPy underneath, except that it lacks matmul (so the fallback serves it)."""
    name = "fakegpu"
    is_gpu = True
    device_name = "Fake GPU"
    matmul = Backend.matmul  # the base class's NumPy fallback


class SoftwareGpu(FakeGpu):
    is_software = True
    device_name = "llvmpipe (fake)"


def working():
    return FakeGpu()


def software_only():
    return SoftwareGpu()


def older_interface():
    backend = FakeGpu()
    backend.interface_version = 0
    return backend


def no_adapter():
    raise BackendUnavailable("no adapter found (fake)")


def broken():
    raise RuntimeError("plugin bug")
