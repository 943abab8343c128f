"""Prepared launches: one per pipeline, slots, parameters and workgroups, bind groups per buffers, and the
forwards that keep theirs computing on each call's arrays and parameters."""
import gc

import numpy as np

from tinynn import backends


def test_kept_launches_run_on_the_arrays_and_parameters_of_each_call(gpu, rng):
    """The forwards that keep their prepared dispatch (Runtime.keep, the blocked matmul's plans) against the NumPy
    reference at one shape, called again with other arrays (the first ones freed, their buffers reused), other
    parameters (eps, ignore_index, the linear's epilogue) and a split-K variant: a kept launch that bound stale
    arrays or parameters would give the first call's answer."""
    ref = backends.reference()
    n, c, heads, seq = 24, 32, 2, 12

    def close(got, want):
        np.testing.assert_allclose(gpu.to_numpy(got), want, rtol=1e-4, atol=1e-5)

    def data(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    kept = len(gpu.rt.launches)
    for call in range(3):
        x, w, b, res = data(n, c), data(3 * c, c), data(3 * c), data(n, 3 * c)
        eps, ignore = (1e-5, 1e-3, 1e-5)[call], (-100, 3, -100)[call]
        y, _, _ = gpu.layernorm_forward(gpu.from_numpy(x), gpu.from_numpy(w[0]), gpu.from_numpy(b[:c]), eps, False)
        close(y, ref.layernorm_forward(x, w[0], b[:c], eps)[0])
        epilogues = [dict(bias=b), dict(bias=b, activation="gelu"), dict(residual=res)]
        for variant in ("blocked 32x64x16/4x4", "blocked 64x64x16/8x4 split4"):  # split-K: a finish dispatch
            gpu.mm.forced = variant
            try:
                parts = epilogues[call]
                got, _ = gpu.linear_forward(gpu.from_numpy(x), gpu.from_numpy(w), **{
                    k: v if isinstance(v, str) else gpu.from_numpy(v) for k, v in parts.items()}, for_backward=False)
                assert gpu.mm.describe() == variant  # the forced variant ran, not a plan kept from the other
            finally:
                gpu.mm.forced = None
            close(got, ref.linear_forward(x, w, **parts)[0])
        targets = rng.integers(0, 3 * c, n)
        targets[::5] = ignore
        loss, _, _ = gpu.cross_entropy_forward(gpu.from_numpy(res), gpu.from_numpy(targets), ignore, False)
        close(loss, ref.cross_entropy_forward(res, targets, ignore)[0])
        idx = rng.integers(0, n, (2, seq))
        close(gpu.embedding_with_positions_forward(gpu.from_numpy(x), gpu.from_numpy(res[:seq, :c]),
                                                   gpu.from_numpy(idx)),
              ref.embedding_with_positions_forward(x, res[:seq, :c], idx))
        qkv = data(2, seq, 3 * c)
        y, _ = gpu.attention_forward(gpu.from_numpy(qkv), heads, 0.25, False)
        close(y, ref.attention_forward(qkv, heads, 0.25)[0])
        del x, y, loss
        gc.collect()
    # a launch per op and setting (eps, ignore_index: two each), none more for the repeats
    assert len(gpu.rt.launches) - kept <= 2 + 2 + 1 + 1


def test_prepare_gives_one_launch_per_content_and_its_bind_groups_are_per_buffers(gpu):
    """Runtime.prepare hands back the Launch it made for the same pipeline, slots, parameters and workgroups, and
    a new one when any of them changes; a Launch's bind groups are keyed by the buffers, so a launch over other
    buffers (another array, another shape's) makes its own and computes on them, never on the first ones."""
    rt = gpu.rt

    def doubling(n, value=2.0, groups=1):
        return rt.prepare("elementwise", "scalar_main", groups, ("a", "out"), {"n": n, "op": 1, "value": value})
    launch = doubling(4)
    assert doubling(4) is launch
    assert all(other is not launch for other in (doubling(8), doubling(4, value=3.0), doubling(4, groups=2)))
    a, b = rt.upload(np.arange(4, dtype=np.float32)), rt.upload(np.arange(10, 14, dtype=np.float32))
    out_a, out_b = rt.empty((4,)), rt.empty((4,))
    made = rt.counters["bind_groups_created"]
    rt.launch(launch, (a, out_a))
    rt.launch(launch, (b, out_b))
    rt.launch(launch, (a, out_a))
    assert rt.counters["bind_groups_created"] - made == 2
    assert rt.read(out_a).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert rt.read(out_b).tolist() == [20.0, 22.0, 24.0, 26.0]
    wide, out_wide = rt.upload(np.ones((3, 4), np.float32)), rt.empty((3, 4))  # another bucket: another buffer
    rt.launch(doubling(12), (wide, out_wide))
    assert rt.read(out_wide).tolist() == [[2.0] * 4] * 3
