"""The replay of a captured step (capture.py's Tape): its events compiled once into flat lists of what the
recording calls take (`compile_program`), then recorded anew for every step, ahead of the step's turn.

A WebGPU command buffer runs once: a step cannot be submitted twice the way a CUDA graph is replayed. But
its commands never change, only the values in its arrays (capture.py). So each replay submits command
buffers recorded and finished while the GPU ran the steps before (an `Ahead`), and then starts recording
the one `RECORDED_AHEAD` steps after it: on a worker thread where the machine has the cores (the caller returns
at once), else before returning. Either way the recording overlaps the GPU's work, and a synced step's critical
path, from the host's read-back to the GPU's next start, is the step's Python, its inputs' queue write and the
first submit; and that read-back returns before the step's end (below), so the path is hidden behind the GPU's
work. Two ahead, not one: with the next step's recording alone, the caller would at times wait for the thread,
which shares the GIL (BENCHMARKS.md, "Kernel tuning notes", has the measurements).

A step's dispatches go in as few command buffers as its writes allow, each submitted on its own, and the one
that makes the step's result ends there (below): a training step's two, its forward's and the rest. Each
submission costs host and GPU time, and with the replays recorded ahead nothing waits for a first part of the
step to be submitted early, so the step is cut no further.

A step's staged inputs (its token ids, targets and optimizer values, `Runtime.write`) go up in one queue
write and are copied in at the start of its first command buffer, so an `Ahead` is used only by a replay
whose staged inputs are laid out as they were when it was recorded (the same copies: a training step's
always are). Through wgpu-py's methods (where the direct calls failed their probe) each replay records and
submits inline.

With the direct calls, the step's result is copied out, into an array allocated with it, by the command buffer
of the last dispatch that uses it (`compile_program` ends a command buffer there; through wgpu-py's methods,
after the step), and also into a MAP_READ buffer for the host, with the kernels' error flags so far (a flag
raised later in the step comes back with the next read-back). A training step's loss is final after the forward, so the
loop's `loss.item()` returns while the GPU still runs the backward and the optimizer, the next step's inputs
and command buffers go in behind them, and the GPU does not wait for the host between synced steps (a bad token
id or target is flagged by the forward's kernels, so it raises at that read-back as before).
"""
from __future__ import annotations

import time
import weakref
from concurrent.futures import Future

from tinynn_gpu.runtime.arrays import GpuArray
from tinynn_gpu.runtime.pool import _round4

RECORDED_AHEAD = 2  # replays recorded before their turn
READ_TURNS = RECORDED_AHEAD + 1  # read-back buffers per tape: one for the host, one for each replay recorded ahead


class Ahead:
    """A replay recorded before its turn: the staged-input copies it starts with, its queue work in order
    (("write", (buffer, bytes, offset)) and ("buffer", finished command buffer)), and the array the step's
    result is copied into (or None). `keep` holds the objects behind the handles it records (the tape's
    events, the upload buffer): the tape may be dropped, or the upload buffer replaced, while it records.
    The result is copied out at the end of command buffer `result_at` of the program (None: its last), and with
    `read` (a MAP_READ buffer, the byte offset of the error flags in it, the runtime's error-flags buffer) also into
    that buffer for the host, with the flags: `read_number` is the number of command buffers before the one that
    does it."""
    __slots__ = ("calls", "inputs", "result", "out", "keep", "work", "read", "read_number")

    def __init__(self, calls, program, inputs: list, result: GpuArray | None, out: GpuArray | None, keep,
                 result_at: int | None = None, read: tuple | None = None):
        self.calls, self.inputs, self.result, self.out, self.keep, self.work = calls, inputs, result, out, keep, []
        self.read, self.read_number = read, None
        copies = [] if out is None else [(result.buffer._internal, 0, out.buffer._internal, 0,
                                          _round4(max(4, result.nbytes)))]
        if copies and read is not None:
            staging, flags_at, flags = read
            copies += [(out.buffer._internal, 0, staging._internal, 0, flags_at),
                       (flags._internal, 0, staging._internal, flags_at, 4)]
        if copies and result_at is None and (not program or program[-1][0] == "write"):
            program = [*program, ("dispatches", [])]  # the result is copied after the step's last write
        result_at = len(program) - 1 if result_at is None else result_at
        try:
            for i, (kind, item) in enumerate(program):
                if kind == "write":
                    self.work.append((kind, item))
                    continue
                encoder, compute_pass = calls.begin(inputs)
                inputs = ()
                calls.record(compute_pass, item)
                if i == result_at:
                    self.read_number = sum(kind == "buffer" for kind, _ in self.work)
                self.work.append(("buffer", calls.finish(encoder, compute_pass, copies if i == result_at else ())))
        except BaseException:
            self.release()
            raise

    def fits(self, calls, inputs: list, result: GpuArray | None, read: tuple | None) -> bool:
        """Whether a replay through `calls`, with these staged-input copies, this result and read-back buffer, can
        use it."""
        return self.calls is calls and self.inputs == inputs and self.result is result and self.read == read

    def submit(self) -> list[int]:
        """Its writes and command buffers to the queue, in order, each buffer a submission of its own. What a
        failure leaves unsubmitted is released. Returns the submissions' indices."""
        calls, work, submissions = self.calls, self.work, []
        self.work = []
        for i, (kind, item) in enumerate(work):
            try:
                if kind == "buffer":
                    submissions.append(calls.submit([item]))  # releases it, also when it raises
                else:
                    calls.write(*item)
            except BaseException:
                self.work = work[i + 1:]
                self.release()
                raise
        return submissions

    def release(self) -> None:
        """Drop what was never submitted."""
        self.calls.release([item for kind, item in self.work if kind == "buffer"])
        self.work = []


class Replayer:
    """`Runtime.replay` for one recording path, chosen with the recorder (`Runtime.use_native`): MethodReplayer or
    NativeReplayer. A part of the runtime, whose queue, pool and recording thread it uses."""
    direct = False  # whether the program holds native handles

    def __init__(self, runtime):
        self.rt = runtime

    def replay(self, tape, result: GpuArray | None = None) -> GpuArray | None:
        """Run a captured step again: the same dispatches and writes, no Python autograd, no cache look-ups.
        With `result` (an array the step wrote), returns a copy of it; with the direct calls made by the command
        buffer of the step's last dispatch that uses it, which copies it for the host too, and the next read-back
        of that copy (`Runtime.read`, `early_read`) waits for that command buffer alone."""
        compiled = tape.programs.get(self.direct)
        if compiled is None:
            compiled = tape.programs[self.direct] = compile_program(tape.events, self.direct,
                                                                    None if result is None else tape.result_event)
        program, result_at = compiled
        self.rt.early_read = None  # this step runs after the last one's result: a read-back of that waits for it too
        self.release_orphans()
        ahead = self._recorded(tape.aheads.popleft()) if tape.aheads else None  # raises the recording's error
        out, submissions = self.run(tape, program, result_at, result, ahead)
        counters = self.rt.counters
        counters["dispatches"] += tape.dispatches
        counters["submissions"] += submissions
        counters["queue_writes"] += sum(kind == "write" for kind, _ in program)
        counters["replays"] += 1
        return out

    def _drop(self, tape, ahead: Ahead) -> None:
        """A replay recorded ahead that this one cannot use (other inputs, the other path, another turn), and those
        recorded after it, released (those once recorded)."""
        ahead.release()
        self.rt.orphaned_aheads.extend(tape.aheads)
        tape.aheads.clear()

    def _result_array(self, result: GpuArray | None) -> GpuArray | None:
        return None if result is None else self.rt.empty(result.shape, result.dtype)

    def _recorded(self, future: Future) -> Ahead:
        """The replay a future recorded, its recording's error raised. Where the recording thread is still at it,
        the caller's wait counts in `record_wait_us` (part of its host time, which `tinynn bench` reports)."""
        if not future.done():
            t0 = time.perf_counter()
            future.exception()
            self.rt.counters["record_wait_us"] += 1e6 * (time.perf_counter() - t0)
        return future.result()

    def release_orphans(self) -> None:
        """Release the recordings of dropped tapes (capture.py) once recorded, here rather than on the
        recording thread: releasing one returns its result array to the pool, which is this thread's."""
        for _ in range(len(self.rt.orphaned_aheads)):
            future = self.rt.orphaned_aheads.popleft()
            if not future.done():
                self.rt.orphaned_aheads.append(future)
            elif future.exception() is None:  # a recording that failed released what it had made
                future.result().release()


class MethodReplayer(Replayer):
    """Through wgpu-py's methods: each replay recorded and submitted when it is called, its result copied after it."""

    def run(self, tape, program, result_at, result, ahead) -> tuple:
        self.rt.flush()
        if ahead is not None:  # recorded through the direct calls, before a switch to this path
            self._drop(tape, ahead)
        return self._replay_methods(program, result), sum(kind == "dispatches" for kind, _ in program)

    def _replay_methods(self, program, result: GpuArray | None) -> GpuArray | None:
        for kind, item in program:
            if kind == "write":
                self.rt.queue.write_buffer(item[0], item[2], item[1])
                continue
            encoder = self.rt.device.create_command_encoder()
            compute_pass = encoder.begin_compute_pass()
            set_pipeline, set_bind_group, dispatch = (compute_pass.set_pipeline, compute_pass.set_bind_group,
                                                      compute_pass.dispatch_workgroups)
            for pipe, dispatches in item:
                set_pipeline(pipe)
                for group, x, y, z in dispatches:
                    set_bind_group(0, group)
                    dispatch(x, y, z)
            compute_pass.end()
            self.rt.queue.submit([encoder.finish()])
        out = self._result_array(result)
        if out is not None:
            self.rt.copy_into(result, out)
        return out


class NativeReplayer(Replayer):
    """Through the direct calls: each replay submits command buffers recorded ahead (`Ahead`), then records the
    next ones, on the recording thread where there is one."""
    direct = True

    def run(self, tape, program, result_at, result, ahead) -> tuple:
        rt, transfer = self.rt, self.rt.transfer
        inputs = []  # the staged writes' copies (source, offset, destination, offset, bytes)
        if rt.recording.encoder is None and transfer.staged_copies and program and program[0][0] == "dispatches":
            # only staged writes are waiting (a step's inputs): they ride in the first command buffer
            inputs = [(transfer.upload_buffer._internal, at, buffer._internal, offset, nbytes)
                      for buffer, offset, at, nbytes in transfer.staged_copies]
            transfer.staged_copies.clear()
            transfer.upload_staged()
        else:
            rt.flush()
        read = self._read_buffer(tape, result, tape.turn)
        if ahead is not None and not ahead.fits(rt.native, inputs, result, read):
            self._drop(tape, ahead)  # recorded again below
            ahead = None
        keep = (tape.events, transfer.upload_buffer, tape.read_buffers)
        if ahead is None:
            ahead = Ahead(rt.native, program, inputs, result, self._result_array(result), keep, result_at, read)
        out = ahead.out
        indices = ahead.submit()
        if read is not None:
            rt.early_read = (weakref.ref(out), read, indices[ahead.read_number])
        tape.turn = (tape.turn + 1) % READ_TURNS
        while len(tape.aheads) < RECORDED_AHEAD:
            turn = (tape.turn + len(tape.aheads)) % READ_TURNS
            tape.aheads.append(self._record_ahead(program, inputs, result, keep, result_at,
                                                  self._read_buffer(tape, result, turn)))
        return out, len(indices)

    def _read_buffer(self, tape, result: GpuArray | None, turn: int) -> tuple | None:
        """(MAP_READ buffer, byte offset of the error flags in it, the error-flags buffer) that the replay of a
        turn copies its result and the flags into for the host: `READ_TURNS` buffers per tape, taken in turns, so
        that the replays recorded ahead copy into the others while the host reads one."""
        if result is None:
            return None
        flags_at = _round4(result.nbytes)
        if not tape.read_buffers:
            tape.read_buffers[:] = [self.rt.read_back_buffer(flags_at + 4) for _ in range(READ_TURNS)]
        return tape.read_buffers[turn], flags_at, self.rt.error_flags.buffer

    def _record_ahead(self, program, inputs, result, keep, result_at, read) -> Future:
        """A later replay's `Ahead`, recorded on the worker thread (`Runtime.record_thread`), else here. Either way
        its error, if any, raises in the replay that would use it, not in this one, whose step is submitted."""
        try:
            out = self._result_array(result)  # the pool is not the thread's to use
            args = (self.rt.native, program, inputs, result, out, keep, result_at, read)
            if self.rt.record_thread is not None:
                return self.rt.record_thread.submit(self._timed_ahead, *args)
            done = Future()
            done.set_result(Ahead(*args))
        except Exception as e:
            done = Future()
            done.set_exception(e)
        return done

    def _timed_ahead(self, *args) -> Ahead:
        """`Ahead(*args)` on the recording thread, its busy time counted (`tinynn bench` reports it)."""
        t0 = time.perf_counter()
        try:
            return Ahead(*args)
        finally:
            self.rt.counters["record_thread_us"] += 1e6 * (time.perf_counter() - t0)


def compile_program(events, direct: bool, result_event: int | None = None) -> tuple[list, int | None]:
    """A tape's events as the replay runs them: (program, result_at). The program is a list of ("write", (buffer,
    bytes, byte offset)) and ("dispatches", runs), the dispatches of one command buffer, a run being (pipeline,
    [(bind group, x, y, z), ...]) under one pipeline. A command buffer ends at a write and after event
    `result_event` (the last to use the step's result: a training step's loss is final after the forward, and its
    read-back need not wait for the backward). result_at: the program index of that command buffer (None where
    result_event is None or no dispatch). Direct calls take native handles; the tape's events keep their objects
    (and so the handles) alive."""
    handle = (lambda obj: obj._internal) if direct else (lambda obj: obj)
    program, last, runs, result_at = [], None, None, None
    for i, event in enumerate(events):
        if event[0] == "write":
            program.append(("write", (handle(event[1]), event[2], event[3])))
            runs = None  # a write goes in before the dispatches after it: they go in a command buffer of their own
            continue
        _, pipe, group, (x, y, z) = event
        if runs is None:
            runs, last = [], None
            program.append(("dispatches", runs))
        if pipe is not last:
            runs.append((handle(pipe), []))
            last = pipe
        runs[-1][1].append((handle(group), x, y, z))
        if i == result_event:
            result_at, runs = len(program) - 1, None  # the result's command buffer ends here
    return program, result_at
