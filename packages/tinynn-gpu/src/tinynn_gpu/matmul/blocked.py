"""The register-blocked matmul: WGSL generated from blocked.wgsl for one block configuration (configs.py).

`BlockConfig` names a variant (block BM x BN x BK, TM x TN results per thread); `generate` fills the template
with fully unrolled code, one variable per vec4 accumulator (see the template's header for why).
`BlockedMatmul` compiles a variant per operand layout on first use and records its dispatches, with an
`Epilogue` (bias, GELU, residual add, row sums, GELU's gradient) fused into the stores. `generate_pair` writes
two problems into one module, for paired.py.
"""
from __future__ import annotations

from tinynn_gpu.matmul import epilogue
from tinynn_gpu.matmul.configs import BlockConfig
from tinynn_gpu.matmul.epilogue import (MAIN_NAMES, XYZW, GeneratedMatmul, epilogue_slots, finish_arrays,
                                        finish_launch, main_launches, split_targets)
from tinynn_gpu.matmul.problem import Layout
from tinynn_gpu.runtime.wgsl import fill, kernel_file


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


def _template() -> tuple[str, str, str]:
    """blocked.wgsl's parts: the module, the pair's entry, one block's product."""
    module, rest = kernel_file("blocked").split("//:: pair\n")
    pair, product = rest.split("//:: product\n")
    return module, pair, product


def _module(cfg: BlockConfig, layouts: list, quads: bool) -> str:
    module, pair, product_part = _template()
    shared, problem_part = epilogue.parts()
    problems, products = [], []
    for i, layout in enumerate(layouts):
        fills = _problem_fills(cfg, *layout, "2" if i else "", 10 * (i > 0), quads, len(layouts) == 2)
        problems.append(fill(problem_part, fills))
        products.append(fill(product_part, fills))
    text = shared + module.replace("{{PAIR}}", pair if len(layouts) == 2 else "")
    text = text.replace("{{PROBLEMS}}", "\n".join(problems)).replace("{{PRODUCT}}", products[0])
    text = text.replace("{{PRODUCT2}}", products[-1])
    fills = {
        "BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "THREADS_M": cfg.bm // cfg.tm, "THREADS_N": cfg.bn // cfg.tn,
        "THREADS": cfg.threads, "GROUP": cfg.group, "BUFFERS": cfg.buffers, "A_STRIDE": cfg.bm // 4 + cfg.pad,
        "B_STRIDE": cfg.bn // 4 + cfg.pad, **epilogue.module_fills(quads),
    }
    return kernel_file("common") + "\n" + fill(text, fills)  # common.wgsl's gelu with it


def _problem_fills(cfg: BlockConfig, transpose_a: bool, transpose_b: bool, vec4: bool, aligned: bool, p: str,
                   binding: int, quads: bool, shared_sums: bool) -> dict:
    """The `product` fills and epilogue.wgsl's `problem` fills (`epilogue.problem_fills`) for one problem;
    `quads`: the module's (`generate`)."""
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
    loads = ("vec4 loads" if vec4 else "scalar loads") + (", double-buffered" if cfg.double else "")
    return {
        **epilogue.problem_fills(transpose_a, transpose_b, vec4, aligned, p, binding, quads, loads),
        "DECLARE": "\n".join(declare), "PROLOGUE": "\n".join(prologue), "FETCH": "\n".join(fetch_next),
        "INNER": "\n".join(inner), "ROW_SUM": "\n".join(row_sum), "ROW_SUM_STORE": "\n".join(row_sum_store),
        "STASH": "\n".join(stash_next), "STORE": "\n".join(store),
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


class BlockedMatmul(GeneratedMatmul):
    prefix = "blocked "

    def _recorder(self, plan, batch, m, n, shared_b):
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

    def _plan(self, problem, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue):
        cfg = self.config
        splits, layout, params = problem
        quads = stores_quads(n)
        module = self.module((layout, quads), f"ta={int(layout[0])} tb={int(layout[1])}{' vec4 loads' * layout[2]}"
                             f"{' aligned' * layout[3]}{' quads' * quads}", lambda: generate(cfg, *layout, quads))
        launches = main_launches(self.rt, module, MAIN_NAMES, cfg, batch * splits, m, n, params)
        return splits, launches, finish_launch(self.rt, module, params, quads)
