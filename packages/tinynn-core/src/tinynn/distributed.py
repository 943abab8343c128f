"""Data-parallel training through MPI (mpi4py): which rank this process is, the gradient sum, and ending
the whole job when one rank fails.

    pip install 'tinynn-core[mpi]'                       # mpi4py and the mpich wheel (its mpiexec too)
    mpiexec -n 2 tinynn train --config apps/chargpt/lesson.json

Every rank builds the same model from the same seed and draws the same global batch; rank r trains on rows
r::N of it. Once per optimizer step the ranks sum their gradients (train.py's TrainStep packs them into one
flat array, summed in a few parts, each by a persistent Allreduce: `World.summation`). Rank 0 alone writes
checkpoints, the progress bar, evaluations and the sample.

MPI is detected from the launcher's environment (PMI_RANK, OMPI_COMM_WORLD_RANK, ...). Outside a launch,
`world()` is a world of one and mpi4py is never imported.

Ranks on one machine share its cores. Each would otherwise run as many BLAS threads as the machine has cores
while MPICH polls besides (two ranks on 2 cores ran 6-11x slower than one process), so `world()` gives each
rank cores / ranks threads: threadpoolctl (the [mpi] extra's) sets NumPy's OpenBLAS, TINYNN_NUM_THREADS sizes
tinynn's own pool. A count the user set in one of THREAD_VARS is left as it is.

Rank 0 speaks for the job: the other ranks' notices are not shown, and their errors only when rank 0 has not
failed too; each line goes out in one write, so that lines of several ranks do not run together.

A rank that leaves while the others wait in a collective would leave them waiting forever, so every way out of
a failed or interrupted job ends all of it (MPI_Abort): an error (`fail`), an uncaught exception, and Ctrl-C.
mpiexec forwards Ctrl-C (SIGINT) to every rank. Rank 0 stops as usual (KeyboardInterrupt: its checkpoint and
message), then ends the job with exit code 130 as it exits; the other ranks carry on meanwhile, so that a
collective rank 0 is waiting in completes. A rank other than 0 that alone is interrupted (or whose rank 0
does not end the job within INTERRUPT_GRACE_S) ends the job itself; a second Ctrl-C at once.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np

from tinynn.errors import TinynnError, TinynnNotice

LAUNCH_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
INSTALL = "pip install 'tinynn-core[mpi]'"
ABORT_GRACE_S = 0.5  # before ending a failed job: see _abort
REPEAT_GRACE_S = 2.0  # before a rank other than 0 prints its error: see fail
INTERRUPT_GRACE_S = 60.0  # for rank 0 to save and end an interrupted job before another rank ends it
INTERRUPTED = 130  # the exit code of a job ended by Ctrl-C (128 + SIGINT), as a shell reports it
ADAPTER_VAR = "TINYNN_ADAPTER_INDEX"  # read by a GPU backend: rank r on a machine takes hardware adapter r
# thread counts a user may set; any one of them set means the ranks' threads are left as the user has them
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TINYNN_NUM_THREADS")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    comm: object = None  # mpi4py's COMM_WORLD, or None outside MPI
    threaded: bool = False  # MPI may be called from another thread than the main one (one thread at a time)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def rows(self, batch: np.ndarray) -> np.ndarray:
        """This rank's share of a global batch: rows rank, rank + size, ..."""
        return batch[self.rank::self.size]

    def check_batch(self, batch_size: int, accum_steps: int) -> None:
        if batch_size % (self.size * accum_steps):
            raise TinynnError(f"batch_size ({batch_size}) must be divisible by the number of ranks ({self.size}) "
                              f"times grad_accum_steps ({accum_steps})")

    def allreduce_(self, array: np.ndarray) -> None:
        """Sum an array over all ranks, in place (every rank gets the sum)."""
        if self.comm is not None:
            from mpi4py import MPI
            self.comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)

    def summation(self, array: np.ndarray) -> "Summation":
        """allreduce_ of this array, set up once for a sum repeated every step (a collective call: every
        rank makes its summations in the same order)."""
        return Summation(self, array)


class Summation:
    """A repeated in-place sum of one contiguous array over the ranks: call it to run one.

    A persistent Allreduce (MPI 4's Allreduce_init) where the MPI has them: MPICH's plain Allreduce of a
    large array mallocs its work buffer on every call, and glibc maps so large a buffer afresh and unmaps it
    when it is freed, so every call page-faults the memory in again; the persistent one allocates once
    (measured in BENCHMARKS.md, "A persistent Allreduce"). Where `world.threaded`, it may be called from another
    thread than the main one. Its request is freed by `free`, or at exit before MPI_Finalize (which warns
    of each left)."""

    def __init__(self, world: World, array: np.ndarray):
        if not array.flags.c_contiguous:
            raise ValueError("a summation needs a contiguous array")
        self.world, self.array, self.request = world, array, None
        if world.comm is not None:
            from mpi4py import MPI
            try:
                self.request = world.comm.Allreduce_init(MPI.IN_PLACE, array, op=MPI.SUM)
            except NotImplementedError:  # mpi4py's answer where the MPI library predates MPI 4
                return
            _open_requests[id(self.request)] = self.request

    def __call__(self) -> None:
        if self.request is None:
            self.world.allreduce_(self.array)
        else:
            self.request.Start()
            self.request.Wait()

    def free(self) -> None:
        """Release the persistent request (local to this rank) of a summation no longer called."""
        if self.request is not None:
            del _open_requests[id(self.request)]
            self.request.Free()
            self.request = None


_open_requests = {}  # id -> a Summation's persistent request, freed at exit


def _free_open_requests() -> None:
    while _open_requests:
        _open_requests.popitem()[1].Free()


_world: World | None = None


def launched() -> str | None:
    """The launcher variable that says this process runs under mpiexec, or None."""
    return next((var for var in LAUNCH_VARS if var in os.environ), None)


def world() -> World:
    """This process's place in the job, connecting to MPI on the first call under mpiexec."""
    global _world
    if _world is None:
        _world = _connect(launched()) if launched() else World()
    return _world


def _connect(var: str) -> World:
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as e:  # RuntimeError: mpi4py found no MPI library to load
        raise TinynnError(f"running under mpiexec ({var} is set) needs mpi4py and an MPI library: {INSTALL} "
                          f"({type(e).__name__}: {e})") from None
    comm = MPI.COMM_WORLD
    launched_size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
    if launched_size and int(launched_size) != comm.Get_size():  # else each rank would train alone, unaware
        raise TinynnError(f"mpiexec started {launched_size} processes but MPI sees {comm.Get_size()}: mpi4py "
                          f"uses a different MPI ({MPI.Get_library_version().splitlines()[0].strip()}) than the "
                          f"mpiexec that started it; {INSTALL} brings both")
    here = comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks on this machine
    local_rank = here.Get_rank()  # this rank's number on its machine
    os.environ.setdefault(ADAPTER_VAR, str(local_rank))
    if here.Get_size() > 1:
        _share_cores(here.Get_size(), report=local_rank == 0)
    if comm.Get_rank() != 0:  # the ranks run alike: rank 0's notices are everyone's (its errors too: see fail)
        warnings.filterwarnings("ignore", category=TinynnNotice)
    sys.excepthook = _abort_after(sys.excepthook)
    atexit.register(_free_open_requests)  # runs before mpi4py's MPI_Finalize, registered earlier (at import)
    job = World(comm.Get_rank(), comm.Get_size(), comm, threaded=MPI.Query_thread() >= MPI.THREAD_SERIALIZED)
    if job.size > 1:
        _handle_interrupts(job)
    return job


def _cores() -> int:
    """The cores this process may run on (its affinity: `taskset` and container limits count), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def _share_cores(ranks_here: int, report: bool) -> None:
    """Threads for one of `ranks_here` ranks on this machine (see the module); `report`: this machine's first
    rank says what it could not set."""
    if any(var in os.environ for var in THREAD_VARS):
        return
    threads = max(1, _cores() // ranks_here)
    for var in THREAD_VARS:  # tinynn's pool, and BLAS or OpenMP libraries loaded from now on
        os.environ[var] = str(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        if report:
            warnings.warn(f"{ranks_here} ranks share this machine's {_cores()} cores, and NumPy's BLAS (loaded "
                          f"already) runs up to {_cores()} threads in each: {INSTALL} brings threadpoolctl, which "
                          f"sets {threads} a rank; or set OMP_NUM_THREADS={threads} for mpiexec", TinynnNotice)
        return
    threadpool_limits(threads)  # for the rest of the process


_interrupted = False  # this rank got SIGINT


def _handle_interrupts(job: World) -> None:
    """Ctrl-C ends the whole job (see the module); a handler set by the program itself is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def on_sigint(signum, frame):
        global _interrupted
        again, _interrupted = _interrupted, True
        if job.is_root:
            raise KeyboardInterrupt
        if again:
            _abort(job.comm, INTERRUPTED)
        threading.Thread(target=_end_if_root_does_not, args=(job,), daemon=True).start()
    signal.signal(signal.SIGINT, on_sigint)
    atexit.register(_end_if_interrupted, job)  # before _free_open_requests and MPI_Finalize


def _end_if_interrupted(job: World) -> None:
    """Rank 0, leaving after Ctrl-C: the other ranks are still training and would wait for it forever."""
    if _interrupted and job.is_root:
        sys.stdout.flush()
        _abort(job.comm, INTERRUPTED)


def _end_if_root_does_not(job: World) -> None:
    time.sleep(INTERRUPT_GRACE_S)
    say(f"tinynn: error: rank {job.rank} of {job.size}: interrupted, and rank 0 did not end the job within "
        f"{INTERRUPT_GRACE_S:g} s")
    _abort(job.comm, INTERRUPTED)


def fail(message: str, code: int) -> int:
    """Print a rank's one-line error and end the whole job (the other ranks would wait for it forever);
    outside MPI, print it and return the exit code."""
    job = _world
    if job is None and launched():  # failed before connecting: connect, so that the end reaches every rank
        try:
            job = world()
        except TinynnError:  # no MPI to end the job through: each rank fails on its own
            pass
    tag = f"rank {job.rank} of {job.size}: " if job is not None and job.size > 1 else ""
    if tag and not job.is_root:
        # rank 0 mostly fails alike (the same config and data) and ends the job as it does: a rank that is still
        # running after a while failed alone, and says why
        time.sleep(REPEAT_GRACE_S)
    say(f"tinynn: error: {tag}{message}")
    if job is not None and job.comm is not None:
        _abort(job.comm, code)
    return code


def say(line: str) -> None:
    """One line to stderr in one write: mpiexec forwards every rank's output to one stream, where a line
    written in parts (print writes the text, then the newline, when Python is unbuffered) is cut by another
    rank's."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _abort(comm, code: int) -> None:
    """End every rank. First a moment for mpiexec to forward what this rank printed: Abort kills the job at
    once, and output the launcher had not forwarded yet is lost (seen under load: an empty stderr)."""
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)


def _abort_after(hook):
    """An excepthook that prints the traceback as usual, then ends the job instead of leaving it hanging."""
    def excepthook(kind, value, tb):
        hook(kind, value, tb)
        sys.stderr.flush()
        _abort(_world.comm, 1)
    return excepthook
