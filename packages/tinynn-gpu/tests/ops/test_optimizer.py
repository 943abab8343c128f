"""The gradient norm and AdamW over many tensors per dispatch (ops/norm.py, ops/optimizer.py, ops/multi_tensor.py)
against float64 NumPy, with subgroups and without."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn_gpu.ops import multi_tensor
from tinynn_gpu.ops.multi_tensor import ADAMW_CHUNK, SQUARES_CHUNK

from gpu_checks import dispatches, rel_err

RTOL = 1e-5
REF = backends.reference()
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_multi_tensor_kernels_compile_for_every_slot_count(gpu):
    """lavapipe binds 32 storage buffers (7 AdamW slots, 30 for the norm); an H200 takes all 64: check the WGSL
    for both."""
    from tinynn_gpu.ops.multi_tensor import MAX_SLOTS, generate
    for slots, square_slots in ((1, 1), (gpu.multi.slots, gpu.multi.square_slots), (MAX_SLOTS, MAX_SLOTS)):
        for subgroups in {False, "subgroup" in gpu.ctx.features}:
            gpu.rt.device.create_shader_module(code=generate(slots, square_slots, subgroups))


sizes = st.one_of(st.integers(1, 600), st.sampled_from([ADAMW_CHUNK - 1, ADAMW_CHUNK + 1, SQUARES_CHUNK + 3]))


def check_norm_and_adamw(gpu, monkeypatch, shapes, workgroups, seed):
    """The norm, the clip coefficient and AdamW (with it) against float64 NumPy; `workgroups` wanted by the
    sums of squares' chunk rule (1: a chunk its most elements, SQUARES_CHUNK; 2048: its fewest)."""
    g = np.random.default_rng(seed)
    monkeypatch.setattr(multi_tensor, "SQUARES_WORKGROUPS", workgroups)
    params, grads, ms, vs = ([g.standard_normal(n).astype(np.float32) for n in shapes] for _ in range(4))
    vs = [np.abs(v) for v in vs]
    norm = gpu.global_norm([gpu.from_numpy(a) for a in grads])
    want = np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in grads))
    assert rel_err(gpu.to_numpy(norm), want) <= RTOL
    hyper = np.array([1e-2, 0.1, 0.01], np.float32)
    (norm, scale), count = dispatches(gpu, lambda: gpu.global_norm_and_clip([gpu.from_numpy(a) for a in grads], 1.0))
    assert rel_err(gpu.to_numpy(norm), want) <= RTOL
    assert count == -(-len(grads) // gpu.multi.square_slots) + 1  # the sums of squares, then one finish for both
    on_gpu = [[gpu.from_numpy(a) for a in kind] for kind in (params, grads, ms, vs)]
    _, count = dispatches(gpu, lambda: gpu.adamw_update_(*on_gpu, gpu.from_numpy(hyper), beta1=0.9, beta2=0.95,
                                                         eps=1e-8, weight_decay=0.1, grad_scale=scale))
    assert count == -(-len(params) // gpu.multi.slots)
    expected = [[a.astype(np.float64) for a in kind] for kind in (params, grads, ms, vs)]
    REF.adamw_update_(*expected, hyper.astype(np.float64), beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                      grad_scale=np.float64(min(1.0, 1.0 / (want + 1e-6))))
    for kind, ours, theirs in zip("pgmv", on_gpu, expected):
        for o, t in zip(ours, theirs):
            assert rel_err(gpu.to_numpy(o), t) <= RTOL, kind


@FEW
@given(shapes=st.lists(sizes, min_size=1, max_size=12), workgroups=st.sampled_from([1, 3, 2048]),
       seed=st.integers(0, 2**31))
def test_global_norm_and_adamw_over_many_tensors(subgroup_path, monkeypatch, shapes, workgroups, seed):
    """More tensors than one AdamW dispatch's slots on lavapipe (7), sizes across the chunk boundaries; the
    sums of squares' chunk from its smallest to SQUARES_CHUNK (few workgroups wanted)."""
    check_norm_and_adamw(subgroup_path, monkeypatch, shapes, workgroups, seed)


@pytest.mark.parametrize("workgroups", [1, 2048])
@pytest.mark.parametrize("shapes", [
    [1, 2, 3, 4, 5, 6, 7],
    [1021, 1027, 2047, 2049, 2050, 2051, 3071, 4099, 8189, 16387, 16390],
    [1 + i % 7 for i in range(70)] + [4097, 2 * ADAMW_CHUNK + 5],
], ids=["1-to-7-elements", "n-mod-4-tails-at-chunk-edges", "more-tensors-than-slots"])
def test_global_norm_and_adamw_edges(subgroup_path, monkeypatch, shapes, workgroups):
    """The kernels' edges: tensors shorter than a thread's four-element step, sizes just off a multiple of
    four at a chunk's edges (the one-element tail loops; nothing written past the end: the poisoned tails);
    more tensors than MAX_SLOTS (64), so two dispatches even where every slot binds."""
    check_norm_and_adamw(subgroup_path, monkeypatch, shapes, workgroups, len(shapes))
