"""The matmul selector (matmul/selection.py): autotuning and its cache, the default variant, a forced variant."""
import json

import numpy as np
import pytest

from test_blocked import rel_err
from tinynn.errors import TinynnError
from tinynn_gpu.matmul.selection import MatmulSelector

RTOL = 1e-5


def test_autotune_times_every_variant_and_caches_the_winner(setting, gpu, tmp_path, monkeypatch, rng):
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(MatmulSelector, "tune_min_macs", 0)  # this small shape is tuned too
    tuner = MatmulSelector(gpu.rt, autotune=True)
    a, b = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 33)).astype(np.float32)
    da, db, out = gpu.from_numpy(a), gpu.from_numpy(b), gpu.rt.empty((40, 33))
    tuner.record(da, db, out, 1, 40, 33, 24, False, False, False)
    assert rel_err(gpu.to_numpy(out), a.astype(np.float64) @ b) <= RTOL
    cached = json.loads((tmp_path / "matmul-autotune.json").read_text())["choices"][tuner.cache_key]
    assert list(cached.values()) == [tuner.choices[next(iter(cached))]]
    assert list(cached.values())[0] in tuner.candidates  # a blocked variant: the lesson's tiles are not tried

    def no_tuning(*args):
        raise AssertionError("the cached choice should have been used")
    again = MatmulSelector(gpu.rt, autotune=True)
    monkeypatch.setattr(again, "_tune", no_tuning)
    again.record(da, db, out, 1, 40, 33, 24, False, False, False)
    assert rel_err(gpu.to_numpy(out), a.astype(np.float64) @ b) <= RTOL


def test_a_matmul_too_small_to_repay_tuning_takes_the_default_variant(setting, gpu, tmp_path, monkeypatch, rng):
    setting("TINYNN_CACHE_DIR", str(tmp_path))
    tuner = MatmulSelector(gpu.rt, autotune=True)
    monkeypatch.setattr(tuner, "_tune", lambda *args: pytest.fail("a small matmul was tuned"))
    m, n, k = 128, 1024, 256  # a generation window's MLP matmul: 2^25 multiply-adds
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = gpu.rt.empty((m, n))
    tuner.record(gpu.from_numpy(a), gpu.from_numpy(b), out, 1, m, n, k, False, False, False)
    assert rel_err(gpu.to_numpy(out), a.astype(np.float64) @ b) <= RTOL
    assert tuner.choices == {f"ta=0 tb=0 shared=0 b=1 m={m} n={n} k={k}": MatmulSelector.default_variant(1, m, n, k)}


def test_a_variant_can_be_forced(setting, gpu, monkeypatch):
    setting("TINYNN_MATMUL", "lesson8")
    assert MatmulSelector(gpu.rt).variant("lesson8").describe() == "lesson tiled 8x8"
    setting("TINYNN_MATMUL", "nope")
    with pytest.raises(TinynnError, match="not a variant"):  # the user's setting: one line, not a failed backend
        MatmulSelector(gpu.rt)
    setting("TINYNN_MATMUL", "tensor 64x64x32/2x2")  # its vec4 loads would misread K = 3, say
    with pytest.raises(TinynnError, match="tensor-core variant"):
        MatmulSelector(gpu.rt)


@pytest.mark.parametrize("shape", [(1, 4096, 4096, 4096), (1, 1024, 1024, 1024), (1, 2048, 256, 256),
                                   (1, 256, 256, 2048), (1, 2048, 256, 1024), (1, 65, 256, 2048),
                                   (64, 128, 128, 64), (1, 1, 1, 1)])
def test_default_variant_is_a_shipped_candidate(gpu, shape):
    assert MatmulSelector.default_variant(*shape) in MatmulSelector(gpu.rt, autotune=False).candidates
