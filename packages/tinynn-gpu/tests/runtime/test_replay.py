"""The replay of a captured step: its program laid out as intended, each replay submitting the step recorded
ahead of it for the inputs written since and recording a later one (inline and on the worker thread), read-backs
ordered behind the command buffers that make them, and recordings dropped or failed ahead of their turn."""
import gc
import threading
import time
from concurrent.futures import wait

import numpy as np
import pytest

import tinynn

from tinynn_gpu.runtime import native, replay, runtime, transfer
from tinynn_gpu.runtime.webgpu import wgpu


class Handle:
    """A stand-in for a wgpu object: what direct calls take is its `_internal`."""
    def __init__(self, name):
        self._internal = name


@pytest.mark.parametrize("direct", [True, False])
def test_a_replay_program_keeps_runs_of_one_pipeline_in_command_buffers_between_its_writes(direct):
    pipe, other, group, x, y = map(Handle, ("pipe", "other", "group", "x", "y"))
    dispatches = [("dispatch", other if i == 10 else pipe, group, (i + 1, 1, 1)) for i in range(35)]
    events = [("write", x, b"1", 0)] + dispatches[:30] + [("write", y, b"2", 8)] + dispatches[30:]
    program, result_at = replay.compile_program(events, direct)
    assert result_at is None
    name = (lambda h: h._internal) if direct else (lambda h: h)
    assert [kind for kind, _ in program] == ["write", "dispatches", "write", "dispatches"]
    assert program[0][1] == (name(x), b"1", 0) and program[2][1] == (name(y), b"2", 8)
    chunks = [[(p, len(d)) for p, d in runs] for kind, runs in program if kind == "dispatches"]
    assert chunks == [[(name(pipe), 10), (name(other), 1), (name(pipe), 19)], [(name(pipe), 5)]]
    assert program[3][1] == [(name(pipe), [(name(group), x, 1, 1) for x in range(31, 36)])]
    # the result last used by the step's 13th dispatch (event 13): its command buffer ends there, and is named
    program, result_at = replay.compile_program(events, direct, result_event=13)
    chunks = [[(p, len(d)) for p, d in runs] for kind, runs in program if kind == "dispatches"]
    assert chunks == [[(name(pipe), 10), (name(other), 1), (name(pipe), 2)], [(name(pipe), 17)], [(name(pipe), 5)]]
    assert result_at == 1 and program[1][1][-1][1][-1] == (name(group), 13, 1, 1)


def test_a_replayed_results_read_back_waits_for_the_command_buffer_that_made_it(gpu, monkeypatch, ahead_path):
    """A step's result made early (a training step's loss, before its backward) is copied for the host by the
    command buffer of its last use, and its read-back waits for that submission, not the step's later ones: the
    host has the value while the GPU runs the rest. Anything recorded between the replay and the read-back sends
    it the usual way (a copy after everything), with the same value."""
    reads, read = [], native.NativeCalls.read
    submitted, submit = [], native.NativeCalls.submit

    def read_spy(calls, buffer, parts, until=None):
        reads.append(until)
        return read(calls, buffer, parts, until)

    def submit_spy(calls, command_buffers):
        submitted.append(submit(calls, command_buffers))
        return submitted[-1]
    monkeypatch.setattr(native.NativeCalls, "read", read_spy)
    monkeypatch.setattr(native.NativeCalls, "submit", submit_spy)
    x, kept = tinynn.tensor(np.zeros(4), backend=gpu), []

    def result_then_more():
        loss = (x * 2.0).sum()
        y = x
        for _ in range(6):  # after the result: the step's later command buffers
            y = y * 2.0 + 1.0
        kept[:] = [y]
        return loss
    step = gpu.capture(result_then_more)
    for value in range(1, 7):
        gpu.write_(x.data, np.full(4, value, np.float32))
        reads.clear()
        submitted.clear()
        assert step().item() == 8.0 * value
        assert kept[0].numpy().tolist() == [value * 64.0 + 63.0] * 4
    program, result_at = step.tape.programs[True]
    assert result_at is not None
    result_number = sum(kind == "dispatches" for kind, _ in program[:result_at])
    until, _ = reads  # the loss's, then the kept array's (the usual way)
    assert until == submitted[result_number] and result_number < sum(kind == "dispatches" for kind, _ in program) - 1
    # a command between the replay and the read-back: the read-back copies after it, as any other does
    reads.clear()
    gpu.write_(x.data, np.full(4, 10.0, np.float32))
    loss = step()
    gpu.full((3,), 1.0)
    assert loss.item() == 80.0 and reads[0] is None
    loss = step()  # and a write into the result itself: read as written
    gpu.write_(loss.data, np.array(5.0, np.float32))
    assert loss.item() == 5.0 and reads[1] is None


def test_a_replay_between_a_replayed_result_and_its_read_back_sends_the_read_back_after_it(gpu, ahead_path):
    """Another step replayed after a step's result and before its read-back (one that returns nothing) is work
    recorded since, like any other: the read-back copies after it, and an out-of-range id in it raises there."""
    from tinynn.errors import TinynnError
    x = tinynn.tensor(np.zeros(4), backend=gpu)
    weight, ids = gpu.from_numpy(np.ones((3, 2), np.float32)), gpu.from_numpy(np.zeros(4, np.int32))

    def looked_up():
        gpu.embedding_forward(weight, ids)
    first, second = gpu.capture(lambda: (x * 2.0).sum()), gpu.capture(looked_up)
    for _ in range(6):  # eager, captured, then replayed
        first().item()
        second()
    gpu.write_(ids, np.array([0, 1, 3, 2], np.int32))  # 3: one past the rows
    loss = first()
    second()
    with pytest.raises(TinynnError, match="embedding: an id is outside"):
        loss.item()
    gpu.write_(ids, np.zeros(4, np.int32))
    assert first().item() == 0.0  # raised once


def test_a_runtimes_worker_thread_ends_with_the_runtime(gpu):
    rt = runtime.Runtime(gpu.ctx)
    if rt.native is None:
        pytest.fail(f"the direct path should work on {gpu.device_name}: {rt.native_reason}")
    rt.use_native(rt.native, "", threaded=True)
    rt.record_thread.submit(lambda: None).result()  # its thread starts with its first job
    (thread,) = rt.record_thread._threads
    assert thread.is_alive()
    del rt
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.fixture(params=["inline", "threaded"])
def ahead_path(request, gpu):
    """Later replays recorded before the call returns, then on the worker thread."""
    rt = gpu.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.record_thread is not None
    assert calls is not None, f"the direct path should work on {gpu.device_name}: {reason}"
    rt.use_native(calls, reason, threaded=request.param == "threaded")
    yield request.param
    rt.use_native(calls, reason, threaded)


def counted_aheads(monkeypatch, rt):
    """The threads each replay.Ahead was recorded on, and the command buffers released unsubmitted. Earlier tests'
    dropped tapes are collected and their recordings released first: a garbage collection during the test would
    otherwise orphan them there, and the next flush would count their release (seen once on the H200)."""
    gc.collect()
    wait(list(rt.orphaned_aheads))
    rt.flush()
    assert not rt.orphaned_aheads
    made, released = [], []
    init, release = replay.Ahead.__init__, replay.Ahead.release

    def recorded(self, *args):
        made.append(threading.current_thread().name)
        init(self, *args)

    def counted(self):
        released.extend(item for kind, item in self.work if kind == "buffer")
        release(self)
    monkeypatch.setattr(replay.Ahead, "__init__", recorded)
    monkeypatch.setattr(replay.Ahead, "release", counted)
    return made, released


def doubling_step(gpu):
    """A captured step reading an input written before each call (staged, or a queue write when large)."""
    x = tinynn.tensor(np.zeros(4), backend=gpu)
    step = gpu.capture(lambda: x * 2.0 + x)  # two dispatches, the second reading x again
    for value in range(4):  # eager calls, then the capture
        gpu.write_(x.data, np.full(4, value, np.float32))
        assert step().numpy().tolist() == [3.0 * value] * 4
    return x, step


def test_a_replay_submits_the_step_recorded_ahead_for_the_inputs_written_since(gpu, monkeypatch, ahead_path):
    """Each replay records the ones `RECORDED_AHEAD` after it (on the worker thread when there is one), and those
    replays submit them, with the inputs written in between: a replay's result is that call's, not an earlier's."""
    made, released = counted_aheads(monkeypatch, gpu.rt)
    x, step = doubling_step(gpu)
    results = []
    for value in (10.0, 20.0, 30.0):
        gpu.write_(x.data, np.full(4, value, np.float32))
        results.append(step())  # kept: each call's result is an array of its own
    assert [r.numpy().tolist() for r in results] == [[30.0] * 4, [60.0] * 4, [90.0] * 4]
    wait(list(step.tape.aheads))
    worker = "MainThread" if ahead_path == "inline" else "tinynn-record_0"
    # the first replay records its own and the next RECORDED_AHEAD; each later one, one more
    assert made == ["MainThread"] + [worker] * (replay.RECORDED_AHEAD + 2)
    assert released == []
    del step
    gc.collect()
    gpu.sync()  # the runtime's next submission releases what a dropped tape had recorded ahead
    assert len(released) == replay.RECORDED_AHEAD


def test_the_replays_recorded_ahead_copy_into_read_buffers_of_their_own(gpu, ahead_path):
    """While the host reads a replay's result, the replays recorded ahead copy theirs into the tape's other read
    buffers, one each, never into the one the host maps (`READ_TURNS`); each later replay, into the next."""
    x, step = doubling_step(gpu)
    for value in range(2 * replay.READ_TURNS):
        gpu.write_(x.data, np.full(4, value, np.float32))
        result = step()
        aheads = [future.result() for future in step.tape.aheads]
        (result_array, (read, _, _), _) = gpu.rt.early_read
        assert result_array() is (result.data.base or result.data) and len(aheads) == replay.RECORDED_AHEAD
        turns = [step.tape.read_buffers.index(buffer) for buffer in [read] + [a.read[0] for a in aheads]]
        assert len(set(turns)) == len(turns), turns  # the host's buffer and each recording's apart
        assert turns == [(value + i) % replay.READ_TURNS for i in range(replay.RECORDED_AHEAD + 1)]
        assert result.numpy().tolist() == [3.0 * value] * 4


def test_a_step_recorded_for_other_inputs_is_recorded_again(gpu, monkeypatch, ahead_path):
    """A large write is no staged input: it goes to the queue at once, and the replay's inputs differ from those
    the step was recorded ahead with (and back again), so those recordings are dropped and the step recorded anew."""
    made, released = counted_aheads(monkeypatch, gpu.rt)
    x, step = doubling_step(gpu)
    for value, staged in ((10.0, True), (20.0, False), (30.0, True), (40.0, True)):
        monkeypatch.setattr(transfer, "STAGED_WRITE_BYTES", 1 << 20 if staged else 0)
        gpu.write_(x.data, np.full(4, value, np.float32))
        assert step().numpy().tolist() == [3.0 * value] * 4
    wait(list(step.tape.aheads) + list(gpu.rt.orphaned_aheads))
    gpu.rt.flush()  # releases the recordings dropped while still recording
    # the first three record their own: none before, then those for 20's and 30's inputs dropped; the first three
    # then record RECORDED_AHEAD ahead, the fourth one more
    ahead = replay.RECORDED_AHEAD
    assert made.count("MainThread") == (4 + 3 * ahead if ahead_path == "inline" else 3) and len(made) == 4 + 3 * ahead
    assert len(released) == 2 * ahead


def test_a_step_ending_in_a_write_still_returns_its_result(gpu, ahead_path):
    """A constant write inside a captured step is replayed as a queue write between its command buffers. A result
    made before it is copied out by the command buffer that made it; the written array itself, after the write,
    in a command buffer of its own."""
    x, z = (tinynn.tensor(np.zeros(4), backend=gpu) for _ in range(2))

    def doubled_then_written():
        y = x * 2.0
        gpu.write_(z.data, np.ones(4, np.float32))
        return y

    def written():
        gpu.write_(z.data, np.full(4, 3.0, np.float32))
        (x * 2.0).sum()  # a dispatch, so that the write is not the whole step
        return z
    for fn, want, buffers in ((doubled_then_written, lambda v: [2.0 * v] * 4, 1), (written, lambda v: [3.0] * 4, 2)):
        step = gpu.capture(fn)
        for value in range(8):
            gpu.write_(x.data, np.full(4, value, np.float32))
            submissions = gpu.counters["submissions"]
            assert step().numpy().tolist() == want(value)
        # the read-back rides in the step's command buffer (`written` also flushes x's write on its own: a step that
        # starts with a write takes no staged inputs into its first command buffer)
        assert gpu.counters["submissions"] - submissions == buffers
    assert [kind for kind, _ in step.tape.programs[True][0]] == ["write", "dispatches"]


def test_a_tape_dropped_while_its_next_step_records_is_released_after(gpu, monkeypatch):
    """The recording thread records with handles of the tape's pipelines and bind groups: they stay alive while
    it works, though the tape is dropped and the runtime's caches forget them, and what it recorded is
    released by the runtime's thread once done."""
    rt = gpu.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.record_thread is not None
    rt.use_native(calls, reason, threaded=True)
    made, released = counted_aheads(monkeypatch, gpu.rt)
    gate, init = threading.Event(), replay.Ahead.__init__

    def held(self, *args):
        if threading.current_thread().name.startswith("tinynn-record"):
            assert gate.wait(timeout=30)
        init(self, *args)
    monkeypatch.setattr(replay.Ahead, "__init__", held)
    try:
        x, step = doubling_step(gpu)
        gpu.write_(x.data, np.full(4, 7.0, np.float32))
        assert step().numpy().tolist() == [21.0] * 4
        pending = list(step.tape.aheads)
        del step
        gc.collect()
        rt.bind_groups.clear()
        gc.collect()
        gate.set()
        wait(pending)
        # recorded, not yet released: that is the runtime's thread's
        assert len(made) == 1 + replay.RECORDED_AHEAD and released == []
        gpu.sync()
        assert len(released) == replay.RECORDED_AHEAD and not rt.orphaned_aheads
    finally:
        gate.set()
        rt.use_native(calls, reason, threaded)


def test_a_step_recorded_through_other_calls_is_recorded_again(gpu, monkeypatch, ahead_path):
    rt = gpu.rt
    made, released = counted_aheads(monkeypatch, gpu.rt)
    x, step = doubling_step(gpu)
    step()
    wait(list(step.tape.aheads))
    calls, reason = rt.native, rt.native_reason
    other, _ = native.probe(rt.device)
    rt.use_native(other, reason, ahead_path == "threaded")
    try:
        gpu.write_(x.data, np.full(4, 9.0, np.float32))
        assert step().numpy().tolist() == [27.0] * 4
        wait(list(step.tape.aheads))
        # dropped (those after it once recorded), recorded anew through `other`
        assert len(released) == 1 and made[-1 - replay.RECORDED_AHEAD] == "MainThread"
    finally:
        rt.use_native(calls, reason, ahead_path == "threaded")


def test_a_recording_ahead_that_fails_raises_in_the_next_replay(gpu, monkeypatch, ahead_path):
    x, step = doubling_step(gpu)
    step()
    wait(list(step.tape.aheads))  # recorded before finish fails
    finish = native.NativeCalls.finish

    def failing(self, *args):
        self.release([finish(self, *args)])
        raise wgpu.GPUError("finish failed in the test")
    monkeypatch.setattr(native.NativeCalls, "finish", failing)
    step()  # submits what was recorded before; its recording of one more fails
    wait(list(step.tape.aheads))
    monkeypatch.setattr(native.NativeCalls, "finish", finish)
    for _ in range(replay.RECORDED_AHEAD - 1):  # those recorded before it
        step()
    with pytest.raises(wgpu.GPUError, match="finish failed in the test"):
        step()
    gpu.write_(x.data, np.full(4, 5.0, np.float32))
    assert step().numpy().tolist() == [15.0] * 4  # and the step goes on: recorded anew


def test_a_replay_counts_its_wait_for_the_recording_thread_and_still_raises_its_error(gpu, monkeypatch):
    """A replay whose step the recording thread is still recording waits for it: the wait counts in record_wait_us
    (`tinynn bench`'s record_wait_us_per_step), and the recording's error raises as it did before it was timed."""
    rt = gpu.rt
    calls, reason, threaded = rt.native, rt.native_reason, rt.record_thread is not None
    rt.use_native(calls, reason, threaded=True)
    gate, init, failures = threading.Event(), replay.Ahead.__init__, []

    def held(self, *args):  # the thread records once the caller waits for it, and takes 20 ms more
        if threading.current_thread().name.startswith("tinynn-record"):
            assert gate.wait(timeout=30)
            gate.clear()
            time.sleep(0.02)
            if failures:
                raise failures.pop()
        init(self, *args)

    def opens_the_gate(future):  # when the caller starts waiting for it
        exception = future.exception
        future.exception = lambda timeout=None: (gate.set(), exception(timeout))[1]
    monkeypatch.setattr(replay.Ahead, "__init__", held)
    try:
        x, step = doubling_step(gpu)
        gpu.write_(x.data, np.full(4, 1.0, np.float32))  # staged, as for the replays after it
        step()  # the first replay: the thread records the next ones
        opens_the_gate(step.tape.aheads[0])
        waited = rt.counters["record_wait_us"]
        gpu.write_(x.data, np.full(4, 7.0, np.float32))
        assert step().numpy().tolist() == [21.0] * 4
        assert rt.counters["record_wait_us"] - waited >= 2e4
        failures.append(RuntimeError("recording failed in the test"))
        opens_the_gate(step.tape.aheads[0])
        with pytest.raises(RuntimeError, match="recording failed in the test"):
            step()
        monkeypatch.setattr(replay.Ahead, "__init__", init)  # the thread's later recordings go on at once
        gate.set()
        gpu.write_(x.data, np.full(4, 5.0, np.float32))
        assert step().numpy().tolist() == [15.0] * 4  # and the step goes on: recorded anew
    finally:
        gate.set()
        rt.use_native(calls, reason, threaded)
