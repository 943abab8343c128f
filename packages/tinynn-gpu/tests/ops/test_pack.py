"""pack and unpack against the NumPy reference, bit for bit, with outputs poisoned (NaN) first: many arrays
(more than one dispatch's slots), empty and scalar ones, float32 with inf and NaN among the values, int32."""
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tinynn import backends
from tinynn_gpu.ops.pack import MAX_SLOTS, generate

REF = backends.reference()
shape = st.one_of(st.just(()), st.tuples(st.integers(0, 40)), st.tuples(st.integers(1, 9), st.integers(1, 9)))
shapes = st.lists(shape, min_size=1, max_size=80)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=shapes, dtype=st.sampled_from([np.float32, np.int32]), seed=st.integers(0, 2**31))
@example(shapes=[(5,), (0,)] * 40 + [()], dtype=np.float32, seed=1)  # three dispatches where 30 slots fit
def test_pack_and_unpack_match_the_reference_bit_for_bit(poisoned, shapes, dtype, seed):
    gpu, g = poisoned, np.random.default_rng(seed)
    arrays = [g.standard_normal(s).astype(np.float32) if dtype == np.float32 else g.integers(-9, 9, s, np.int32)
              for s in shapes]
    if dtype == np.float32:
        arrays[0].reshape(-1)[:2] = [np.inf, np.nan][:arrays[0].size]
    flat = gpu.pack([gpu.from_numpy(a) for a in arrays])
    expected = REF.pack(arrays)
    got = gpu.to_numpy(flat)
    assert got.dtype == expected.dtype and np.array_equal(bits(got), bits(expected))
    for out, a in zip(gpu.unpack(flat, shapes), arrays):
        back = gpu.to_numpy(out)
        assert back.shape == a.shape and np.array_equal(bits(back), bits(a))


def test_packing_kernels_compile_for_every_slot_count(gpu):
    """lavapipe binds 32 storage buffers (30 slots); an H200 takes all 128: check the WGSL for both."""
    for slots in (1, gpu.packing.slots, MAX_SLOTS):
        for op in ("pack", "unpack"):
            gpu.rt.device.create_shader_module(code=generate(op, slots))
