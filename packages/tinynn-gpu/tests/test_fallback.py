"""fallback.py: the ops that refuse unfit operands themselves (REFUSE_IN_OP, whose wrapper checks no operand) fall
back to the NumPy reference exactly as an op whose wrapper checks them does, for every operand that may send them
there."""
import inspect
from collections import Counter

import numpy as np
import pytest

from tinynn import backends
from tinynn.backends import Backend
from tinynn.tensor import Tensor
from tinynn_gpu import fallback
from tinynn_gpu.runtime import capture
from tinynn_gpu.backend import WgpuBackend
from tinynn_gpu.runtime.arrays import GpuArray


def operands(name, rng):
    """(arguments of op `name`, the positions of its float32 arrays, of its int32 arrays)."""
    def floats(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    if name == "matmul":
        return [floats(3, 4), floats(4, 5), False, False], (0, 1), ()
    if name == "linear_forward":
        # x (..., in), as a transformer's forward hands it (interface 4): the matmul plan folds its leading axes
        return [floats(2, 3, 4), floats(5, 4), floats(5), floats(2, 3, 5), "gelu", True], (0, 1, 2, 3), ()
    if name == "layernorm_forward":
        return [floats(3, 8), floats(8), floats(8), 1e-5, True], (0, 1, 2), ()
    if name == "attention_forward":
        return [floats(2, 4, 24), 2, 0.5, True], (0,), ()
    if name == "embedding_with_positions_forward":
        return [floats(7, 8), floats(6, 8), rng.integers(0, 7, (2, 4)).astype(np.int32)], (0, 1), (2,)
    if name == "classifier_forward":  # x, the head's weight (two padded rows) and bias, the targets
        return [floats(6, 4), floats(9, 4), floats(9), rng.integers(0, 7, 6).astype(np.int32), 7, -100, True], \
            (0, 1, 2), (3,)
    assert name == "cross_entropy_forward"
    return [floats(6, 7), rng.integers(0, 7, 6).astype(np.int32), -100, True], (0,), (1,)


def test_each_op_has_the_wrapper_its_kind_takes():
    """REFUSE_IN_OP's ops are wrapped by refused_in_op, VIEWS not at all, every other op by with_cpu_fallback."""
    kinds = {"refused_in_op": fallback.REFUSE_IN_OP, "with_cpu_fallback": set(Backend.ops()) - fallback.REFUSE_IN_OP
             - fallback.VIEWS}
    for name in Backend.ops():
        op = WgpuBackend.__dict__.get(name)
        kind = op.__code__.co_qualname.split(".")[0] if hasattr(op, "__wrapped__") else None
        assert name in kinds.get(kind, fallback.VIEWS), (name, kind)


@pytest.mark.parametrize("name", sorted(fallback.REFUSE_IN_OP))
def test_an_op_refusing_in_op_is_wrapped_with_its_own_parameters(name):
    """refused_in_op's wrapper takes the op's parameters, as Backend names them, and its defaults (not *args and
    **kwargs, a slower call on every eager dispatch): a call by keyword or leaving a default reaches the op."""
    op, gpu_op = WgpuBackend.__dict__[name], WgpuBackend.__dict__[name].__wrapped__
    code = op.__code__
    assert code.co_varnames[:code.co_argcount] == tuple(inspect.signature(getattr(Backend, name)).parameters)
    assert not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    assert op.__defaults__ == gpu_op.__defaults__ and op.__name__ == name


def test_a_wrapped_op_takes_keywords_and_defaults(gpu, rng):
    """linear_forward by keyword, its for_backward left at its default (True: the GELU input is kept), on the GPU."""
    x, w, bias = (rng.standard_normal(shape).astype(np.float32) for shape in ((3, 4), (5, 4), (5,)))
    fallbacks = sum(gpu.fallbacks.values())
    y, pre = gpu.linear_forward(gpu.from_numpy(x), weight=gpu.from_numpy(w), activation="gelu",
                                bias=gpu.from_numpy(bias))
    want_y, want_pre = backends.reference().linear_forward(x, w, bias, None, "gelu")
    np.testing.assert_allclose(gpu.to_numpy(y), want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gpu.to_numpy(pre), want_pre, rtol=1e-4, atol=1e-5)
    assert sum(gpu.fallbacks.values()) == fallbacks


@pytest.mark.parametrize("name", sorted(fallback.REFUSE_IN_OP))
@pytest.mark.parametrize("refused", ["on the host", "int32"])
def test_an_op_refusing_in_op_falls_back_for_each_operand(gpu, monkeypatch, rng, name, refused):
    """Each array operand in turn lives on the host (too large to bind), or, where the kernel reads float32, is an
    int32 array: the answer is the reference's, counted in `fallbacks`; with every operand fit, the GPU's."""
    args, float_at, int_at = operands(name, rng)
    at = (*float_at, *int_at) if refused == "on the host" else float_at
    for i in (None, *at):
        cpu_args = list(args)
        if i is not None and refused == "int32":
            cpu_args[i] = rng.integers(-3, 4, args[i].shape).astype(np.int32)
        ours = [gpu.from_numpy(a) if isinstance(a, np.ndarray) else a for a in cpu_args]
        if i is not None and refused == "on the host":
            ours[i] = GpuArray(None, args[i].shape, args[i].dtype, host=args[i].copy())
        monkeypatch.setattr(gpu, "fallbacks", Counter())
        got = getattr(gpu, name)(*ours)
        want = getattr(backends.reference(), name)(*cpu_args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert (g is None) == (w is None)
            if w is not None:
                np.testing.assert_allclose(gpu.to_numpy(g), w, rtol=1e-4, atol=1e-5, err_msg=f"operand {i}")
        assert gpu.fallbacks == (Counter() if i is None else Counter({name: 1})), f"operand {i}"


def test_an_empty_product_of_int32_arrays_is_the_references(gpu, monkeypatch):
    """An empty output needs no kernel, but int32 operands still go to the reference: its product is int32."""
    a, b = np.zeros((0, 4), np.int32), np.ones((4, 5), np.int32)
    monkeypatch.setattr(gpu, "fallbacks", Counter())
    got = gpu.matmul(gpu.from_numpy(a), gpu.from_numpy(b))
    assert (got.shape, got.dtype, gpu.fallbacks) == ((0, 5), np.int32, Counter({"matmul": 1}))


@pytest.mark.parametrize("name", ["matmul", "binary"])
def test_a_step_that_falls_back_while_captured_stays_eager(gpu, name):
    """An op that falls back inside a captured step (one refusing in op, one wrapped) leaves the step eager, also
    where it reads nothing back from the GPU (its operands live on the host): a replay would skip the NumPy
    reference's work and return the result of the capture's inputs."""
    rng = np.random.default_rng(0)
    x, w = (GpuArray(None, (4, 4), np.dtype(np.float32), host=np.zeros((4, 4), np.float32)) for _ in range(2))
    op = (lambda: gpu.matmul(x, w)) if name == "matmul" else (lambda: gpu.binary("add", x, w))
    step = gpu.capture(lambda: Tensor(op(), gpu))
    for _ in range(capture.EAGER_CALLS + 3):  # eager calls, the capture, then what would be replays
        xs, ws = rng.standard_normal((2, 4, 4)).astype(np.float32)
        gpu.write_(x, xs)
        gpu.write_(w, ws)
        np.testing.assert_allclose(step().numpy(), xs @ ws if name == "matmul" else xs + ws, rtol=1e-5, atol=1e-6)
    assert step.tape is None and f"{name} ran on the CPU" in step.eager_reason
