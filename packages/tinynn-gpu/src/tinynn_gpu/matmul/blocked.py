"""The register-blocked matmul: WGSL generated from blocked.wgsl for one block configuration (configs.py).

`BlockConfig` names a variant (block BM x BN x BK, TM x TN results per thread); `generate` fills the template
with fully unrolled code, one variable per vec4 accumulator (see the template's header for why).
`BlockedMatmul` compiles a variant per operand layout on first use and records its dispatches, with an
`Epilogue` (bias, GELU, residual add, row sums, GELU's gradient) fused into the stores. `generate_pair` writes
two problems into one module, for paired.py.
"""
from __future__ import annotations

from tinynn_gpu.matmul.configs import BlockConfig
from tinynn_gpu.matmul.problem import Epilogue, Layout, epilogue_parts, problem_plan
from tinynn_gpu.runtime.kernels import MAX_GROUPS, grid, trim
from tinynn_gpu.runtime.wgsl import fill, kernel_file

XYZW = "xyzw"


def _tile_copy(cfg: BlockConfig, operand: str, k_fastest: bool, vec4: bool, registers: str = "", problem: str = "") \
        -> list[tuple[str, str, str]]:
    """One operand's tile copy (BK x B{M,N}, stored as vec4 along m or n) as (opening, fetch, stash) per slot
    of a thread: the opening is a guard where not every thread has the slot and the slot's place in the tile;
    fetch reads global memory into the registers {operand}{registers}_{slot}, stash writes them into the
    workgroup tile in buffer `{operand}_buf`, rows of BM/4 (or BN/4) vec4s, padded by one where the config asks.
    Fetch takes its tile's first k as `{origin}`, so that double buffering can fetch the next tile while the
    current one is in use; it calls the load functions of `problem` (a name suffix: "" or a pair's "2").
    Scalar loads: each slot is one tile entry. vec4 loads: along m (or n) a quad is one tile entry; along k
    a thread loads a 4 x 4 block (4 rows, a quad of k each) and transposes it into 4 tile entries, or with
    `spread` one quad of k, whose 4 values go into 4 tile entries one float each."""
    width4 = (cfg.bm if operand == "a" else cfg.bn) // 4
    tile = f"{operand}_tile"
    index = ("row0" if operand == "a" else "col0") + " + 4u * w4"

    def load(i, k):  # the problem's own load function (the template's `problem` part)
        return f"load_a{problem}(a_base, {i}, {k}, k_end)" if operand == "a" else \
            f"load_b{problem}(b_base, {k}, {i}, k_end)"
    quads = vec4 and k_fastest
    total = width4 * (cfg.bk // 4) * (4 if cfg.spread else 1) if quads else cfg.bk * width4
    copies = []
    for i in range(-(-total // cfg.threads)):
        slot, reg = f"lid + {i * cfg.threads}u", f"{operand}{registers}_{i}"
        if quads and cfg.spread:
            # a warp takes 2 quads of k (32 bytes of a row: whole sectors) of 16 rows, so that its stores into the
            # padded tile (4 rows of k 16 banks apart) hit 32 banks once each
            first = ("row0" if operand == "a" else "col0") + " + r"
            where = (f"let kq = ({slot}) % 2u + 2u * ((({slot}) / 32u) % {cfg.bk // 8}u); "
                     f"let r = (({slot}) / 2u) % 16u + 16u * (({slot}) / {16 * cfg.bk // 4}u);")
            fetch = f"{reg} = {load(first, '{origin} + 4u * kq')};"
            stash = " ".join(f"{tile}[{operand}_buf][4u * kq + {j}u][r / 4u][r % 4u] = {reg}.{x};"
                             for j, x in enumerate(XYZW))
        elif quads:  # neighbouring threads take neighbouring quads of k
            where = f"let kq = ({slot}) % {cfg.bk // 4}u; let w4 = ({slot}) / {cfg.bk // 4}u;"
            fetch = " ".join(f"{reg}[{c}] = {load(f'{index} + {c}u', '{origin} + 4u * kq')};" for c in range(4))
            stash = " ".join(f"{tile}[{operand}_buf][4u * kq + {j}u][w4] = "
                             f"vec4<f32>({reg}[0].{x}, {reg}[1].{x}, {reg}[2].{x}, {reg}[3].{x});"
                             for j, x in enumerate(XYZW))
        else:
            if k_fastest:  # k contiguous in memory: neighbouring threads take neighbouring k
                where = f"let k = ({slot}) % {cfg.bk}u; let w4 = ({slot}) / {cfg.bk}u;"
            else:  # m (or n) contiguous: neighbouring threads take neighbouring 4-wide groups
                where = f"let k = ({slot}) / {width4}u; let w4 = ({slot}) % {width4}u;"
            fetch = f"{reg} = {load(index, '{origin} + k')};" if vec4 else \
                f"{reg} = vec4<f32>({', '.join(load(f'{index} + {c}u', '{origin} + k') for c in range(4))});"
            stash = f"{tile}[{operand}_buf][k][w4] = {reg};"
        guard = f"if ({slot} < {total}u) " if (i + 1) * cfg.threads > total else ""
        copies.append((f"{guard}{{ {where} ", fetch, stash))
    return copies


def _registers(cfg: BlockConfig, operand: str, k_fastest: bool, vec4: bool, registers: str = "") -> list[str]:
    kind = "array<vec4<f32>, 4>" if vec4 and k_fastest and not cfg.spread else "vec4<f32>"
    return [f"    var {operand}{registers}_{i}: {kind};"
            for i in range(len(_tile_copy(cfg, operand, k_fastest, vec4)))]




def generate(cfg: BlockConfig, transpose_a: bool, transpose_b: bool, vec4: bool = False, aligned: bool = False,
             quads: bool = False) -> str:
    """The WGSL of one configuration and layout; vec4: with vec4 global loads (see BlockConfig.uses_vec4);
    aligned: loads without bounds checks, for shapes whose tiles all lie inside the operands (BlockConfig.aligned);
    quads: results stored (and the epilogue's arrays read and written) 4 columns at a time, for N a multiple of 4."""
    return _module(cfg, [(bool(transpose_a), bool(transpose_b), vec4, aligned)], quads)


def generate_pair(cfg: BlockConfig, first: Layout, second: Layout, quads: bool = False) -> str:
    """The WGSL of one configuration with two problems (each a `Layout`): matmul_pair_main runs both in one
    dispatch, matmul_main and matmul_finish_main the first alone (a pair's finishes take either's params).
    quads: as `generate`'s, for both (each N a multiple of 4)."""
    return _module(cfg, [first, second], quads)


def stores_quads(*ns: int) -> bool:
    """Whether a module for outputs of these widths (N) stores 4 columns at a time: every row then starts on a
    quad."""
    return all(n % 4 == 0 for n in ns)


def _template() -> tuple[str, str, str, str]:
    """blocked.wgsl's parts: the module, the pair's entry, one problem's declarations, one block's product."""
    module, rest = kernel_file("blocked").split("//:: pair\n")
    pair, rest = rest.split("//:: problem\n")
    problem, product = rest.split("//:: product\n")
    return module, pair, problem, product


def _module(cfg: BlockConfig, layouts: list, quads: bool) -> str:
    module, pair, problem_part, product_part = _template()
    problems, products = [], []
    for i, layout in enumerate(layouts):
        fills = _problem_fills(cfg, *layout, "2" if i else "", 10 * (i > 0), quads, len(layouts) == 2)
        problems.append(fill(problem_part, fills))
        products.append(fill(product_part, fills))
    text = module.replace("{{PAIR}}", pair if len(layouts) == 2 else "")
    text = text.replace("{{PROBLEMS}}", "\n".join(problems)).replace("{{PRODUCT}}", products[0])
    text = text.replace("{{PRODUCT2}}", products[-1])
    fills = {
        "BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "THREADS_M": cfg.bm // cfg.tm, "THREADS_N": cfg.bn // cfg.tn,
        "THREADS": cfg.threads, "GROUP": cfg.group, "BUFFERS": cfg.buffers, "A_STRIDE": cfg.bm // 4 + cfg.pad,
        "B_STRIDE": cfg.bn // 4 + cfg.pad, "VALUE": "vec4<f32>" if quads else "f32", "WIDTH": 4 if quads else 1,
        "GELU_VALUE": "Value(" + ", ".join(f"gelu(x.{x})" for x in XYZW) + ")" if quads else "gelu(x)",
        "GELU_GRAD_VALUE": "Value(" + ", ".join(f"gelu_grad(x.{x}, g.{x})" for x in XYZW) + ")" if quads
        else "gelu_grad(x, g)",
    }
    return kernel_file("common") + "\n" + fill(text, fills)  # common.wgsl's gelu with it


def _problem_fills(cfg: BlockConfig, transpose_a: bool, transpose_b: bool, vec4: bool, aligned: bool, p: str,
                   binding: int, quads: bool, shared_sums: bool) -> dict:
    """The template's `problem` and `product` fills for one problem: names suffixed by p, its own bindings from
    `binding` on (a, b, out, params: 0-3 for the first problem, 10-13 for a pair's second; its split-K slices and
    row sums: 8-9, 14-15); `quads`: the module's (`generate`)."""
    qm, qn = cfg.tm // 4, cfg.tn // 4
    declare = [f"    var acc_{i}_{q} = vec4<f32>(0.0);" for i in range(cfg.tm) for q in range(qn)]
    declare += [f"    let a_column_{q} = ty + {q}u * THREADS_M;" for q in range(qm)]  # this thread's tile columns
    declare += [f"    let b_column_{q} = tx + {q}u * THREADS_N;" for q in range(qn)]
    declare += _registers(cfg, "a", not transpose_a, vec4) + _registers(cfg, "b", transpose_b, vec4)
    copies = _tile_copy(cfg, "a", not transpose_a, vec4, problem=p) + \
        _tile_copy(cfg, "b", transpose_b, vec4, problem=p)
    if cfg.ahead > 1:  # a second set of registers, `far`, receives the tile after the next one
        declare += _registers(cfg, "a", not transpose_a, vec4, "_far") + \
            _registers(cfg, "b", transpose_b, vec4, "_far")
        far = _tile_copy(cfg, "a", not transpose_a, vec4, "_far", p) + \
            _tile_copy(cfg, "b", transpose_b, vec4, "_far", p)

    def fetch(origin, indent, copies=copies):
        return [f"{indent}{where}{f.format(origin=origin)} }}" for where, f, _ in copies]

    def stash(buffer, indent):
        return [f"{indent}let a_buf = {buffer};", f"{indent}let b_buf = {buffer};"] + \
            [f"{indent}{where}{s} }}" for where, _, s in copies]

    def copy(origin, indent):  # fetch and stash in one statement: no register lives past it
        return [f"{indent}let a_buf = 0u;", f"{indent}let b_buf = 0u;"] + \
            [f"{indent}{where}{f.format(origin=origin)} {s} }}" for where, f, s in copies]
    if cfg.double and cfg.ahead > 1:  # the first tile stashed and the second fetched before the loop; in the loop
        # the far registers receive the tile after next, then move into the near ones once the next is stashed
        prologue = ["    {"] + copy("k_begin", "        ") + ["    }", "    if (k_begin + BK < k_end) {"] + \
            fetch("k_begin + BK", "        ") + ["    }", "    workgroupBarrier();"]
        fetch_next = ["        if (k0 + 2u * BK < k_end) {"] + fetch("k0 + 2u * BK", "            ", far) + \
            ["        }"]
        stash_next = ["        if (k0 + BK < k_end) {"] + stash("(1u - buf)", "            ") + ["        }"]
        stash_next += [f"        {op}_{i} = {op}_far_{i};"
                       for op, k_fastest in (("a", not transpose_a), ("b", transpose_b))
                       for i in range(len(_tile_copy(cfg, op, k_fastest, vec4)))]
    elif cfg.double:  # the first tile before the loop; in the loop the next tile's loads overlap the products
        prologue = ["    {"] + copy("k_begin", "        ") + ["    }", "    workgroupBarrier();"]
        fetch_next = ["        if (k0 + BK < k_end) {"] + fetch("k0 + BK", "            ") + ["        }"]
        stash_next = ["        if (k0 + BK < k_end) {"] + stash("(1u - buf)", "            ") + ["        }"]
    else:
        prologue, stash_next = [], []
        fetch_next = ["        {"] + copy("k0", "            ") + ["        }", "        workgroupBarrier();"]
    inner = []
    for kk in range(cfg.bk):
        inner += [f"        let a{kk}_{q} = a_tile[buf][{kk}u][a_column_{q}];"
                  for q in range(qm)]
        inner += [f"        let b{kk}_{q} = b_tile[buf][{kk}u][b_column_{q}];"
                  for q in range(qn)]
        inner += [f"        acc_{i}_{q} = acc_{i}_{q} + a{kk}_{i // 4}.{XYZW[i % 4]} * b{kk}_{q};"
                  for i in range(cfg.tm) for q in range(qn)]
    row_sum, row_sum_store = _row_sums(cfg, shared_sums)
    store = [f"    store{p}(out_base, row0 + 4u * (ty + {i // 4}u * THREADS_M) + {i % 4}u, "
             f"col0 + 4u * (tx + {q}u * THREADS_N), acc_{i}_{q}, raw);" for i in range(cfg.tm) for q in range(qn)]
    zero = "vec4<f32>(0.0)" if vec4 else "0.0"
    store_values = [f"    store_value{p}(i / 4u, n, acc, raw);"] if quads else \
        [f"    store_value{p}(i{plus}, n{plus}, acc.{x}, raw);"
         for plus, x in zip(("", " + 1u", " + 2u", " + 3u"), XYZW)]
    return {
        "P": p, "A_BINDING": binding, "B_BINDING": binding + 1, "OUT_BINDING": binding + 2,
        "PARAMS_BINDING": binding + 3, "PARTS_BINDING": 14 if binding else 8, "ROW_PARTS_BINDING": 15 if binding else 9,
        "A_LAYOUT": "stored K x M (transposed)" if transpose_a else "stored M x K",
        "B_LAYOUT": "stored N x K (transposed)" if transpose_b else "stored K x N",
        "ELEMENT": "vec4<f32>" if vec4 else "f32",
        "QUAD": " / 4u" if vec4 else "",
        "LOADS": ("vec4 loads" if vec4 else "scalar loads") + (", double-buffered" if cfg.double else ""),
        "ALIGNED": ", aligned (no load checks)" if aligned else "",
        "A_GUARD": "" if aligned else f"    if (m >= params{p}.m || k >= k_end) {{ return {zero}; }}",
        "B_GUARD": "" if aligned else f"    if (k >= k_end || n >= params{p}.n) {{ return {zero}; }}",
        "A_INDEX": f"base + k * params{p}.m + m" if transpose_a else f"base + m * params{p}.k + k",
        "B_INDEX": f"base + n * params{p}.k + k" if transpose_b else f"base + k * params{p}.n + n",
        "DECLARE": "\n".join(declare), "PROLOGUE": "\n".join(prologue), "FETCH": "\n".join(fetch_next),
        "INNER": "\n".join(inner), "ROW_SUM": "\n".join(row_sum), "ROW_SUM_STORE": "\n".join(row_sum_store),
        "STASH": "\n".join(stash_next),
        "STORE": "\n".join(store), "STORE_VALUES": "\n".join(store_values),
    }


def _row_sums(cfg: BlockConfig, shared: bool) -> tuple[list[str], list[str]]:
    """The row sums' lines (the template's ROW_SUM, in the loop, and ROW_SUM_STORE, after the stores). Shared (a
    pair's module): thread `lid` sums the quad of rows `lid % (BM / 4)` over the tile's k = lid / (BM / 4) + j *
    groups, then the groups' partial sums meet in the A tiles. Else, and where the threads are no whole number of
    groups or more than the A tiles' vec4s (some of the experiments' blocks), the first BM / 4 threads sum every k.

    Only pairs share: the forward's single matmuls, which sum no rows, compiled slower with the shared form."""
    quads, stride = cfg.bm // 4, cfg.bm // 4 + cfg.pad
    groups, tile = cfg.threads // quads, stride * cfg.bk  # tile: the vec4s in one buffer of the A tiles
    store = ["        for (var c = 0u; c < 4u; c = c + 1u) {",
             "            let m = row0 + 4u * lid + c;",
             "            if (m < m_dim) { row_sums[z * m_dim + m] = row_sum[c]; }",
             "        }"]
    if not shared or cfg.threads % quads or cfg.threads > cfg.buffers * tile:
        return (["        if (sum_rows && lid < BM / 4u) {"]
                + [f"            row_sum = row_sum + a_tile[buf][{k}u][lid];" for k in range(cfg.bk)] + ["        }"],
                ["    if (sum_rows && lid < BM / 4u) {"] + store + ["    }"])
    summed = ["        if (sum_rows) {"]
    for k in range(0, cfg.bk, groups):
        line = f"row_sum = row_sum + a_tile[buf][lid / {quads}u + {k}u][lid % {quads}u];"
        summed.append(f"            {line}" if k + groups <= cfg.bk else
                      f"            if (lid / {quads}u + {k}u < BK) {{ {line} }}")
    summed.append("        }")
    return summed, ["    if (sum_rows) {  // the loop's last barrier has passed: the A tiles are free",
                    f"        a_tile[lid / {tile}u][lid / {stride}u % BK][lid % {stride}u] = row_sum;",
                    "        workgroupBarrier();",
                    f"        if (lid < {quads}u) {{",
                    f"            for (var i = lid + {quads}u; i < THREADS; i = i + {quads}u) {{",
                    f"                row_sum = row_sum + a_tile[i / {tile}u][i / {stride}u % BK][i % {stride}u];",
                    "            }"] + ["    " + line for line in store] + ["        }", "    }"]


EPILOGUE_NAMES = ("bias", "residual", "pre", "row_sums")  # the bindings the template names, shared by a pair
MAIN_NAMES = ("a", "b", "out", *EPILOGUE_NAMES)
FINISH_NAMES = ("out", *EPILOGUE_NAMES, "parts", "row_parts")


class BlockedMatmul:
    def __init__(self, runtime, config: BlockConfig):
        config.check_device(runtime.ctx.limits)
        self.rt = runtime
        self.config = config
        self.modules = {}
        self.description = f"blocked {config.name}"  # made once: the selector asks for it every matmul
        self.plans = {}  # (layout, shape, epilogue parts) -> (splits, [main Launch, ...], finish Launch or None)

    def describe(self) -> str:
        return self.description

    def record(self, a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()) -> bool:
        """Record out = epilogue(op(a) @ op(b)); True: the epilogue was applied (always, for this kernel)."""
        return self.plan(batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue)(a, b, out, epilogue)

    def plan(self, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()):
        """record(a, b, out, epilogue) for this shape and the epilogue's parts (see `MatmulSelector.plan`): the
        module, split count and dispatches made ready once."""
        key = (transpose_a, transpose_b, batch, m, n, k, shared_b, *epilogue_parts(epilogue))
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._plan(batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue)
            trim(self.plans)
        splits, launches, finish = plan
        rt = self.rt
        stand_ins = rt.stand_in(0), rt.stand_in(1), rt.stand_in(2)
        sizes = None if finish is None else (batch * splits * m * n, batch * splits * m)

        def record(a, b, out, epilogue):
            bias, _, pre, residual, row_sums, _ = epilogue
            if finish is None:  # `split_targets` and `epilogue_slots` written out: every eager matmul runs this
                arrays = (a, b, out, stand_ins[0] if bias is None else bias,
                          stand_ins[0] if residual is None else residual, stand_ins[1] if pre is None else pre,
                          stand_ins[2] if row_sums is None else row_sums)
                for launch in launches:
                    rt.launch(launch, arrays)
                return True
            target, row_target = split_targets(rt, sizes, out, row_sums)  # split-K
            arrays = (a, b, target, *epilogue_slots(bias, residual, pre, row_target, stand_ins))
            for launch in launches:
                rt.launch(launch, arrays)
            rt.launch(finish, finish_arrays(out, epilogue, target, row_target, stand_ins))
            return True
        return record

    def _plan(self, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue):
        cfg = self.config
        splits, layout, params = problem_plan(cfg, cfg.splits, batch, m, n, k, transpose_a, transpose_b, shared_b,
                                              epilogue)
        quads = stores_quads(n)
        module = self.modules.get((layout, quads))
        if module is None:
            name = (f"matmul {cfg.name} ta={int(layout[0])} tb={int(layout[1])}{' vec4 loads' if layout[2] else ''}"
                    f"{' aligned' if layout[3] else ''}{' quads' if quads else ''}")
            module = self.modules[layout, quads] = self.rt.shader(generate(cfg, *layout, quads), name)
        blocks_n, blocks_m, zs = -(-n // cfg.bn), -(-m // cfg.bm), batch * splits
        # grids past the per-dimension limit: several dispatches, each told where it starts
        launches = [self.rt.prepare(module, "matmul_main", (blocks_n, min(MAX_GROUPS, blocks_m - y0),
                                                            min(MAX_GROUPS, zs - z0)),
                                    MAIN_NAMES, {**params, "y_offset": y0, "z_offset": z0})
                    for z0 in range(0, zs, MAX_GROUPS) for y0 in range(0, blocks_m, MAX_GROUPS)]
        return splits, launches, finish_launch(self.rt, module, params, quads)


def split_targets(rt, sizes: tuple | None, out, row_sums) -> tuple:
    """Where a matmul stores its sums: its output and row sums, or with split-K (`sizes`: the float counts of the
    splits' slices and of their row sums) fresh slices, which matmul_finish_main adds up into those."""
    if sizes is None:
        return out, row_sums
    return rt.empty((sizes[0],)), None if row_sums is None else rt.empty((sizes[1],))


def epilogue_slots(bias, residual, pre, row_sums, stand_ins: tuple) -> tuple:
    """The arrays of the epilogue's bindings (EPILOGUE_NAMES), a stand-in (`Runtime.stand_in` 0, 0, 1, 2) for each one
    absent."""
    return (stand_ins[0] if bias is None else bias, stand_ins[0] if residual is None else residual,
            stand_ins[1] if pre is None else pre, stand_ins[2] if row_sums is None else row_sums)


def finish_arrays(out, epilogue: Epilogue, target, row_target, stand_ins: tuple) -> tuple:
    """matmul_finish_main's arrays (FINISH_NAMES): the output, the epilogue's, the splits' slices and row sums."""
    return (out, *epilogue_slots(epilogue.bias, epilogue.residual, epilogue.pre, epilogue.row_sums, stand_ins),
            target, stand_ins[0] if row_target is None else row_target)


def finish_launch(rt, module, params: dict, quads: bool):
    """The split-K finish's Launch for a problem's params (None without splits): it adds the splits' slices into the
    output and its row sums, a thread per Value (4 floats where the module stores quads)."""
    if params["splits"] == 1:
        return None
    values = params["batch"] * params["m"] * params["n"] // (4 if quads else 1)
    return rt.prepare(module, "matmul_finish_main", grid(-(-values // 256)), FINISH_NAMES, params)
