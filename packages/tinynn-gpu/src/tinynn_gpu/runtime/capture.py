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

No buffer the tape uses is handed to anything else between replays: at the end of the capture the tape
keeps the arrays still alive and claims from the pool the buffers of those that died during the step
(which the step itself reused, as an eager step does: so a replay needs no more memory than an eager
step). Each call returns its result (a loss) in an array of its own, a copy on the GPU, so a loss kept from an
earlier step keeps its value; a step built with copy_result=False returns its own array instead (data-parallel
training's packed gradients, read back at once), and a step returning None returns None. A step the tape
cannot represent (it reads a value back, draws a dropout mask, falls back to NumPy) is run eagerly until its
key changes, with the reason kept in `CapturedStep.eager_reason`.
"""
from __future__ import annotations

import weakref
from collections import deque

from tinynn.tensor import Tensor
from tinynn_gpu.runtime.arrays import PooledArray

EAGER_CALLS = 3


class Tape:
    def __init__(self, runtime):
        self.runtime = runtime
        self.events = []  # ("dispatch", pipeline, bind group, workgroups) | ("write", buffer, bytes, byte offset)
        self.holders = {}  # pooled buffer -> (weakly) the PooledArray holding it when the step last used it
        self.keep = []  # what holds the tape's buffers: PooledArrays, arrays not from the pool
        self.claimed = []  # buffers taken out of the pool for the tape; they go back with it
        self.broken = None  # why this step cannot be replayed
        self.programs = {}  # the events compiled for replay (replay.compile_program), per recording path
        self.aheads = deque()  # Futures of the next replays' replay.Ahead, in order, recorded while the GPU runs
        self.dispatches = 0
        self.last_use = {}  # buffer -> the index of the last event that binds or writes it
        self.result_event = None  # the last event that uses the step's result (replay.compile_program)
        self.read_buffers = []  # MAP_READ buffers the replays copy the result into for its read-back (replay.py)
        self.turn = 0  # which of them the next replay uses

    def hold(self, value):
        """Keep the array the last event (a dispatch or write, just appended) uses."""
        holder = value.base or value
        if holder.__class__ is PooledArray:
            self.holders[value.buffer] = weakref.ref(holder)
        else:
            self.keep.append(holder)  # not from the pool (the kernels' error flags)
        self.last_use[value.buffer] = len(self.events) - 1

    def close(self):
        """End the capture: keep the pooled arrays still alive, claim the buffers whose arrays died."""
        dead = set()
        for buffer, ref in self.holders.items():
            holder = ref()
            if holder is None:
                dead.add(buffer)
            else:
                self.keep.append(holder)
        self.claimed = self.runtime.pool.claim(dead)
        if len(self.claimed) < len(dead):  # an array the tape never saw holds one of its buffers now
            self.broken = "a buffer the step used went to an array outside it"
        self.dispatches = sum(event[0] == "dispatch" for event in self.events)

    def __del__(self):
        # never submitted: the runtime releases them (once recorded, where still recording)
        self.runtime.orphaned_aheads.extend(self.aheads)
        for buffer in self.claimed:
            self.runtime.pool.give_back(buffer.size, buffer)


class CapturedStep:
    def __init__(self, backend, fn, key=None, copy_result=True):
        self.backend = backend
        self.fn = fn
        self.key = key
        self.copy_result = copy_result
        self.captured_key = None
        self.calls = 0
        self.tape = None
        self.result = None
        self.eager_reason = None

    def __call__(self):
        if self.key is not None:
            key = self.key()
            if key != self.captured_key:  # during the eager warm-up (the optimizer making its state) it just moves
                self.captured_key = key
                if self.tape is not None or self.eager_reason:
                    self._start_over()
        self.calls += 1
        if self.eager_reason or self.calls <= EAGER_CALLS:
            return self.fn()
        if self.tape is None:
            return self._capture()
        if self.result is not None and self.copy_result:  # the copy rides in the replay's own command buffers
            return self._wrap(self.backend.rt.replay(self.tape, self.result))
        self.backend.rt.replay(self.tape)
        return self._wrap(self.result)

    def _start_over(self):
        if self.tape is not None:
            self.backend.rt.counters["recaptures"] += 1
        self.calls, self.tape, self.result, self.eager_reason = 0, None, None, None

    def _capture(self):
        rt = self.backend.rt
        rt.flush()
        rt.tape = tape = Tape(rt)
        try:
            loss = self.fn()
            if loss is not None:
                tape.result_event = tape.last_use.get(loss.data.buffer)  # before the hold below counts as a use
                tape.hold(loss.data)
        finally:
            rt.tape = None
        if not tape.broken:
            tape.close()
        if tape.broken:
            self.eager_reason = tape.broken
            return loss
        self.tape, self.result = tape, None if loss is None else loss.data
        return self._returned(self.result)

    def _returned(self, result):
        """What a call of the recorded step returns: its result array, copied unless told not to."""
        if result is None or not self.copy_result:
            return self._wrap(result)
        return self._wrap(self.backend.rt.copy(result))

    def _wrap(self, array):
        return None if array is None else Tensor(array, self.backend)
