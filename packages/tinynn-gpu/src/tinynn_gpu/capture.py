"""Step capture: record the dispatches of one call of a step function, then replay them.

A training step with fixed shapes makes the same dispatches every time, in the same order, on the same
buffers: only the values differ. So after a few eager calls (autotuning, pipeline compilation and buffer
reuse settle), one call is run with a `Tape` listening to the runtime, and every later call re-encodes the
tape's (pipeline, bind group, workgroups) list without running Python autograd again, the way CUDA graphs
or tinygrad's JIT do. The step reads its inputs from arrays written before each call (`write_`), so the
tape itself never changes.

The tape keeps every array its dispatches touch alive, so no buffer it uses is handed to anything else
between replays. A step the tape cannot represent (it reads a value back, draws a dropout mask, falls back
to NumPy) is run eagerly from then on, with the reason kept in `CapturedStep.eager_reason`.
"""
from __future__ import annotations

from tinynn.tensor import Tensor

EAGER_CALLS = 3


class Tape:
    def __init__(self):
        self.events = []  # ("dispatch", pipeline, bind group, workgroups) | ("write", buffer, bytes)
        self.keep = []  # what holds the tape's buffers: arrays' leases, raw buffers
        self.broken = None  # why this step cannot be replayed

    def hold(self, value):
        self.keep.append(getattr(value, "_owner", None) or value)


class CapturedStep:
    def __init__(self, backend, fn):
        self.backend = backend
        self.fn = fn
        self.calls = 0
        self.tape = None
        self.result = None
        self.eager_reason = None

    def __call__(self):
        self.calls += 1
        if self.eager_reason or self.calls <= EAGER_CALLS:
            return self.fn()
        if self.tape is None:
            return self._capture()
        self.backend.rt.replay(self.tape)
        return Tensor(self.result, self.backend)

    def _capture(self):
        rt = self.backend.rt
        rt.flush()
        rt.tape = tape = Tape()
        try:
            loss = self.fn()
        finally:
            rt.tape = None
        if tape.broken:
            self.eager_reason = tape.broken
        else:
            self.tape, self.result = tape, loss.data
            tape.hold(loss.data)
        return loss
