"""Both packages are ready for an index: their wheels build, carry the license, the metadata an index shows
(classifiers, URLs, one version from __init__), core's bound in tinynn-gpu, and every kernel file."""
import ast
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {"tinynn-core": "tinynn", "tinynn-gpu": "tinynn_gpu"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    if not (ROOT / "packages" / "tinynn-gpu").is_dir():
        pytest.skip("the source tree is not beside this test")
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheels")
    for name in PACKAGES:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(out), str(ROOT / "packages" / name)], check=True)
    return {name: next(out.glob(f"{name.replace('-', '_')}-*.whl")) for name in PACKAGES}


def metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = Parser().parsestr(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    return meta, names


def source_version(name: str) -> str:
    init = (ROOT / "packages" / name / "src" / PACKAGES[name] / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', init, re.M).group(1)


@pytest.mark.parametrize("name", PACKAGES)
def test_wheel_metadata(name, wheels):
    meta, names = metadata(wheels[name])
    assert meta["Name"] == name and meta["Version"] == source_version(name)
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    classifiers = meta.get_all("Classifier")
    assert "Development Status :: 3 - Alpha" in classifiers and "Operating System :: OS Independent" in classifiers
    # the Pythons claimed are the Pythons that nox tests
    tested = ast.literal_eval(re.search(r"^PYTHONS = (\[.*?\])", (ROOT / "noxfile.py").read_text(), re.M).group(1))
    prefix = "Programming Language :: Python :: 3."
    assert [c.rsplit(" ", 1)[1] for c in classifiers if c.startswith(prefix)] == tested
    assert meta["Requires-Python"] == f">={tested[0]}"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Source", "Issues"} <= set(urls)
    assert meta["Summary"] and meta["Description-Content-Type"] == "text/markdown"
    assert (ROOT / "packages" / name / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()


def test_version_is_written_once_per_package():
    for name in PACKAGES:
        text = (ROOT / "packages" / name / "pyproject.toml").read_text()
        assert 'dynamic = ["version"]' in text and not re.search(r"^version\s*=", text, re.M)


def test_gpu_wheel_bounds_core_and_carries_every_kernel(wheels):
    meta, names = metadata(wheels["tinynn-gpu"])
    core = next(r for r in meta.get_all("Requires-Dist") if r.startswith("tinynn-core"))
    assert "<0.2" in core and ">=0.1.0" in core
    kernels = sorted(p.name for p in (ROOT / "packages/tinynn-gpu/src/tinynn_gpu/kernels").glob("*.wgsl"))
    assert kernels and all(f"tinynn_gpu/kernels/{k}" in names for k in kernels)
    assert "gpu = tinynn_gpu:create_backend" in zipfile.ZipFile(wheels["tinynn-gpu"]).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()


def test_core_wheel_has_the_command_and_no_gpu_code(wheels):
    meta, names = metadata(wheels["tinynn-core"])
    assert not any("tinynn_gpu" in n or n.endswith(".wgsl") for n in names)
    assert "tinynn/cli.py" in names and "tinynn/rundir.py" in names
    assert "matplotlib>=3.5; extra == 'plot'" in meta.get_all("Requires-Dist")
