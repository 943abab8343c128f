"""Moving values between the host and GPU arrays: writes (small ones staged, one queue write per submission) and
read-backs, the one place the host waits for the GPU.

Small writes are staged: a training step's token ids, targets and optimizer values then cost one queue write,
not three (wgpu-native makes a staging buffer per write). `queue.on_submitted_work_done_sync()` is broken in wgpu
0.32, and mapping a buffer written by the last submission waits for all before it; the read-back of a replayed
step's result waits only for the command buffer that made it (replay.py, `Runtime.early_read`).
"""
from __future__ import annotations

import numpy as np
from tinynn_gpu.runtime.webgpu import wgpu

from tinynn.errors import TinynnError
from tinynn.numpy_backend import EMBEDDING_RANGE, TARGET_RANGE
from tinynn_gpu.runtime.arrays import GpuArray
from tinynn_gpu.runtime.pool import _bucket, _round4

# Bits a kernel sets in the error-flags word (atomicOr; embedding.wgsl, cross_entropy.wgsl), and the error
# each becomes: `read` copies the word back with every read-back and raises, so a bad input surfaces at the
# step's one read-back with the NumPy backend's message, and never as a silently wrong number.
KERNEL_ERRORS = {1: EMBEDDING_RANGE, 2: TARGET_RANGE}
STAGED_WRITE_BYTES = 1 << 20  # writes up to this many bytes are staged


class Transfer:
    def __init__(self, runtime):
        self.rt = runtime
        self.device = runtime.device
        self.staging = {}  # bucket size -> MAP_READ buffer for read-backs
        self.upload_buffer = None  # the staged writes' source buffer, written once per submission (`upload_staged`)
        self.staged = []  # the bytes of the staged writes not yet in it, 4-byte aligned, in order
        self.staged_copies = []  # (buffer, offset, upload offset, bytes) of staged writes not yet recorded

    def write(self, arr: GpuArray, x: np.ndarray, start: int | None = None) -> None:
        """Overwrite arr's buffer with x (same byte size); with `start`, x's elements from arr's flat element
        start on (the rest of arr kept). In order with the dispatches recorded around it."""
        rt = self.rt
        data = np.ascontiguousarray(x, dtype=arr.dtype)  # written from its memory: no bytes copy
        if (data.nbytes != arr.nbytes) if start is None else not 0 <= start <= arr.size - data.size:
            raise ValueError(f"cannot write {x.shape} {x.dtype} into a {arr.shape} {arr.dtype} array"
                             + ("" if start is None else f" at element {start}"))
        offset = (start or 0) * arr.dtype.itemsize
        rt.counters["uploads"] += 1
        rt.early_read = None  # the write might land in the last replay's result
        if not data.nbytes:
            return
        if rt.tape is None and data.nbytes <= STAGED_WRITE_BYTES and data.nbytes % 4 == offset % 4 == 0:
            self._stage(arr.buffer, offset, data)
            return
        rt.flush()  # queue.write_buffer runs before commands not yet submitted: submit those first
        self.queue_write(arr.buffer, data, offset)
        if rt.tape is not None:  # inside a captured step this is a constant: replay writes the same bytes
            rt.tape.events.append(("write", arr.buffer, data.tobytes(), offset))
            rt.tape.hold(arr)

    def _stage(self, buffer, offset: int, data: np.ndarray) -> None:
        """A small write as a copy command from the upload buffer, in order with the dispatches around it:
        recorded now if commands are waiting in the encoder, else by the next encoder before anything else
        (`record_staged`; a replay records them into its first command buffer). Its bytes go into the upload
        buffer with every other staged write of the submission, in one queue write, when that is submitted."""
        at = sum(len(b) for b in self.staged)
        if self.upload_buffer is None or at + data.nbytes > self.upload_buffer.size:
            if at:
                self.rt.flush()
                at = 0
            if self.upload_buffer is None or data.nbytes > self.upload_buffer.size:
                self.upload_buffer = self.device.create_buffer(
                    size=_bucket(max(data.nbytes, 4096)), usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST)
        self.staged.append(data.tobytes())  # a copy: the caller may change x once this returns
        if self.rt.recording.encoder is None:
            self.staged_copies.append((buffer, offset, at, data.nbytes))
        else:
            self.rt.recording.copy(self.upload_buffer, at, buffer, offset, data.nbytes)

    def record_staged(self) -> None:
        """The staged writes' copies, into an encoder just opened: they came before anything recorded on it."""
        for buffer, offset, at, nbytes in self.staged_copies:
            self.rt.recording.copy(self.upload_buffer, at, buffer, offset, nbytes)
        self.staged_copies.clear()

    def upload_staged(self) -> None:
        """The staged writes' bytes into the upload buffer in one queue write, just before the submission
        whose copies read them (not sooner: those copies' offsets count from the first staged write)."""
        if self.staged:
            self.queue_write(self.upload_buffer, b"".join(self.staged), 0)
            self.staged.clear()

    def queue_write(self, buffer, data, offset: int) -> None:
        self.rt.recording.write(buffer, data, offset)
        self.rt.counters["queue_writes"] += 1

    def read(self, arr: GpuArray, out: np.ndarray | None = None, start: int | None = None) -> np.ndarray:
        """Copy an array back to the host (into `out` when given): the one place the host waits for the GPU.
        With `start`, only out.size elements from arr's flat element start on come back, into out."""
        rt = self.rt
        rt.not_capturable("the step reads a value back")
        if start is None:
            if out is not None and (out.shape != arr.shape or out.dtype != arr.dtype):
                raise ValueError(f"cannot read a {arr.shape} {arr.dtype} array into a {out.shape} {out.dtype} one")
            out = np.empty(arr.shape, arr.dtype) if out is None else out
            start = 0
        elif not 0 <= start <= arr.size - out.size:
            raise ValueError(f"cannot read {out.size} elements at element {start} of a {arr.shape} array")
        nbytes = out.size * arr.dtype.itemsize
        if nbytes == 0:
            return out
        early, rt.early_read = rt.early_read, None
        result = None if early is None else early[0]()  # None too once the result was dropped
        if result is not None and result is (arr.base or arr) and start == 0 and out.size == arr.size:
            # the result of the replay just submitted (nothing recorded since), which the step's command buffer
            # that made it copied for the host with the error flags: wait for that one, not the whole step
            (staging, flags_at, _), until = early[1], early[2]
        else:
            flags_at = _round4(nbytes)  # the kernels' error flags come back behind the data
            size = _bucket(flags_at + 4)
            staging = self.staging.get(size)
            if staging is None:
                staging = self.staging[size] = self.read_back_buffer(size)
            rt.recording.copy(arr.buffer, start * arr.dtype.itemsize, staging, 0, flags_at)
            rt.recording.copy(rt.error_flags.buffer, 0, staging, flags_at, 4)
            rt.flush()
            until = None
        flags = rt.recording.read(staging, flags_at, out, arr.dtype, until)
        rt.counters["host_syncs"] += 1
        if flags:
            rt.queue.write_buffer(rt.error_flags.buffer, 0, bytes(4))  # raised once
            raise TinynnError("; ".join(msg for bit, msg in KERNEL_ERRORS.items() if flags & bit))
        return out

    def read_back_buffer(self, size: int):
        """A buffer the GPU copies into and the host maps to read (`read`, and a replay's result: replay.py)."""
        return self.device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def destroy_staging(self) -> None:
        for buffer in self.staging.values():
            buffer.destroy()
        self.staging.clear()
