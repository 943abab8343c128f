"""The recording paths: how commands reach wgpu, chosen once per runtime (`Runtime.use_native`).

A `Recorder` holds the open command encoder and compute pass and records into them: a dispatch, a copy, a pass
with timestamps, a query resolve; `submit` finishes the encoder and hands it to the queue; `write` and `read`
move bytes to and from buffers. Two implementations take the same wgpu-py objects:
- `MethodRecorder`: wgpu-py's methods (what works everywhere wgpu-py does);
- `NativeRecorder`: webgpu.h's C functions (wgpu-native's or Dawn's), called straight through cffi (native.py),
  where `native.probe` found them working: a third of wgpu-py's host cost per dispatch. Its `encoder` and
  `compute_pass` are native handles.
`opened` (given by the runtime) is called when a new encoder opens, before anything is recorded on it: the
staged writes' copies go first.
"""
from __future__ import annotations

import numpy as np
from tinynn_gpu.runtime.webgpu import wgpu


class Recorder:
    """What both paths hold: the open encoder and pass, and the pipeline set in it."""
    native = None  # the direct calls (native.NativeCalls), on the path that has them

    def __init__(self, opened):
        self.opened = opened
        self.encoder = None  # the open command encoder (a native handle on the direct path)
        self.compute_pass = None  # the open compute pass in it
        self.pipeline = None  # the pipeline (a wgpu-py object) set in the open pass

    def open(self):
        """The open encoder, opened first where none is."""
        if self.encoder is None:
            self.encoder = self.new_encoder()
            self.opened()
        return self.encoder

    def end_pass(self) -> None:
        if self.compute_pass is not None:
            compute_pass, self.compute_pass, self.pipeline = self.compute_pass, None, None
            self.end(compute_pass)


class MethodRecorder(Recorder):
    """Recording through wgpu-py's methods."""

    def __init__(self, device, opened):
        super().__init__(opened)
        self.device, self.queue = device, device.queue

    def new_encoder(self):
        return self.device.create_command_encoder()

    def end(self, compute_pass) -> None:
        compute_pass.end()

    def begin_pass(self, timestamps: tuple | None = None):
        """Open a compute pass; timestamps: (query set, index written at its start, at its end)."""
        encoder = self.open()
        if timestamps is None:
            self.compute_pass = encoder.begin_compute_pass()
        else:
            self.compute_pass = encoder.begin_compute_pass(timestamp_writes={
                "query_set": timestamps[0], "beginning_of_pass_write_index": timestamps[1],
                "end_of_pass_write_index": timestamps[2]})
        return self.compute_pass

    def dispatch(self, pipe, group, groups: tuple) -> None:
        compute_pass = self.compute_pass or self.begin_pass()
        if pipe is not self.pipeline:  # runs of one kernel (the optimizer's) set it once
            compute_pass.set_pipeline(pipe)
            self.pipeline = pipe
        compute_pass.set_bind_group(0, group)
        compute_pass.dispatch_workgroups(*groups)

    def copy(self, source, source_offset: int, destination, offset: int, nbytes: int) -> None:
        """A buffer-to-buffer copy, recorded after the open pass ends."""
        self.end_pass()
        self.open().copy_buffer_to_buffer(source, source_offset, destination, offset, nbytes)

    def resolve(self, queries, count: int, destination) -> None:
        self.end_pass()
        self.open().resolve_query_set(queries, 0, count, destination, 0)

    def submit(self) -> None:
        """Finish the open encoder and submit it (the encoder is gone also when finishing raises)."""
        self.end_pass()
        encoder, self.encoder = self.encoder, None
        self.queue.submit([encoder.finish()])

    def write(self, buffer, data, offset: int) -> None:
        self.queue.write_buffer(buffer, offset, data)

    def read(self, staging, nbytes: int, out: np.ndarray, dtype, until=None) -> int:
        """out's values from the first bytes of a MAP_READ buffer, and the error-flags word behind them (at
        `nbytes`, returned), once everything submitted has run."""
        staging.map_sync(wgpu.MapMode.READ, 0, nbytes + 4)
        mapped = staging.read_mapped(0, nbytes + 4, copy=False)  # copied once, below, before unmap
        flags = int.from_bytes(mapped[nbytes:], "little")
        out[...] = np.frombuffer(mapped, dtype=dtype, count=out.size).reshape(out.shape)
        del mapped
        staging.unmap()
        return flags


class NativeRecorder(Recorder):
    """Recording through webgpu.h's C functions (`calls`: native.NativeCalls): the same commands, on handles."""

    def __init__(self, calls, opened):
        super().__init__(opened)
        self.native = calls

    def new_encoder(self):
        return self.native.encoder()

    def end(self, compute_pass) -> None:
        self.native.end_pass(compute_pass)

    def begin_pass(self, timestamps: tuple | None = None):
        encoder = self.open()
        self.compute_pass = self.native.begin_pass(
            encoder, None if timestamps is None else (timestamps[0]._internal, *timestamps[1:]))
        return self.compute_pass

    def dispatch(self, pipe, group, groups: tuple) -> None:
        calls = self.native
        handle = self.compute_pass or self.begin_pass()
        if pipe is not self.pipeline:
            calls.set_pipeline(handle, pipe._internal)
            self.pipeline = pipe
        calls.set_bind_group(handle, 0, group._internal, 0, calls.null)
        calls.dispatch(handle, *groups)

    def copy(self, source, source_offset: int, destination, offset: int, nbytes: int) -> None:
        self.end_pass()
        self.native.copy(self.open(), source._internal, source_offset, destination._internal, offset, nbytes)

    def resolve(self, queries, count: int, destination) -> None:
        self.end_pass()
        self.native.resolve(self.open(), queries._internal, count, destination._internal)

    def submit(self) -> None:
        self.end_pass()
        encoder, self.encoder = self.encoder, None
        self.native.submit([self.native.finish(encoder)])

    def write(self, buffer, data, offset: int) -> None:
        self.native.write(buffer._internal, data, offset)

    def read(self, staging, nbytes: int, out: np.ndarray, dtype, until=None) -> int:
        """As MethodRecorder's, the values straight into `out` where it is one block of memory, waiting in this
        thread (native.NativeCalls.read); `until`: the submission that wrote the buffer, where later ones may
        still run."""
        flags = np.zeros(1, np.uint32)
        into = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        self.native.read(staging._internal, [(0, into), (nbytes, flags)], until)
        if into is not out:
            out[...] = into
        return int(flags[0])
