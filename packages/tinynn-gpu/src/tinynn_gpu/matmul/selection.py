"""Matmul kernels and the choice between them.

Float32 kernels: the lesson's tiled kernel (lesson.wgsl, tile 8, 16 or 32), the generated register-blocked kernel
(blocked.py), and for a few rows rows.py's; in matmul precision "high" (tinynn/precision.py) on a device with f16
subgroup matrices, the tensor-core kernel (tensor.py) too, tuned against the float32 ones under keys of its own.
All record `out[B,M,N] = op(a) @ op(b)` for any M, N, K, either operand stored transposed, b shared by every
batch (a weight).

`MatmulSelector` picks a variant per real shape (layout, batch, M, N, K): a model trains on a handful of
shapes, each worth its own choice (split-K, say, wins on some and loses on their neighbours).
TINYNN_MATMUL=<variant> forces one variant everywhere (the lesson's tile exercise: lesson8, lesson16,
lesson32). With autotuning on (the default on hardware adapters; TINYNN_AUTOTUNE=0/1 overrides) a shape big
enough to be worth it (`tune_min_macs`) is tuned: every candidate timed, with GPU timestamps where the adapter
has them, and the winner kept in a JSON file keyed by adapter and wgpu version (tuning_cache.py). Without
tuning, `default_variant` is a fixed choice from a sweep of the benchmark models' shapes (BENCHMARKS.md).

Tuning every shape of a model takes tens of seconds on a new machine (compiling hundreds of candidates), so a
training loop does not wait for it: once a step is captured (`defer`, set by the backend's `capture`), a shape
seen first runs its default variant, and its tuning waits for the moments between steps (`tune_pending`, which
the captured step's guard key calls), `tune_seconds_per_step` at a time, on arrays of its own. When every
pending shape is tuned, `generation` goes up: the backend plans its matmuls again and the step is recorded again
with the tuned kernels. Outside a training loop (a matmul benchmark) the first matmul of a shape is tuned at
once. Either way a line on stderr says that tuning runs. Attention in "high" chooses between its tensor-core and
float32 kernels through the same machinery (`choose`; ops/attention_choice.py).

Two independent matmuls (a linear layer's input and weight gradients) can also run as one dispatch
(`plan_pair`, paired.py): tuning times every block configuration with a split count each against the two
one after the other, and keeps whichever is faster under the pair's own key. Without tuning (a software adapter)
they stay apart.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings

from tqdm.auto import tqdm

from tinynn import precision
from tinynn.errors import TinynnError, TinynnNotice

from tinynn_gpu.matmul import tensor
from tinynn_gpu.matmul.blocked import BlockedMatmul
from tinynn_gpu.matmul.configs import (BLOCK_CONFIGS, LESSON_TILES, PAIR_SPLITS, TENSOR_CONFIGS, BlockConfig,
                                       TensorConfig)
from tinynn_gpu.matmul.lesson import LessonMatmul
from tinynn_gpu.matmul.paired import PairedMatmul
from tinynn_gpu.matmul.problem import Epilogue, shape_key
from tinynn_gpu.matmul.rows import RowsMatmul
from tinynn_gpu.matmul.tensor import TensorMatmul
from tinynn_gpu.matmul.tuning_cache import TuningCache
from tinynn_gpu.runtime import settings
from tinynn_gpu.runtime.arrays import GpuArray
from tinynn_gpu.runtime.webgpu import wgpu

SEPARATE = "separate"  # plan_pair's choice where two matmuls run faster one after the other


def progress(message: str) -> None:
    """A line on stderr that leaves a progress bar (tqdm's) whole."""
    tqdm.write(f"tinynn-gpu: {message}", file=sys.stderr)


def run_through(steps):
    """What a generator of work steps (`MatmulSelector._timing`) returns, all its steps run."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class Like:
    """An array's shape and dtype, standing in for it in a deferred tuning (which makes arrays of its own)."""
    __slots__ = ("shape", "dtype")

    def __init__(self, array: GpuArray):
        self.shape, self.dtype = array.shape, array.dtype


class MatmulSelector:
    # a matmul of fewer multiply-adds takes a few microseconds with any variant: tuning it (~50 ms) would not pay
    # back
    tune_min_macs = 1 << 26
    heat_seconds = 1.0  # of load before timing (time_variants): paid once per tuned shape, the choice cached
    # tuning between two training steps (at least one unit: a candidate compiled, or the candidates timed); the
    # step itself takes milliseconds, so training goes on at a step or two a second until the kernels are tuned
    tune_seconds_per_step = 0.5

    def __init__(self, runtime, autotune: bool | None = None):
        self.rt = runtime
        now = settings.current()
        if autotune is None:
            autotune = now.autotune if now.autotune is not None else not runtime.ctx.is_software
        self.autotune = autotune
        self.variants = {f"lesson{t}": t for t in LESSON_TILES}  # name -> lesson tile, or a BlockConfig
        self.variants.update({f"blocked {c.name}": c for c in BLOCK_CONFIGS})
        self.candidates = [f"blocked {c.name}" for c in BLOCK_CONFIGS]  # what tuning tries: never a lesson tile
        self.variants.update({c.name: c for c in TENSOR_CONFIGS})  # precision "high" adds these (tensor.py)
        self.tensor_candidates = [c.name for c in TENSOR_CONFIGS]
        self._tensor_cores = None  # (usable, why not), found at the first matmul in "high"
        self.said_why = False  # the notice that "high" runs as "highest" here
        # two independent matmuls in one dispatch (plan_pair): every block of BLOCK_CONFIGS, a split count each
        tiles = dict.fromkeys(dataclasses.replace(c, splits=1) for c in BLOCK_CONFIGS)
        self.pair_candidates = {f"paired {tile.name} {s}+{s2}": (tile, (s, s2))
                                for tile in tiles for s in PAIR_SPLITS for s2 in PAIR_SPLITS}
        self._built = {}
        self.choices: dict[str, str] = {}  # exact shape key -> variant name
        checks = "unchecked" if runtime.ctx.unchecked else "checked"  # the checks change what is fastest
        self.cache = TuningCache(
            now.cache_dir, f"{runtime.ctx.name}|{runtime.ctx.info.get('backend_type')}|wgpu {wgpu.__version__}|{checks}")
        self.cache_key, self.cache_path = self.cache.key, self.cache.path
        if self.autotune:
            self.choices.update(self.cache.choices())
        self.timed = set(self.choices)  # the keys whose choice was timed, here or by an earlier process
        self.forced = now.matmul  # one variant for every shape, e.g. "lesson8"
        if self.forced and self.forced not in self.variants:
            names = list(self.variants)
            raise TinynnError(f"TINYNN_MATMUL={self.forced!r} is not a variant: {', '.join(names[:4])}, ... "
                              f"({len(names)} in all: tinynn_gpu.matmul.configs names them)")
        if isinstance(self.variants.get(self.forced), TensorConfig):  # it takes only some shapes (uses_vec4)
            raise TinynnError(f"TINYNN_MATMUL={self.forced!r} is a tensor-core variant, which cannot run every shape: "
                             "set the matmul precision to 'high' instead")
        self.rows = RowsMatmul(runtime)
        self.last = None
        self.defer = False  # tune between a training loop's steps (`tune_pending`), not at a shape's first matmul
        self.one_off = False  # inside `transient`
        self.pending = {}  # key -> (timing, its arguments with arrays as `Like`s): tunings waiting for `tune_pending`
        self.running = None  # the pending tuning under way: a generator (`_timing`)
        self.tuned = 0  # deferred tunings done since the pending list was last empty
        self.tuning_since = None  # when it was last empty
        self.changed = False  # whether any of them chose other than the default that runs meanwhile
        self.generation = 0  # goes up when deferred tunings changed choices: plans made before are stale

    def describe(self) -> str:
        return self.last or "not used yet"

    def variant(self, name: str):
        if name not in self._built:
            config = self.variants[name]
            self._built[name] = LessonMatmul(self.rt, config) if isinstance(config, int) else \
                TensorMatmul(self.rt, config) if isinstance(config, TensorConfig) else BlockedMatmul(self.rt, config)
        return self._built[name]

    @staticmethod
    def default_variant(batch, m, n, k) -> str:
        """The choice without tuning, from a sweep of the benchmark models' shapes (BENCHMARKS.md):
        big blocks for big outputs; a long K over an output too small to fill the GPU split into slices."""
        blocks = batch * -(-m // 64) * -(-n // 64)  # 64 x 64 output blocks; 264 fill a 132-SM GPU twice
        if blocks >= 1024:
            return "blocked 128x128x16/8x8"
        if min(m, n) < 64:
            return "blocked 32x64x16/4x4 split8 vec4 db" if k >= 1024 else "blocked 32x64x16/4x4"
        if blocks < 264 and k >= 2048:  # a weight gradient: K is the batch's tokens
            return "blocked 64x64x16/4x4 split8 vec4"
        if blocks < 264 and k >= 768:
            return "blocked 64x64x16/8x4 split4"
        return "blocked 64x64x16/8x4" if blocks >= 264 else "blocked 64x64x16/4x4"

    @staticmethod
    def default_tensor_variant(batch, m, n, k) -> str:
        """precision "high"'s choice without tuning: 128 x 128 blocks where they fill the GPU, a split K where a
        weight gradient's few blocks would not."""
        blocks = batch * -(-m // 128) * -(-n // 128)
        if blocks >= 132:
            return "tensor 128x128x32/2x4"
        return "tensor 64x64x32/2x2 split4" if k >= 2048 else "tensor 64x64x32/2x2"

    def tensor_cores(self) -> tuple[bool, str]:
        """(whether precision "high" runs on tensor cores here, why not), found once (tensor.tensor_cores)."""
        if self._tensor_cores is None:
            self._tensor_cores = tensor.tensor_cores(self.rt)
        return self._tensor_cores

    def high(self) -> bool:
        """Whether matmuls now run in precision "high": asked for, and this device has tensor cores. The first
        time it is asked for without them, a notice says why (`tinynn info` says it too)."""
        if precision.current() != "high":
            return False
        usable, why = self.tensor_cores()
        if not usable and not self.said_why:
            self.said_why = True
            warnings.warn(f"matmul precision 'high' runs as 'highest': {why}", TinynnNotice)
        return usable

    def record(self, a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()) -> bool:
        """Record out = epilogue(op(a) @ op(b)) with this shape's variant; True: the epilogue was applied."""
        record, self.last = self.plan(a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue)
        return record(a, b, out, epilogue)

    @staticmethod
    def default_pair(first: tuple, second: tuple) -> str:
        """The choice for two matmuls without tuning: one after the other (pairs win where tuning measures it)."""
        return SEPARATE

    def plan_pair(self, first: tuple, second: tuple):
        """Two independent matmuls, each (a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue) on
        real operands (tuning runs them): record(a, b, out, epilogue, a2, b2, out2, epilogue2) running both in one
        dispatch (PairedMatmul), where that was measured faster than one after the other; else None, and each
        goes its own way (`plan`). A pair fills a GPU that either alone would leave partly idle."""
        if self.forced or any(self.rows.fits(p[3], p[4], p[6], p[7], p[8], p[10]) for p in (first, second)):
            return None
        # in "high" the pair (float32) is timed against each matmul's own "high" choice
        key = "high " * self.high() + "pair " + " + ".join(shape_key(*p[3:10]) for p in (first, second))
        name = self.choices.get(key)
        if name != SEPARATE and name not in self.pair_candidates:
            worth_tuning = sum(p[3] * p[4] * p[5] * p[6] for p in (first, second)) >= self.tune_min_macs
            name = self.default_pair(first, second)
            if self._may_tune(worth_tuning):
                for p in (first, second):  # each alone first: the pair is timed against their own choices
                    self.plan(*p)
                name = self._tune(key, (first, second), self._pair_runs, name)
            if not self.one_off:
                self.choices[key] = name
        if name == SEPARATE:
            return None
        variant = self.pair_variant(name)
        run = variant.plan(first[3:], second[3:])
        description = variant.describe()

        def record(*arrays):
            self.last = description
            run(*arrays)
        return record

    def pair_variant(self, name: str) -> PairedMatmul:
        if name not in self._built:
            tile, splits = self.pair_candidates[name]
            self._built[name] = PairedMatmul(self.rt, tile, splits)
        return self._built[name]

    def time_pair(self, first: tuple, second: tuple, reps=8, rounds=2) -> dict[str, float]:
        """Milliseconds per call (as `time_variants`) of the two matmuls one after the other, each with its own
        choice (SEPARATE), and of every pair candidate that fits; `plan_pair`'s arguments."""
        return run_through(self._timing(self._pair_runs((first, second)), reps, rounds))

    def _pair_runs(self, pair: tuple) -> dict:
        """`time_pair`'s functions to time, each planned at its first call (a candidate compiles then)."""
        first, second = pair

        def separate(records):
            for record, p in zip(records, pair):
                record(p[0], p[1], p[2], p[10])
        runs = {SEPARATE: _planned_once(lambda: [self.plan(*p)[0] for p in pair], separate)}
        for name, (tile, _) in self.pair_candidates.items():
            if self._fits_config(tile):
                runs[name] = _planned_once(lambda name=name: self.pair_variant(name).plan(first[3:], second[3:]),
                                           lambda record: record(*first[:3], first[10], *second[:3], second[10]))
        return runs

    def plan(self, a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()):
        """This shape's variant (chosen, and tuned on these operands where that is worth it) made ready for the
        epilogue's parts: (record(a, b, out, epilogue) -> bool, True where it applies the epilogue; the variant's
        description, which whoever runs it keeps in `last`). The backend keeps both per shape, so an eager matmul
        seen before goes straight to its dispatches."""
        if not self.forced and self.rows.fits(batch, m, k, transpose_a, transpose_b, epilogue):  # decoding
            variant = self.rows
        else:
            key = shape_key(batch, m, n, k, transpose_a, transpose_b, shared_b)
            high = not self.forced and self.high() and TensorConfig.uses_vec4(m, n, k, transpose_a, transpose_b)
            if high:  # tuned among the tensor-core and the float32 kernels alike, under a key of its own
                key = f"high {key}"
            default = self.default_tensor_variant(batch, m, n, k) if high else self.default_variant(batch, m, n, k)
            names = self.tensor_candidates + self.candidates if high else None
            name = self.forced or self.choose(
                key, self.variants, default, (a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b),
                lambda args: self._variant_runs(args, names), batch * m * n * k >= self.tune_min_macs)
            variant = self.variant(name)
        return variant.plan(batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue), variant.describe()

    def choose(self, key: str, names, default: str, args: tuple, runs_of, worth_tuning: bool) -> str:
        """key's choice among `names`: the one kept (tuned before, or this cache file's); else `default`, tuned
        first where worth it and autotuning is on (`_tune`: now, or between a training loop's steps, timing the
        functions runs_of(args) returns by name). Kernels other than the matmuls' (ops/attention_choice.py)
        choose through it too, under keys of their own."""
        name = self.choices.get(key)
        if name not in names:
            name = default
            if self._may_tune(worth_tuning):
                name = self._tune(key, args, runs_of, default)
            if not self.one_off:
                self.choices[key] = name
        return name

    def _may_tune(self, worth_tuning: bool) -> bool:
        """Whether a shape first seen now is tuned: worth it, autotuning on, not a one-off (`transient`), and
        neither the profiler (it times one step) nor a tape recording."""
        return worth_tuning and self.autotune and not self.one_off and not self.rt.profiling and self.rt.tape is None

    @contextlib.contextmanager
    def transient(self):
        """Shapes first seen inside run their defaults, untuned and kept neither among the choices nor in the
        cache file (Backend.transient): a generator's prompt and growing window would otherwise each tune a shape
        (about a second) that never comes back."""
        outer, self.one_off = self.one_off, True
        try:
            yield
        finally:
            self.one_off = outer

    def time_variants(self, args, names=None, reps=8, rounds=2) -> dict[str, float]:
        """Milliseconds per call of each variant on these operands (`reps` calls back to back in one timed
        pass where the adapter has timestamps): the best of `rounds` rounds over all of them. Every variant
        is compiled first, then all of them run back to back for `heat_seconds` before any is timed: a GPU
        left idle while the host compiles lowers its clock, and variants timed while it climbs back would be
        ranked by the clock (BENCHMARKS.md, "Kernel tuning notes")."""
        return run_through(self._timing(self._variant_runs(args, names), reps, rounds))

    def _variant_runs(self, args: tuple, names=None) -> dict:
        names = [n for n in (names or self.candidates) if self._fits(n)]
        return {name: lambda name=name: self.variant(name).record(*args) for name in names}

    def _timing(self, runs: dict, reps: int, rounds: int):
        """`time_variants` for any functions that record dispatches, as a generator that yields after each
        function's first call (a candidate compiles then: hundreds of them can take tens of seconds) and returns
        milliseconds per call of each: `tune_pending` runs it a bounded piece at a time."""
        for run in runs.values():  # compiled before the heating starts
            run()
            yield
        heat_until = time.perf_counter() + (0.0 if self.rt.ctx.is_software else self.heat_seconds)
        while True:
            for run in runs.values():
                run()
            self.rt.sync()
            if time.perf_counter() >= heat_until:
                break
        times = {}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name] = min(times.get(name, float("inf")), self._time(run, reps))
        return times

    def _time(self, run, reps) -> float:
        if "timestamp-query" in self.rt.ctx.features:  # all of its kernels counted (split-K adds a finish)
            return self.rt.time_pass(run, reps)
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        self.rt.sync()
        return (time.perf_counter() - t0) / reps * 1e3

    def _fits(self, name) -> bool:
        config = self.variants[name]
        if isinstance(config, int):
            return config ** 2 <= self.rt.ctx.limits.get("max-compute-invocations-per-workgroup", 256)
        return self._fits_config(config)

    def _fits_config(self, config: BlockConfig) -> bool:
        try:
            config.check_device(self.rt.ctx.limits)
            return True
        except ValueError:
            return False

    def _tune(self, key: str, args: tuple, runs_of, default: str) -> str:
        """key's choice: tuned now, timing runs_of(args); or while a training loop runs (`defer`), the default,
        its tuning left to `tune_pending` on arrays of its own (the step's own may be gone, or reused, by then)."""
        if self.defer:
            if not self.pending:
                self.tuning_since = time.perf_counter()
            self.pending[key] = (runs_of, _like(args))
            return default
        progress(f"tuning kernels for {self.rt.ctx.name}, {key} (kept in {self.cache_path})")
        times = run_through(self._timing(runs_of(args), 8, 2))
        self.timed.add(key)
        return self.cache.keep(key, min(times, key=times.get))

    def tune_pending(self, seconds: float | None = None) -> bool:
        """Deferred tunings (`_tune`) for about `seconds` (default `tune_seconds_per_step`; at least one unit of
        work), each winner kept as it is found. True when the last is done and any chose other than the
        default running meanwhile: plans made before are stale (`generation` went up)."""
        until = time.perf_counter() + (self.tune_seconds_per_step if seconds is None else seconds)
        while self.pending:
            key, (runs_of, like) = next(iter(self.pending.items()))
            if self.running is None:
                progress(f"tuning kernels for {self.rt.ctx.name} between training steps, shape "
                         f"{self.tuned + 1} of {self.tuned + len(self.pending)} (kept in {self.cache_path})")
                self.running = self._timing(runs_of(_arrays(self.rt, like)), 8, 2)
            times = None
            try:
                next(self.running)
            except StopIteration as done:
                times = done.value
            except BaseException:  # a candidate failed: the shape keeps its default, the error is this step's
                del self.pending[key]
                self.running = None
                raise
            if times is not None:
                del self.pending[key]
                self.running, self.tuned = None, self.tuned + 1
                self.timed.add(key)
                name = self.cache.keep(key, min(times, key=times.get))
                self.changed |= name != self.choices.get(key)
                self.choices[key] = name
            if time.perf_counter() >= until:
                break
        if self.pending or not self.tuned:
            return False
        progress(f"tuned {self.tuned} shape(s) in {time.perf_counter() - self.tuning_since:.0f} s"
                 + (": the step is recorded again with them" if self.changed else ""))
        changed, self.changed, self.tuned = self.changed, False, 0
        self.generation += changed
        return changed


def _planned_once(plan, run):
    """A function calling run(plan()), plan called at its first call alone."""
    planned = []

    def call():
        if not planned:
            planned.append(plan())
        run(planned[0])
    return call


def _like(value):
    """value (a matmul's arguments: arrays, numbers, tuples and Epilogues of them) with every array a `Like`."""
    if isinstance(value, GpuArray):
        return Like(value)
    if isinstance(value, tuple):
        items = [_like(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def _arrays(rt, value):
    """`_like`'s inverse: a new array for every `Like` (its values whatever the pool holds: only timed)."""
    if isinstance(value, Like):
        return rt.empty(value.shape, value.dtype)
    if isinstance(value, tuple):
        items = [_arrays(rt, v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value
