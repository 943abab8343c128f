"""The replay of a captured step (capture.py's Tape): its events compiled once into flat lists of what the
recording calls take (`compile_program`), then re-encoded every step in chunks, each in an encoder of its own.

Through wgpu-native's C functions (native.py) the first chunk is submitted at once from the calling thread,
so the GPU starts while the rest is recorded; with a submit thread (native.Submitter, on 4+ cores) the later
chunks and the writes between them are ended, finished and submitted there while the next is recorded, and
the replay returns once the last is handed over: the runtime's next use of the queue waits for the thread
(`Runtime.flush`). A step's staged inputs (its token ids, targets and optimizer values, `Runtime.write`) go
up in one queue write and are copied in at the start of the first chunk; its result is copied out at the
end of the last. Through wgpu-py's methods (where the direct calls failed their probe) every chunk is
submitted inline.
"""
from __future__ import annotations

from tinynn_gpu.pool import GpuArray, _round4

# Dispatches per submission in a replay: a small first chunk gets the GPU going; later ones grow, because each
# submission costs the host a fixed price (an encoder, finish's per-resource tracking, the driver's submit)
# while the GPU, slower per dispatch than the host in a training step, stays busy with what it was given.
# H200, lesson step, fixed chunks (experiments/replay_host_cost.py): 16 gave 5.80 ms, 32 5.67, 64 5.77,
# 128 6.33, the whole step in one submission 6.73; later, 32 then doubling: 8.36 us of host per dispatch
# against 9.30 for fixed 32s, at the same ms per step. With the first chunk submitted at once and the rest
# by the submit thread (two rounds each, lesson then mid): 16 then x4 gave 4.23/4.34 and 9.11/9.21 ms at
# 4.65/6.31 and 4.53/4.29 us of host per dispatch; 32 then x2 4.58/4.34 and 9.26/9.22 ms at 5.13/6.46 and
# 5.28/4.61 us; 8 then x4 4.33/4.55 and 9.13/9.14 ms (BENCHMARKS.md).
FIRST_CHUNK = 16
CHUNK_GROWTH = 4


class Replaying:
    """`Runtime.replay`, as a mixin of the runtime whose queue, caches and submit thread it uses."""

    def replay(self, tape, result: GpuArray | None = None) -> GpuArray | None:
        """Re-encode a captured step: the same dispatches and writes, no Python autograd, no cache look-ups.
        Submitted in chunks (`compile_program`), so the GPU starts on the step while the rest is encoded. With
        `result` (an array the step wrote), returns a copy of it, recorded into the step's last submission."""
        direct = self.native is not None
        program = tape.programs.get(direct)
        if program is None:
            program = tape.programs[direct] = compile_program(tape.events, direct)
        inputs = []  # the staged writes' copies (source, offset, destination, offset, bytes) for the first chunk
        if direct and self.encoder is None and self.staged_copies and program and program[0][0] == "dispatches":
            self._drain()  # only staged writes are waiting (a step's inputs): they ride in the first chunk
            inputs = [(self.upload_buffer._internal, at, buffer._internal, offset, nbytes)
                      for buffer, offset, at, nbytes in self.staged_copies]
            self.staged_copies.clear()
            self._upload_staged()
        else:
            self.flush()
        out = None if result is None else self.empty(result.shape, result.dtype)
        copies = []  # handles for the end of the last chunk, as `inputs`
        if out is not None and direct and program and program[-1][0] == "dispatches":
            copies = [(result.buffer._internal, 0, out.buffer._internal, 0, _round4(max(4, result.nbytes)))]
        if direct:
            self._replay_native(program, inputs, copies)
        else:
            self._replay_methods(program)
        if out is not None and not copies:
            self._copy_into(result, out)
        self.counters["dispatches"] += tape.dispatches
        self.counters["submissions"] += sum(kind == "dispatches" for kind, _ in program)
        self.counters["queue_writes"] += sum(kind == "write" for kind, _ in program)
        self.counters["replays"] += 1
        return out

    def _replay_native(self, program, inputs, copies):
        """Each chunk in an encoder of its own, through C calls; `inputs` (copies) go at the start of the
        first, `copies` at the end of the last. The first chunk is submitted here, at once (the GPU waits
        for it; a hand-over to a thread costs its wake-up). With a submitter, the later chunks and the
        writes between them go to its thread, which ends, finishes and submits chunk k while chunk k + 1 is
        recorded here, and the replay returns as soon as the last is handed over: the GPU is still busy with
        the first chunks, and the next use of the queue waits (`_drain`)."""
        calls = self.native
        queue_work = calls  # until the first chunk is submitted
        last = len(program) - 1
        for i, (kind, item) in enumerate(program):
            if kind == "write":
                queue_work.write(*item)
                continue
            encoder, compute_pass = calls.begin(inputs)
            calls.record(compute_pass, item)
            queue_work.submit(encoder, compute_pass, copies if i == last else ())
            queue_work, inputs = self.submitter or calls, ()

    def _replay_methods(self, program):
        for kind, item in program:
            if kind == "write":
                self.queue.write_buffer(item[0], item[2], item[1])
                continue
            encoder = self.device.create_command_encoder()
            compute_pass = encoder.begin_compute_pass()
            set_pipeline, set_bind_group, dispatch = (compute_pass.set_pipeline, compute_pass.set_bind_group,
                                                      compute_pass.dispatch_workgroups)
            for pipe, dispatches in item:
                set_pipeline(pipe)
                for group, x, y, z in dispatches:
                    set_bind_group(0, group)
                    dispatch(x, y, z)
            compute_pass.end()
            self.queue.submit([encoder.finish()])


def compile_program(events, direct: bool) -> list[tuple]:
    """A tape's events as the replay runs them: ("write", (buffer, bytes, byte offset)) and ("dispatches", runs), the
    first chunk of dispatches FIRST_CHUNK long and each one after a full chunk CHUNK_GROWTH times longer (a
    write ends a chunk early; the next keeps its length), a run being
    (pipeline, [(bind group, x, y, z), ...]) under one pipeline. Direct calls take native handles; the tape's
    events keep their objects (and so the handles) alive."""
    handle = (lambda obj: obj._internal) if direct else (lambda obj: obj)
    program, limit, count, last, runs = [], FIRST_CHUNK, 0, None, None
    for event in events:
        if event[0] == "write":
            program.append(("write", (handle(event[1]), event[2], event[3])))
            runs = None  # a write goes in before the dispatches after it: they start a new chunk
            continue
        _, pipe, group, (x, y, z) = event
        if runs is None or count == limit:
            if runs is not None:
                limit *= CHUNK_GROWTH
            runs, count, last = [], 0, None
            program.append(("dispatches", runs))
        if pipe is not last:
            runs.append((handle(pipe), []))
            last = pipe
        runs[-1][1].append((handle(group), x, y, z))
        count += 1
    return program
