"""The GPU backend's way to the NumPy reference: every op of the interface runs its kernel when its operands
allow, and otherwise the reference `Backend` provides under the same name (counted in `fallbacks`), decided
before the op records any dispatch. Operands that send an op to the CPU: an array on the host (too large for one
storage binding, or of a dtype no kernel takes: bool, uint8, ...), an int32 array where no int32 kernel exists;
an op may also refuse by raising OnCpu (a head size no kernel takes, say). A captured step that falls back is
not replayed.

How the refusal is found is decided per op, once, here:
- `reshape` is not wrapped: it only relabels an array (a host-resident one's host copy with it), whatever
  its operand.
- The eager forward's ops (REFUSE_IN_OP) pass every operand through `bindable` (float32 on the GPU) or a dtype
  check before they write anything but arrays of their own, so their wrapper (`refused_in_op`) only catches the
  refusal: no operand is checked twice on the eager forward's path.
- Every other op is wrapped by `with_cpu_fallback`, which checks its operands before it runs: in-place and
  list-taking ops must not stop half-way through their arrays.
"""
from __future__ import annotations

import functools
import inspect

from tinynn.backends import Backend
from tinynn_gpu.runtime.arrays import FLOAT32, KERNEL_DTYPES, GpuArray, OnCpu, PooledArray, TooLarge

# ops that take int32 arrays (and check their operands themselves); any other op given one runs on the CPU
INT_AWARE = {"full", "permute", "broadcast_to", "getitem", "getitem_backward", "concatenate", "unary",
             "binary", "scalar", "embedding_forward", "embedding_backward", "cross_entropy_backward",
             "embedding_with_positions_backward", "embed_window", "kv_cache_write_", "attention_decode",
             "sample_tokens_", "advance_"}  # generation's token ring, length and ids are int32 by design (decode.py)
VIEWS = {"reshape"}  # ops every operand can take on the GPU: no check, no fallback
# ops that refuse unfit operands themselves, raising TooLarge or OnCpu before they dispatch (see above)
REFUSE_IN_OP = {"matmul", "linear_forward", "layernorm_forward", "attention_forward",
                "embedding_with_positions_forward", "cross_entropy_forward", "classifier_forward"}


def cpu_reason(int_aware: bool, operands) -> str | None:
    """Why an op must run on the CPU with these operands (arrays, or lists and tuples of them), found before
    it records any dispatch (an in-place update that stopped half-way would then run twice on the first
    parameters); None: the GPU. `int_aware`: the op takes int32 arrays."""
    for x in operands:
        kind = x.__class__
        if kind is list or kind is tuple:
            for a in x:
                if isinstance(a, GpuArray) and _on_cpu(a, int_aware):
                    return _why(a)
        elif isinstance(x, GpuArray) and _on_cpu(x, int_aware):
            return _why(x)
    return None


def _on_cpu(a: GpuArray, int_aware: bool) -> bool:
    return a.buffer is None or (not int_aware and a.dtype is not FLOAT32 and a.dtype != FLOAT32)


def _why(a: GpuArray) -> str:
    return "an array exceeds the binding limit" if a.buffer is None and a.dtype in KERNEL_DTYPES else \
        f"no {a.dtype} kernel"


def with_cpu_fallback(cls, name):
    """cls's op `name` wrapped: run on the GPU when its operands allow, else (or when the op raises OnCpu or
    TooLarge before dispatching) the NumPy reference that `Backend` provides under the same name.
    Most ops pass here (the eager forward's do not: REFUSE_IN_OP), so the common case (positional operands, each
    a float32 array on the GPU, or not an array) is checked inline: plain loop, classes compared rather than
    isinstance (GpuArray's one subclass is PooledArray), the dtype by identity first (np.dtype's == converts its
    operand)."""
    gpu_op = getattr(cls, name)
    int_aware = name in INT_AWARE

    @functools.wraps(gpu_op)
    def op(self, *args, **kwargs):
        for x in args:  # cpu_reason's question, answered inline where it is plainly no
            kind = x.__class__
            if ((kind is PooledArray or kind is GpuArray) and
                    (x.buffer is None or (x.dtype is not FLOAT32 and not int_aware))) or kind is list or kind is tuple:
                reason = cpu_reason(int_aware, (*args, *kwargs.values()))
                break
        else:
            reason = cpu_reason(int_aware, kwargs.values()) if kwargs else None
        if reason is None:
            try:
                return gpu_op(self, *args, **kwargs)
            except (TooLarge, OnCpu) as e:  # an in-place op raises these before it dispatches anything
                reason = e
        return on_cpu(self, name, reason, *args, **kwargs)
    return op


def on_cpu(backend, name: str, reason, *args, **kwargs):
    """The NumPy reference's answer to op `name` (counted in `fallbacks`), where the GPU refused its operands for
    `reason` (a string, or the TooLarge or OnCpu raised); a step being captured is then not replayed."""
    out = getattr(Backend, name)(backend, *args, **kwargs)
    # after the reference, whose read-backs tell the step a reason of their own: this one says more
    backend.rt.not_capturable(f"{name} ran on the CPU ({reason})")
    return out


def refused_in_op(cls, name):
    """cls's op `name` (one of REFUSE_IN_OP) wrapped: the NumPy reference's answer where it refuses its operands.
    The wrapper takes the op's own parameters, written here from the op's signature (as dataclasses writes an
    __init__), once, at import: a wrapper taking *args and **kwargs cost 3% more instructions per eager dispatch,
    each of which passes here (BENCHMARKS.md)."""
    gpu_op = getattr(cls, name)
    signature = inspect.signature(gpu_op)
    params = list(signature.parameters)  # self and the op's arguments, named as Backend names them
    assert params == list(inspect.signature(getattr(Backend, name)).parameters), name  # on_cpu passes them in order
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in signature.parameters.values()), name  # no *, no **
    args = ", ".join(params)
    source = (f"def refused_in_op(gpu_op, on_cpu, refusals):\n"
              f"    def op({args}):\n"
              f"        try:\n"
              f"            return gpu_op({args})\n"
              f"        except refusals as e:\n"
              f"            return on_cpu({params[0]}, {name!r}, e, {', '.join(params[1:])})\n"
              f"    return op\n")
    namespace = {}
    exec(source, namespace)
    op = namespace["refused_in_op"](gpu_op, on_cpu, (TooLarge, OnCpu))
    op.__defaults__ = gpu_op.__defaults__  # the op's defaults, for its last parameters
    return functools.wraps(gpu_op)(op)


def install(cls) -> None:
    """Every op of the backend interface on cls but VIEWS wrapped: REFUSE_IN_OP's by refused_in_op, the others by
    with_cpu_fallback."""
    for name in Backend.ops():
        if name not in VIEWS:
            setattr(cls, name, (refused_in_op if name in REFUSE_IN_OP else with_cpu_fallback)(cls, name))
