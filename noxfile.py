"""Test sessions, one per supported Python (the classifiers in both pyproject.toml files list the same ones).
Each installs the packages the way a user does (built wheels, not editable), so a file missing from a wheel
fails here too.

    nox -s tests-cpu tests-gpu           # every supported Python
    nox -s tests-cpu-3.12                # one of them
    nox -s tests-dawn                    # the GPU tests on Dawn instead of wgpu-native
"""
import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|venv"  # uv installs the same wheels in seconds; plain venv where it is absent
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True  # a supported Python that is not tested is a failure

PYTHONS = ["3.11", "3.12", "3.13"]  # 3.10 reached its end of life in October 2026
# hatchling and pip: test_packaging builds the wheels (uv makes venvs without pip); xdist: a test process per
# core, so shaders compile on every core
TEST_TOOLS = ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "hatchling>=1.27", "pip"]
CORE, GPU = "./packages/tinynn-core", "./packages/tinynn-gpu"
TINT = "wgpudawn==0.32.0.4"  # Dawn's WGSL compiler with a no-GPU backend: test_wgsl_tint.py (Python >= 3.11)
REQUIRE_MPI = {"TINYNN_REQUIRE_MPI": "1"}  # the [mpi] extra is installed: its mpiexec tests must run, not skip

# pyenv keeps each Python in its own folder, behind shims that run only the selected one: put them in reach.
_pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
os.environ["PATH"] = os.pathsep.join([*map(str, sorted(_pyenv.glob("versions/3.*/bin"))), os.environ["PATH"]])


@nox.session(name="tests-cpu", python=PYTHONS)
def tests_cpu(session):
    """tinynn-core alone: the NumPy reference, autograd, model, training and CLI (data-parallel runs under
    the [mpi] extra's mpiexec too). No GPU package."""
    session.install(f"{CORE}[plot,mpi,bpe]", *TEST_TOOLS)
    session.run("python", "-c", "import importlib.util as u, sys; "
                "bad = [m for m in ('wgpu', 'tinynn_gpu') if u.find_spec(m)]; "
                "sys.exit(f'tinynn-core pulled in {bad}') if bad else print('no GPU package installed: ok')")
    session.run("pytest", "-n", "auto", f"{CORE}/tests", *session.posargs, env=REQUIRE_MPI)


@nox.session(name="tests-gpu", python=PYTHONS)
def tests_gpu(session):
    """tinynn-core + tinynn-gpu on a real WebGPU adapter (lavapipe in CI): the GPU kernels against the CPU,
    then the whole core suite again with the GPU backend active. A missing adapter fails, never skips.
    The first Python runs every test; the others run the GPU package's tests but tests/matmul, the sweeps over
    the generated matmul variants (their WGSL is the same on every Python, and compiling it cold on lavapipe is
    most of CI's time), and leave the core suite to tests-cpu on that Python."""
    session.install(f"{CORE}[plot,mpi,bpe]", GPU, *TEST_TOOLS, TINT)
    env = {"TINYNN_REQUIRE_GPU": "1", "XDG_RUNTIME_DIR": "/tmp", **REQUIRE_MPI}
    session.run("tinynn", "info", "--device", "gpu", env=env)
    suites = [f"{GPU}/tests", f"{CORE}/tests"] if session.python == PYTHONS[0] else \
        [f"{GPU}/tests", f"--ignore={GPU}/tests/matmul"]
    session.run("pytest", "-n", "auto", *suites, *session.posargs, env=env)


@nox.session(name="tests-dawn", python=PYTHONS[0])
def tests_dawn(session):
    """tinynn-gpu's tests on Dawn instead of wgpu-native (TINYNN_WEBGPU=dawn, the [dawn] extra), on a real WebGPU
    adapter; a missing one fails. Every GPU test; CI runs only the runtime's and the backend's tests, by pytest
    arguments (.ci/run says why), and points the session at a lavapipe Dawn accepts (Mesa 25: it refuses Mesa 22's)."""
    session.install(f"{CORE}[plot,mpi,bpe]", f"{GPU}[dawn]", *TEST_TOOLS)
    env = {"TINYNN_WEBGPU": "dawn", "TINYNN_REQUIRE_GPU": "1", "XDG_RUNTIME_DIR": "/tmp", **REQUIRE_MPI}
    session.run("tinynn", "info", "--device", "gpu", env=env)
    session.run("pytest", "-n", "auto", f"{GPU}/tests", *session.posargs, env=env)


# pip, not uv: torch 2.13.0's CPU wheel lies on the CI machines' disk where pip looks (PyPI's Linux torch is a CUDA
# build of several GB), for the first Python only
@nox.session(name="interop", python=PYTHONS[0], venv_backend="venv")
def interop(session):
    """tinynn against Hugging Face transformers and torch's CPU build, on the CPU and on the GPU backend: GPT-2
    folders in and out (logits within 1e-5, greedy tokens equal, export bit-identical), and a 200 MB corpus
    prepared and trained on under a memory cap."""
    session.install(f"{CORE}[bpe]", GPU, *TEST_TOOLS, "torch==2.13.0", "transformers>=4.40")
    env = {"TINYNN_INTEROP": "1", "TINYNN_REQUIRE_GPU": "1", "XDG_RUNTIME_DIR": "/tmp"}
    session.run("pytest", f"{CORE}/tests/interop", *session.posargs, env=env)
