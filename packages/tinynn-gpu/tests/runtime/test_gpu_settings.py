"""The environment variables the GPU package reads, read once into one Settings object (runtime/settings.py)."""
import re
from pathlib import Path

import pytest
from tinynn.errors import TinynnError

from tinynn_gpu.runtime import settings
from tinynn_gpu.runtime.settings import Settings

SRC = Path(__file__).parents[2] / "src" / "tinynn_gpu"


def test_every_variable_is_read_into_the_settings():
    environ = {"TINYNN_WEBGPU": " Dawn ", "TINYNN_ADAPTER": " H100 ", "TINYNN_ADAPTER_INDEX": "3",
               "TINYNN_SHADER_CHECKS": "1", "TINYNN_SUBGROUPS": "0", "TINYNN_ATTENTION_TILE": "32x32x2", "TINYNN_ATTENTION_BACKWARD_TILE": "0",
               "TINYNN_ATTENTION_LAYOUT": "8x4", "TINYNN_MATMUL": "lesson8", "TINYNN_AUTOTUNE": "0",
               "TINYNN_CACHE_DIR": "/tmp/cache"}
    read = Settings.read(environ)
    assert read == Settings(webgpu="dawn", adapter="h100", adapter_index="3", shader_checks=True, subgroups=False,
                            attention_tile="32x32x2", attention_backward_tile="0", attention_layout="8x4",
                            matmul="lesson8", autotune=False, cache_dir=Path("/tmp/cache"))
    unset = Settings.read({})
    assert unset.webgpu == "" and unset.subgroups and not unset.shader_checks and unset.autotune is None
    assert unset.attention_tile is None


@pytest.mark.parametrize("name", ["TINYNN_SHADER_CHECKS", "TINYNN_SUBGROUPS", "TINYNN_AUTOTUNE"])
@pytest.mark.parametrize("value", ["true", "yes", "2", "maybe"])
def test_a_switch_set_to_junk_is_named(name, value):
    """TINYNN_SHADER_CHECKS=true left the checks off, TINYNN_SUBGROUPS=false left subgroups on, without a word."""
    with pytest.raises(TinynnError, match=f"^{name} must be 0 or 1, got '{value}'$"):
        Settings.read({name: value})
    assert Settings.read({name: " 1 "}) == Settings.read({name: "1"}) != Settings.read({name: "0"})


@pytest.mark.parametrize("name, good, bad", [
    ("TINYNN_ATTENTION_TILE", ["64x32x2", "0", " 16X16X1 "], ["bogus", "64x32", "64x0x2", "x32x2", "-1x32x2"]),
    ("TINYNN_ATTENTION_BACKWARD_TILE", ["32x32x2", "0"], ["32x32", "32x32x2x1", "32 x 32 x 2"]),
    ("TINYNN_ATTENTION_LAYOUT", ["16x4"], ["0", "16", "16x4x1", "ax4"])])
def test_a_misspelt_tile_is_named(name, good, bad):
    """The tiles were read at their kernel's first use only: a misspelt one went unnoticed by a run that never
    reached that kernel (generation with the backward's tile, say)."""
    for value in good:
        assert Settings.read({name: value}) != Settings.read({})
    for value in bad:
        with pytest.raises(TinynnError, match=f"^{name} must look like "):
            Settings.read({name: value})


def test_only_the_settings_module_reads_the_environment():
    """No module reads a TINYNN_ variable from os.environ itself (settings.py reads the mapping it is given): a
    variable read anywhere else would not follow `reload`."""
    readers = [path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
               if re.search(r"os\.environ(\.get)?\(?\[?\s*\"TINYNN_|getenv\(", path.read_text())]
    assert readers == []


def test_reload_reads_the_environment_again(setting):
    setting("TINYNN_MATMUL", "lesson16")
    assert settings.current().matmul == "lesson16"
    setting("TINYNN_MATMUL", None)
    assert settings.current().matmul is None
