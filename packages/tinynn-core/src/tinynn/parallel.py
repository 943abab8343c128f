"""A pool of threads sized to the cores, for NumPy work cut into blocks of rows.

NumPy's ufuncs and reductions release the GIL, so the rows of one op can run on several cores at once from
pure Python. An op cuts its rows into blocks whose size depends only on the array's shape, never on the number
of threads, and each block is computed by the same NumPy calls whichever thread runs it: the same bits on every
run and for every thread count. A block is small enough that the op's temporaries stay in a core's cache, which
pays even on one thread.

Matrix products run on the pool too, cut into tiles of the output (`matmul`), each tile one BLAS call on one
BLAS thread (blas.py): BLAS's own threads would otherwise take the same cores, wait for the slowest of them on
a shared machine, and keep spinning after each product while the pool's next op needs the cores. A tile's
bits depend on its shape, so a product is cut by the pool's size as well (whole on one thread, a few tiles a
thread on more): the same bits on every run with as many threads. A decode step's products (a few rows, too
small to cut) are the exception: BLAS's own threads run them, as many as the pool's but no more than the cores,
since they spin between products and a pool thread's wake costs a fifth of such a product; no pool op runs beside
them there.
Where BLAS's thread count cannot be set, a product stays whole, threaded by BLAS.

    TINYNN_NUM_THREADS=4 tinynn train ...   # the pool's size; default: the cores this process may run on
"""
from __future__ import annotations

import itertools
import os
import queue
import threading

import numpy as np

from tinynn import blas
from tinynn.errors import TinynnError

ENV = "TINYNN_NUM_THREADS"
# elements of one block: 128 KiB of float32 per temporary, so an op's few temporaries stay in a core's L2
BLOCK_ELEMENTS = 1 << 15
# a product's tiles: about TILES_PER_THREAD a thread (a thread sharing its core then does fewer), none under
# MIN_TILE_WORK multiply-adds (tens of microseconds: each BLAS call packs its operands again), TILE_MIN_COLS to
# TILE_COLS wide
TILES_PER_THREAD, MIN_TILE_WORK, TILE_COLS, TILE_MIN_COLS = 4, 1 << 22, 256, 64
# rows of a product that one block of BLAS's row kernels covers: a decode step's batch
FEW_ROWS = 16

_threads: list[tuple[threading.Thread, queue.SimpleQueue]] = []  # the pool: started on first use
_size: int | None = None
_worker = threading.local()  # set in the pool's threads: work they submit runs inline (no deadlock)


def cores() -> int:
    """The cores this process may run on (its affinity mask: `taskset` counts), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def num_threads() -> int:
    """The pool's size: TINYNN_NUM_THREADS, or the cores available."""
    global _size
    if _size is None:
        value = os.environ.get(ENV, "").strip()
        if not value:
            _size = cores()
        elif value.isdigit() and int(value) >= 1:
            _size = int(value)
        else:
            raise TinynnError(f"{ENV} must be a whole number >= 1, got {value!r}")
    return _size


def set_num_threads(n: int | None) -> None:
    """Resize the pool (None: back to TINYNN_NUM_THREADS or the cores); the threads start at the next op."""
    global _size
    if n is not None and (not isinstance(n, int) or n < 1):
        raise TinynnError(f"the number of threads must be an integer >= 1, got {n!r}")
    _shutdown()
    _size = n


def describe() -> dict:
    """What `tinynn info` shows: the pool's size and where it comes from."""
    source = ENV if os.environ.get(ENV, "").strip() else "the cores available"
    return {"threads": num_threads(), "from": source, "cores": cores()}


def blocks(rows: int, row_size: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges covering `rows` rows of `row_size` elements, each about BLOCK_ELEMENTS elements."""
    step = max(1, BLOCK_ELEMENTS // max(1, row_size))
    return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]


def run(fn, items: list) -> None:
    """fn(item) for every item, on the pool's threads and the calling thread; returns when all are done, raising
    the first error. Each thread takes the next item not yet taken, so a thread that shares its core (with
    BLAS threads spinning after a product, or with other programs) does less of the work instead of holding
    all of it up. fn may call BLAS only for products below its threading threshold (see above)."""
    threads = min(num_threads(), len(items))
    if threads <= 1 or getattr(_worker, "active", False):
        for item in items:
            fn(item)
        return
    job = _Job(fn, items)
    for inbox in _inboxes(threads - 1):
        inbox.put(job)
    job.work()
    job.done.acquire()  # every item finished before anyone reads the arrays; not every thread woken
    if job.error is not None:
        raise job.error


class _Job:
    """One run's items, each taken by the next thread free. The caller waits for the items taken, never for a
    thread that has not woken yet (it may take tens of microseconds to): a short run on a busy machine then
    costs what it costs on one thread."""

    def __init__(self, fn, items):
        self.fn, self.items, self.error = fn, items, None
        self.taken, self.finished = itertools.count(), itertools.count(1)  # next() on them is atomic under the GIL
        self.done = threading.Lock()  # released by the thread that finishes the last item
        self.done.acquire()

    def work(self) -> None:
        for i in iter(self.taken.__next__, None):
            if i >= len(self.items):
                return
            try:
                self.fn(self.items[i])
            except BaseException as error:  # raised by run, in the caller's thread
                if self.error is None:
                    self.error = error
            if next(self.finished) == len(self.items):
                self.done.release()


def for_rows(fn, rows: int, row_size: int) -> None:
    """fn(lo, hi) over blocks of rows (see `blocks`), spread over the pool."""
    if rows * row_size <= BLOCK_ELEMENTS:
        fn(0, rows)  # one block (or none): no list, no pool
    else:
        run(lambda block: fn(*block), blocks(rows, row_size))


# --- NumPy work cut into blocks: the backend's ops (numpy_backend.py) call these ---

def into(formula, outs, *ins, row_size=1):
    """outs[lo:hi] = formula(*(a[lo:hi] for a in ins)) over blocks of rows, on the thread pool; outs is one
    array or a tuple of them (formula then returns a tuple), each with the rows on its first axis."""
    single = not isinstance(outs, tuple)

    def block(lo, hi):
        results = formula(*(a[lo:hi] for a in ins))
        for out, result in ((outs, results),) if single else zip(outs, results):
            out[lo:hi] = result
    for_rows(block, len(ins[0]), row_size)
    return outs


def by_blocks(formula, outs, *ins, row_size=1):
    """formula(*ins), fresh arrays of the dtypes the formula keeps: rows that fit one block in one piece (no
    copy), more through `into` and `outs`, made by calling it."""
    if len(ins[0]) * row_size <= BLOCK_ELEMENTS:
        return formula(*ins)
    return into(formula, outs(), *ins, row_size=row_size)


def column_sums(formula, rows, row_size, width, dtype):
    """The sum over rows of formula(lo, hi) (hi - lo, width): per-block partial sums added in block order, the
    same bits for every thread count."""
    spans = blocks(rows, row_size)
    partial = np.empty((len(spans), width), dtype)
    run(lambda i: np.sum(formula(*spans[i]), axis=0, out=partial[i]), list(range(len(spans))))
    return partial.sum(axis=0)


def tiles(m: int, n: int, k: int) -> list[tuple[slice, slice]]:
    """(rows, columns) of the tiles of an (m, n) product over k, chosen from the shape and the pool's size: the
    same bits on every run with as many threads. One thread, or a small product, makes one tile."""
    threads = num_threads()
    count = 1 if threads == 1 else min(threads * TILES_PER_THREAD, m * n * k // MIN_TILE_WORK)
    if count <= 1:
        return [(slice(0, m), slice(0, n))]
    cols = min(n, TILE_COLS)
    if m <= FEW_ROWS:  # a decode step's batch: narrower columns make the tiles
        cols = min(cols, max(TILE_MIN_COLS, -(-n // count // TILE_MIN_COLS) * TILE_MIN_COLS))
    across = -(-n // cols)  # tiles side by side
    rows = -(-m // max(1, count // across))  # rows per tile, rounded up to whole blocks of BLAS's row kernels
    rows = -(-rows // 16) * 16
    return [(slice(r, min(r + rows, m)), slice(c, min(c + cols, n))) for r in range(0, m, rows)
            for c in range(0, n, cols)]


def matmul(a, b, then=None):
    """a (M, K) @ b (K, N) as a fresh (M, N) array, tile by tile on the pool; then(tile, rows, cols), when given,
    finishes each tile in place while it is in cache (a bias, an activation: elementwise work)."""
    out = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
    if a.shape[0] * a.shape[1] * b.shape[1] <= blas.SMALL_PRODUCT or not blas.available():
        # on the calling thread, or (no control of BLAS's threads) threaded by BLAS as it likes
        np.matmul(a, b, out=out)
        if then is not None:
            for_rows(lambda lo, hi: then(out[lo:hi], slice(lo, hi), slice(None)), *out.shape)
        return out

    parts = tiles(*out.shape, a.shape[1])
    if len(parts) == 1 and a.shape[0] <= FEW_ROWS:
        # a decode step's product: whole, on BLAS's own threads, as many as the pool's but no more than the cores.
        # They spin between the step's products, where a pool thread sleeps and takes ~20 us to wake
        with blas.held_to(min(num_threads(), cores())):
            np.matmul(a, b, out=out)
        if then is not None:
            then(out, slice(0, a.shape[0]), slice(None))
        return out

    def tile(item):
        rows, cols = item
        np.matmul(a[rows], b[:, cols], out=out[rows, cols])
        if then is not None:  # a few rows at a time: the elementwise work's temporaries stay in cache
            step = max(1, BLOCK_ELEMENTS // (cols.stop - cols.start))
            for lo in range(rows.start, rows.stop, step):
                part = slice(lo, min(lo + step, rows.stop))
                then(out[part, cols], part, cols)
    with blas.one_thread():
        run(tile, parts)
    return out


def small(a) -> bool:
    """An array the plain formula handles in one piece: one block or less, or not floating point."""
    return a.size <= BLOCK_ELEMENTS or a.dtype.kind != "f"


def elementwise(formula, *arrays):
    """formula(*arrays) for arrays of one shape and float dtype (the result's), by blocks on the pool."""
    a = arrays[0]
    if small(a) or any(b.shape != a.shape or b.dtype != a.dtype for b in arrays[1:]):
        return formula(*arrays)
    out = np.empty(a.shape, a.dtype)
    return into(formula, out.reshape(-1), *(b.reshape(-1) for b in arrays)).reshape(a.shape)


def pieces(*lists) -> list[tuple]:
    """(array index, lo, hi) over the elements of each array of lists[0] in blocks; a whole array where one of
    the arrays of that index is not contiguous (its flat view would be a copy, which an update in place misses)."""
    return [(i, lo, hi) for i, a in enumerate(lists[0])
            for lo, hi in (blocks(a.size, 1) if all(x[i].flags.c_contiguous for x in lists)
                           else [(None, None)])]


def piece(item, *arrays) -> list:
    """The elements of `item`, one of `pieces`, as views of each of `arrays` (lists indexed alike)."""
    i, lo, hi = item
    return [a[i] if lo is None else a[i].reshape(-1)[lo:hi] for a in arrays]


def _inboxes(count: int) -> list[queue.SimpleQueue]:
    """The inboxes of `count` pool threads, started on first use; each thread runs the jobs put in its own."""
    while len(_threads) < count:
        inbox = queue.SimpleQueue()
        thread = threading.Thread(target=_serve, args=(inbox,), name=f"tinynn-{len(_threads)}", daemon=True)
        thread.start()
        _threads.append((thread, inbox))
    return [inbox for _, inbox in _threads[:count]]


def _serve(inbox: queue.SimpleQueue) -> None:
    _worker.active = True
    for job in iter(inbox.get, None):
        job.work()  # a job whose items are all taken returns at once


def _shutdown() -> None:
    for _, inbox in _threads:
        inbox.put(None)
    for thread, _ in _threads:
        thread.join()
    _threads.clear()


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: it starts a pool of its own when it needs one."""
    _threads.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
