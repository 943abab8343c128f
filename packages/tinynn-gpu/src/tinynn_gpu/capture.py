"""Step capture: record the dispatches of one call of a step function, then replay them.

A training step with fixed shapes makes the same dispatches every time, in the same order, on the same
buffers: only the values differ. So after a few eager calls (autotuning, pipeline compilation and buffer
reuse settle), one call is run with a `Tape` listening to the runtime, and every later call re-encodes the
tape's (pipeline, bind group, workgroups) list without running Python autograd again, the way CUDA graphs
or tinygrad's JIT do. The step reads its inputs from arrays written before each call (`write_`), so the
tape itself never changes.

What the tape cannot see it is told: the step's guard key (`Backend.capture`'s `key`) names everything the
recorded dispatches baked in besides array values (the parameters' arrays, hyperparameters passed as kernel
parameters, the mode, the input shapes). When the key changes, the tape is dropped and the step starts
over: eager calls, then a new capture.

The tape keeps every array its dispatches touch alive, so no buffer it uses is handed to anything else
between replays. Each call returns its loss in an array of its own (a 4-byte copy on the GPU), so a loss
kept from an earlier step keeps its value. A step the tape cannot represent (it reads a value back, draws
a dropout mask, falls back to NumPy) is run eagerly until its key changes, with the reason kept in
`CapturedStep.eager_reason`.
"""
from __future__ import annotations

from tinynn.tensor import Tensor

EAGER_CALLS = 3


class Tape:
    def __init__(self):
        self.events = []  # ("dispatch", pipeline, bind group, workgroups) | ("write", buffer, bytes)
        self.keep = []  # what holds the tape's buffers: arrays' leases, raw buffers
        self.broken = None  # why this step cannot be replayed
        self.programs = {}  # the events compiled for replay (runtime._compile), per recording path
        self.dispatches = 0

    def hold(self, value):
        self.keep.append(getattr(value, "_owner", None) or value)


class CapturedStep:
    def __init__(self, backend, fn, key=None):
        self.backend = backend
        self.fn = fn
        self.key = key
        self.captured_key = None
        self.calls = 0
        self.tape = None
        self.result = None
        self.eager_reason = None

    def __call__(self):
        if self.key is not None:
            key = self.key()
            if key != self.captured_key:
                self._start_over(key)
        self.calls += 1
        if self.eager_reason or self.calls <= EAGER_CALLS:
            return self.fn()
        if self.tape is None:
            return self._capture()
        rt = self.backend.rt
        rt.replay(self.tape)
        return Tensor(rt.copy(self.result), self.backend)

    def _start_over(self, key):
        if self.tape is not None:
            self.backend.rt.counters["recaptures"] += 1
        self.captured_key, self.calls, self.tape, self.result, self.eager_reason = key, 0, None, None, None

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
            return loss
        tape.hold(loss.data)
        tape.dispatches = sum(event[0] == "dispatch" for event in tape.events)
        self.tape, self.result = tape, loss.data
        return Tensor(rt.copy(loss.data), self.backend)
