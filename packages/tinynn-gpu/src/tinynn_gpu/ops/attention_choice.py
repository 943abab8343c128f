"""Which kernels run attention in matmul precision "high", shape by shape: the tensor-core forward and backward
(attention_tensor.py, attention_tensor_backward.py) or the float32 ones (attention_tiled.py,
attention_backward_tiled.py; the per-row kernels where no tile fits). The forward and the backward are chosen
each on its own: f16 matrices may pay in one and not in the other.

There is a choice only where the tensor-core kernels passed their first-use check (attention_tensor_check.py: a
wrong answer keeps every precision on float32, whatever any timing says) and a tile of theirs takes the shape.
There, with autotuning on (TINYNN_AUTOTUNE; on by default on hardware adapters), both are timed on the device and
the faster runs, through the matmuls' machinery (matmul/selection.py's `choose`): GPU timestamps where the adapter
has them, the winner kept in the tuning cache (matmul/tuning_cache.py) under a key of its own ("high attention
forward B4 T1024 nh12 hs64"), and once a training step is captured the timing waits for the moments between
steps, after which the step is recorded again with the winners.

Without autotuning (TINYNN_AUTOTUNE=0, software adapters), and for shapes too small to be worth timing (the
matmuls' `tune_min_macs`, counting the forward's causal products, B nh T^2 hs), DEFAULT runs: float32, the
kernels measured on GPUs (BENCHMARKS.md). The tensor-core kernels are only known to answer right; they run where
they were timed faster. `tinynn info`'s "attention" entry says which of these holds, and what ran each shape
asked for so far, timed or not.
"""
from __future__ import annotations

TENSOR, FLOAT32 = "tensor", "float32"
DEFAULT = FLOAT32
SHOWN = 8  # shapes `tinynn info` lists


def key(direction: str, qkv_shape: tuple, n_head: int) -> str:
    """The tuning cache's key of a direction ("forward" or "backward") on a qkv of shape (B, T, 3C)."""
    batch, seq, c3 = qkv_shape
    return f"high attention {direction} B{batch} T{seq} nh{n_head} hs{c3 // 3 // n_head}"


class AttentionChoice:
    """The choices of one backend, made through its matmul selector, and the keys asked for so far."""

    def __init__(self, selector):
        self.selector = selector
        self.keys = {}  # the keys asked for, in order (a dict as an ordered set)

    def __call__(self, direction: str, qkv_shape: tuple, n_head: int, args: tuple, tensor, float32) -> str:
        """TENSOR or FLOAT32 for this direction and shape: the kept choice, else DEFAULT, timed first where
        autotuning is on and the shape is worth it, tensor(*args) against float32(*args)."""
        batch, seq, c3 = qkv_shape
        worth_tuning = batch * seq * seq * (c3 // 3) >= self.selector.tune_min_macs  # B nh T^2 hs
        name = key(direction, qkv_shape, n_head)
        self.keys[name] = None

        def runs(args):
            return {TENSOR: lambda: tensor(*args), FLOAT32: lambda: float32(*args)}
        return self.selector.choose(name, (TENSOR, FLOAT32), DEFAULT, args, runs, worth_tuning)

    def describe(self) -> str:
        """For `tinynn info`, where the tensor-core kernels passed their check: how "high" chooses, and what ran
        each shape asked for so far, timed or not."""
        mm = self.selector
        if not mm.autotune:
            how = "float32, in matmul precision 'high' too: the f16 tensor-core kernels passed their check but " \
                  "run only where timed faster, and autotuning is off"
        else:
            how = "in matmul precision 'high', per shape the faster of f16 tensor cores and float32, timed here " \
                  "(float32 where a shape is too small to time)"
        keys = list(self.keys)
        shapes = [f"{k.removeprefix('high attention ')}: " +
                  ("float32 until timed between steps" if k in mm.pending else
                   f"{mm.choices.get(k, DEFAULT)} ({'timed' if k in mm.timed else 'untimed'})")
                  for k in keys[:SHOWN]]
        more = [f"{len(keys) - SHOWN} more shapes"] if len(keys) > SHOWN else []  # a growing generation window
        return "; ".join([how] + shapes + more)
