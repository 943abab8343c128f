"""reduce_on_host_ on the GPU: a flat array read back part by part, each part reduced on the host by the
caller's function (data-parallel training: an MPI sum over the ranks) and written back, pipelined. A thread
of its own runs the functions, in order, while this one reads the next parts back and writes the reduced
ones: the read-back's copy out of the mapped staging buffer, the MPI sum and the write's copy into wgpu's
staging buffer are host copies, slow enough on a server's host to be worth overlapping (apps/bench/
data_parallel.py measures it). mpi4py's waits, wgpu's C calls and NumPy's copies release the GIL."""
from __future__ import annotations

import queue
import threading

import numpy as np

from tinynn.backends import Backend
from tinynn_gpu.runtime.arrays import GpuArray
from tinynn_gpu.runtime.runtime import Runtime


def reduce_on_host_(rt: Runtime, src: GpuArray, dst: GpuArray, host: np.ndarray, parts: list) -> None:
    """Backend.reduce_on_host_ with the parts' functions in a worker thread."""
    read = [threading.Event() for _ in parts]
    reduced = queue.SimpleQueue()  # each part's index once reduced, or the exception that stopped the worker
    abandoned = threading.Event()

    def reduce():
        try:
            for i, (_, _, fn) in enumerate(parts):
                read[i].wait()
                if abandoned.is_set():
                    return
                fn()
                reduced.put(i)
        except BaseException as e:  # raised again in the calling thread
            reduced.put(e)

    worker = threading.Thread(target=reduce, name="tinynn-reduce-on-host", daemon=True)
    worker.start()
    try:
        for (start, stop, _), done in zip(parts, read):
            rt.read(src, host[start:stop], start)
            done.set()
        for start, stop, _ in parts:
            outcome = reduced.get()
            if isinstance(outcome, BaseException):
                raise outcome
            rt.write(dst, host[start:stop], start)
    except BaseException:
        # A worker waiting for a part returns; one inside an MPI sum is left to the job's end, which the
        # error brings (distributed.fail), since it waits for the other ranks.
        abandoned.set()
        for done in read:
            done.set()
        raise
    worker.join()


def reduce_on_host_method(self, src, dst, host, parts, in_thread=False):
    """Backend.reduce_on_host_ (a method of the backend: backend.py's table), pipelined where asked and both
    arrays are on the GPU."""
    if not in_thread or src.buffer is None or dst.buffer is None:
        return Backend.reduce_on_host_(self, src, dst, host, parts)
    reduce_on_host_(self.rt, src, dst, host, parts)
