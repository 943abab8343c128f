"""The tensor-core matmul of matmul precision "high": WGSL generated from tensor.wgsl for one `TensorConfig`,
with f16 subgroup matrices (Dawn's chromium_experimental_subgroup_matrix) summing in f32, and the epilogue and
split-K finish that the register-blocked kernel has (epilogue.wgsl).

Range safety: before each product a pass (scales.wgsl) finds a power of two for every row of op(a) and column of
op(b) that puts the line's largest magnitude in [2^14, 2^15); the kernel multiplies by them before rounding to
f16 and divides each result by its row's and column's after the f32 sum. Powers of two scale exactly, so the
only error is f16's 10-bit mantissa (TF32's), relative to each line's largest value, and neither a backward's
tiny gradients nor large activations leave f16's range. The same pass sums op(a)'s rows where the epilogue
asks for row sums (a weight gradient's bias gradient).

`tensor_cores(runtime)` says whether the device can run it, and why not: it needs f16 subgroup matrices of
16 x 16 x 16 with f32 results in subgroups of 32, checked by running one small product against NumPy.

`emulate` builds the same kernel with each subgroup-matrix load, multiply-accumulate and store written out in plain
WGSL over the same tiles, offsets, strides and layouts (runtime/subgroup_matrices.py; f16 tiles where the device
has shader-f16, else f32 ones rounded to f16's precision): on an adapter without subgroup matrices (lavapipe) the
tests run everything else in it, byte for byte the kernel's own.
"""
from __future__ import annotations

import numpy as np

from tinynn_gpu.matmul import epilogue
from tinynn_gpu.matmul.configs import S, TensorConfig
from tinynn_gpu.matmul.epilogue import (GeneratedMatmul, epilogue_slots, finish_arrays, finish_launch, main_launches,
                                        split_targets)
from tinynn_gpu.runtime.kernels import grid
from tinynn_gpu.runtime.subgroup_matrices import Products, kernel_parts, opaque_16
from tinynn_gpu.runtime.wgsl import fill, kernel_file, kernel_source

FEATURES = ("shader-f16", "chromium-experimental-subgroup-matrix")
MAIN_NAMES = ("a", "b", "out", "bias", "residual", "pre", "a_scales", "b_scales")


def major(transposed: bool) -> str:
    """A tile's layout for subgroupMatrixLoad: a transposed operand's tile is stored as it lies, column-major."""
    return "col_major" if transposed else "row_major"


def _copies(cfg: TensorConfig, operand: str, transposed: bool, strides: tuple) -> list[tuple[str, str, str]]:
    """One operand's tile copy as (declare, fetch, stash) lines per slot of a thread: the slot's place in the tile
    and its scales (registers, the same every step), the vec4 load times the scales, and the four stores rounded
    to f16 (`to_half`)."""
    a = operand == "a"
    side = cfg.bm if a else cfg.bn
    stride = strides[0] if a else strides[2]
    tile_size = strides[1] if a else strides[3]
    k_contiguous = (not transposed) if a else transposed
    per_line = (cfg.bk if k_contiguous else side) // 4  # vec4s along the stored tile's contiguous side
    origin, dim = ("row0", "m_dim") if a else ("col0", "n_dim")
    scales, base = ("a_scales", "a_scale_base") if a else ("b_scales", "b_scale_base")
    copies = []
    for i in range(side * cfg.bk // 4 // cfg.threads):
        v, reg = f"(lid + {i * cfg.threads}u)", f"{operand}_{i}"
        line, quad = f"{v} / {per_line}u", f"({v} % {per_line}u) * 4u"
        if k_contiguous:  # a line of the tile is one m (n); the quad runs along k: one scale
            where = f"{operand}_line_{i}", f"{operand}_k_{i}"
            declare = [f"    let {where[0]} = {line};", f"    let {where[1]} = {quad};",
                       f"    let {operand}_scale_{i} = {scales}[{base} + min({origin} + {where[0]}, {dim} - 1u)];"]
            index = (f"{origin} + {where[0]}", f"{{k0}} + {where[1]}")
        else:  # a line is one k; the quad runs along m (n): four scales
            where = f"{operand}_k_{i}", f"{operand}_line_{i}"
            declare = [f"    let {where[0]} = {line};", f"    let {where[1]} = {quad};",
                       f"    let {operand}_scale_{i} = vec4<f32>(" + ", ".join(
                           f"{scales}[{base} + min({origin} + {where[1]} + {j}u, {dim} - 1u)]"
                           for j in range(4)) + ");"]
            index = (f"{origin} + {where[1]}", f"{{k0}} + {where[0]}")
        at = f"{where[0]} * {stride}u + {where[1]}"  # its place in the stored tile: line, then quad
        declare.append(f"    var {reg}: vec4<f32>;")
        m_or_n, k = index
        load = f"load_a(a_base, {m_or_n}, {k}, k_end)" if a else f"load_b(b_base, {k}, {m_or_n}, k_end)"
        fetch = f"{reg} = {load} * {operand}_scale_{i};"
        stash = " ".join(f"{operand}_tile[{{buf}} * {tile_size}u + {at} + {j}u] = to_half({reg}.{x});"
                         for j, x in enumerate(epilogue.XYZW))
        copies.append(("\n".join(declare), fetch, stash))
    return copies


def _times(x, factor: int) -> str:
    """x * factor in WGSL: folded into a constant where x is a number (the unrolled kernel), else a loop's variable
    times it (the emulation's loops)."""
    return f"{x * factor}u" if isinstance(x, int) else f"{factor}u * {x}"


def _accumulator(mm: Products, i, j, tn: int):
    """Result matrix (i, j) of the subgroup: a subgroup matrix, or emulated two vec4s of the `acc` array."""
    if not mm.emulate:
        return f"acc_{i}_{j}"
    at = f"{2 * (i * tn + j)}u" if isinstance(i, int) else f"2u * ({i} * {tn}u + {j})"
    return f"acc[{at}]", f"acc[{at} + 1u]"


def _products(mm: Products, cfg: TensorConfig, transpose_a: bool, transpose_b: bool, strides: tuple) -> list[str]:
    """A step's products: for each 16 of BK, the subgroup's left matrices (its rows of the A tile), right matrices
    (its columns of the B tile) and every pair's multiply-accumulate; emulated, the same as WGSL loops (lavapipe
    compiles unrolled copies for minutes)."""
    a_stride, _, b_stride, _ = strides
    tm, tn = cfg.bm // (S * cfg.sg_rows), cfg.bn // (S * cfg.sg_cols)

    def left(kk, i):
        at = f"(sr + {_times(i, S)}) * {a_stride}u + {_times(kk, S)}" if not transpose_a else \
            f"{_times(kk, S * a_stride)} + sr + {_times(i, S)}"
        name = "l" if mm.emulate else f"l{kk}_{i}"
        return mm.load(name, "left", "a_tile", f"buf * A_TILE + {at}", "A_STRIDE", major(transpose_a))

    def right(kk, j):
        at = f"{_times(kk, S * b_stride)} + sc + {_times(j, S)}" if not transpose_b else \
            f"(sc + {_times(j, S)}) * {b_stride}u + {_times(kk, S)}"
        name = "r" if mm.emulate else f"r{kk}_{j}"
        return mm.load(name, "right", "b_tile", f"buf * B_TILE + {at}", "B_STRIDE", major(transpose_b))
    if mm.emulate:
        loops = [("ks", cfg.bk // S), ("i", tm), ("j", tn)]
        lines = [f"        for (var {v} = 0u; {v} < {n}u; {v} = {v} + 1u) {{" for v, n in loops]
        lines += left("ks", "i") + right("ks", "j") + mm.multiply_add("l", "r", _accumulator(mm, "i", "j", tn))
        return lines + ["        }"] * len(loops)
    products = []
    for kk in range(cfg.bk // S):
        for i in range(tm):
            products += left(kk, i)
        for j in range(tn):
            products += right(kk, j)
        products += [line for i in range(tm) for j in range(tn)
                     for line in mm.multiply_add(f"l{kk}_{i}", f"r{kk}_{j}", _accumulator(mm, i, j, tn))]
    return products


def generate(cfg: TensorConfig, transpose_a: bool, transpose_b: bool, aligned: bool = False,
             quads: bool = False, emulate: bool = False, f16: bool = True) -> str:
    """The WGSL of one configuration and layout (vec4 loads: `TensorConfig.uses_vec4`); aligned: loads without
    bounds checks, for shapes whose tiles all lie inside the operands; quads: results stored 4 columns at a time
    (N a multiple of 4); emulate: the subgroup matrices in plain WGSL, on f16 tiles or (no f16) f32 ones."""
    strides = cfg.tiles(transpose_a, transpose_b)
    enables, parts = kernel_parts(emulate, f16)  # HALF, and the subgroup and its invocation: builtins or emulated
    copies = _copies(cfg, "a", transpose_a, strides) + _copies(cfg, "b", transpose_b, strides)
    tm, tn = cfg.bm // (S * cfg.sg_rows), cfg.bn // (S * cfg.sg_cols)
    mm = Products(emulate, "    ")  # the declarations and stores; the products indent by 8
    declare = [d for d, _, _ in copies]
    declare += [f"    var acc: array<vec4<f32>, {2 * tm * tn}u>;"] if emulate else \
        [line for i in range(tm) for j in range(tn) for line in mm.zero(f"acc_{i}_{j}")]

    def fetch(k0, indent):
        return [indent + f.replace("{k0}", k0) for _, f, _ in copies]

    def stash(buf, indent):
        return [indent + s.replace("{buf}", buf) for _, _, s in copies]
    if cfg.double:
        prologue = fetch("k_begin", "    ") + stash("0u", "    ") + ["    workgroupBarrier();"]
        fetch_next = ["        let more = k0 + BK < k_end;", "        if (more) {"] + \
            fetch("(k0 + BK)", "            ") + ["        }"]
        stash_next = ["        if (more) {"] + stash("(1u - buf)", "            ") + ["        }"]
    else:
        prologue, stash_next = [], []
        fetch_next = fetch("k0", "        ") + stash("0u", "        ") + ["        workgroupBarrier();"]
    products = _products(Products(emulate, steps=opaque_16("params.k")), cfg, transpose_a, transpose_b, strides)
    stores = []
    for i in range(tm):
        for j in range(tn):
            stores += mm.store(_accumulator(mm, i, j, tn), "results", "slot", "16u")
            stores += [
                "    workgroupBarrier();",
                "    {",
                f"        let m = row0 + sr + {i * S}u + r;",
                f"        let n = col0 + sc + {j * S}u + c;",
                "        let inv_a = 1.0 / a_scales[a_scale_base + min(m, m_dim - 1u)];",
            ]
            for h in range(2):  # two quads of columns
                values = ", ".join(f"results[slot + r * 16u + c + {4 * h + q}u]" for q in range(4))
                inv_b = ", ".join(f"b_scales[b_scale_base + min(n + {4 * h + q}u, n_dim - 1u)]" for q in range(4))
                stores.append(f"        store(out_base, m, n + {4 * h}u, vec4<f32>({values}) * inv_a / "
                              f"vec4<f32>({inv_b}), raw);")
            stores += ["    }", "    workgroupBarrier();"]
    shared, problem = epilogue.parts()
    loads = "vec4 loads into f16 tiles" + (", double-buffered" if cfg.double else "")
    problem = fill(problem, epilogue.problem_fills(transpose_a, transpose_b, True, aligned, "", 0, quads, loads))
    a_stride, a_tile, b_stride, b_tile = strides
    fills = {
        "BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "SG_COLS": cfg.sg_cols, "THREADS": cfg.threads,
        "A_STRIDE": a_stride, "B_STRIDE": b_stride, "A_TILE": a_tile, "B_TILE": b_tile,
        "A_TILES": cfg.buffers * a_tile, "B_TILES": cfg.buffers * b_tile, "RESULTS": S * S * cfg.sg_rows * cfg.sg_cols,
        "SUB_M": tm * S, "SUB_N": tn * S, "BUFFERS": cfg.buffers, "PROBLEMS": problem,
        "DECLARE": "\n".join(declare), "PROLOGUE": "\n".join(prologue), "FETCH": "\n".join(fetch_next),
        "PRODUCTS": "\n".join(products), "STASH": "\n".join(stash_next), "STORES": "\n".join(stores),
        **parts, **epilogue.module_fills(quads),
    }
    text = fill(shared, fills) + "\n" + fill(kernel_file("tensor"), fills)
    return enables + kernel_file("common") + "\n" + text


LOADS = 16  # floats a thread of the scales pass reads from a line (scales.wgsl)


def scales_params(batch, m, n, k, transpose_a, transpose_b, shared_b, sums: bool) -> tuple[int, int, int, dict]:
    """(workgroups, the finish's threads (0: none), floats of partial results, params) of the scales pass
    (scales.wgsl) for op(a)'s rows and op(b)'s columns."""
    a_lines = (1, m) if transpose_a else (k, 1)  # (line stride, k stride)
    b_lines = (k, 1) if transpose_b else (1, n)
    b_batches = 1 if shared_b else batch

    def split(batches, lines, k_stride):  # (workgroups, chunks)
        per_line = 64 if k_stride == 1 else 4
        chunks = max(1, -(-k // (LOADS * per_line)))  # K = 0 too: every line still gets its scale (1), sum (0)
        return batches * -(-lines // (256 // per_line)) * chunks, chunks
    a_groups, a_chunks = split(batch, m, a_lines[1])
    b_groups, b_chunks = split(b_batches, n, b_lines[1])
    params = {"a_batches": batch, "a_lines": m, "a_k": k, "a_line_stride": a_lines[0], "a_k_stride": a_lines[1],
              "a_batch_stride": m * k, "b_batches": b_batches, "b_lines": n, "b_k": k, "b_line_stride": b_lines[0],
              "b_k_stride": b_lines[1], "b_batch_stride": k * n, "a_groups": a_groups, "sums": int(sums),
              "a_chunks": a_chunks, "b_chunks": b_chunks}
    finish = (batch * m if a_chunks > 1 else 0) + (b_batches * n if b_chunks > 1 else 0)
    return a_groups + b_groups, finish, 2 * (batch * a_chunks * m + b_batches * b_chunks * n), params


SCALES_NAMES = ("a", "b", "a_scales", "b_scales", "row_sums", "parts")


def scales_launch(rt, batch, m, n, k, transpose_a, transpose_b, shared_b, sums: bool):
    """The scales pass: record(a, b, a_scales (batch * m), b_scales ((1 if shared_b else batch) * n), row_sums
    (batch * m) or None)."""
    groups, finishing, parts, params = scales_params(batch, m, n, k, transpose_a, transpose_b, shared_b, sums)
    shader = rt.shader(kernel_source("scales"), "matmul scales")
    main = rt.prepare(shader, "matmul_scales_main", grid(groups), SCALES_NAMES, params)
    finish = rt.prepare(shader, "matmul_scales_finish_main", grid(-(-finishing // 256)), SCALES_NAMES[2:], params) \
        if finishing else None

    def record(a, b, a_scales, b_scales, row_sums):
        sums = rt.stand_in(2) if row_sums is None else row_sums
        partial = rt.empty((parts,)) if finish is not None else rt.stand_in(3)
        rt.launch(main, (a, b, a_scales, b_scales, sums, partial))
        rt.launch(finish, (a_scales, b_scales, sums, partial))
    return record


class TensorMatmul(GeneratedMatmul):
    def __init__(self, runtime, config: TensorConfig, emulate: bool = False):
        """emulate: the kernel's subgroup matrices in plain WGSL (`generate`), its tiles f32 where the device has no
        shader-f16 (which takes twice their workgroup memory)."""
        self.emulate = emulate
        self.f16 = not emulate or "shader-f16" in runtime.ctx.features
        if not self.f16:
            config.check_device(runtime.ctx.limits, half_bytes=4)
        super().__init__(runtime, config)
        self.description += " emulated" * emulate

    def _recorder(self, plan, batch, m, n, shared_b):
        """record(a, b, out, epilogue): the scales pass, the product's dispatches and, with split-K, the finish."""
        scales, launches, finish, splits = plan
        rt = self.rt
        stand_ins = rt.stand_in(0), rt.stand_in(1), rt.stand_in(2)
        sizes = None if finish is None else (batch * splits * m * n, batch * splits * m)
        scale_sizes = (batch * m,), ((1 if shared_b else batch) * n,)

        def record(a, b, out, epilogue):
            bias, _, pre, residual, row_sums, _ = epilogue
            a_scales, b_scales = rt.empty(scale_sizes[0]), rt.empty(scale_sizes[1])
            scales(a, b, a_scales, b_scales, row_sums)
            target, _ = split_targets(rt, sizes, out, None)
            arrays = (a, b, target, *epilogue_slots(bias, residual, pre, None, stand_ins)[:3], a_scales, b_scales)
            for launch in launches:
                rt.launch(launch, arrays)
            if finish is not None:
                rt.launch(finish, finish_arrays(out, epilogue._replace(row_sums=None), target, None, stand_ins))
            return True
        return record

    def _plan(self, problem, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue):
        cfg = self.config
        splits, layout, params = problem
        params["row_sums"] = 0  # the scales pass sums the rows
        layout = (transpose_a, transpose_b, layout[3], n % 4 == 0)  # aligned, quads (loads: vec4 always)
        module = self.module(layout, f"ta={int(transpose_a)} tb={int(transpose_b)}{' aligned' * layout[2]}"
                             f"{' quads' * layout[3]}{' emulated' * self.emulate}",
                             lambda: generate(cfg, *layout, self.emulate, self.f16))
        launches = main_launches(self.rt, module, MAIN_NAMES, cfg, batch * splits, m, n, params)
        scales = scales_launch(self.rt, batch, m, n, k, transpose_a, transpose_b, shared_b,
                               epilogue.row_sums is not None)
        return scales, launches, finish_launch(self.rt, module, params, layout[3]), splits


def tensor_cores(runtime) -> tuple[bool, str]:
    """(whether this device runs the tensor-core matmul, why not): its features, then one 64 x 64 x 64 product of
    a small configuration checked against NumPy's (a driver may offer the feature with other matrix shapes or
    subgroup sizes)."""
    ctx = runtime.ctx
    missing = [f for f in FEATURES if f not in ctx.features]
    if missing:
        hint = "" if ctx.implementation.name == "dawn" else \
            " (Dawn does where the adapter has f16 subgroup matrices: TINYNN_WEBGPU=dawn, the tinynn-gpu[dawn] extra)"
        return False, f"{ctx.name} offers no {' or '.join(missing)}{hint}"
    try:
        config = TensorConfig(32, 32, 16, 2, 2)
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((64, 64), np.float32), rng.standard_normal((64, 64), np.float32)
        a, b, out = runtime.upload(x), runtime.upload(y), runtime.empty((64, 64))
        TensorMatmul(runtime, config).record(a, b, out, 1, 64, 64, 64, False, False, False)
        got = runtime.read(out)
    except Exception as e:  # a compile or pipeline error: the feature is there but not in the form we need
        return False, f"{ctx.name}'s subgroup matrices failed a test product ({type(e).__name__}: {e})"
    error = float(np.abs(got - x @ y).max() / np.abs(x @ y).max())
    if not error < 3e-3:
        return False, f"{ctx.name}'s subgroup matrices gave a wrong test product (relative error {error:.1e})"
    return True, ""
