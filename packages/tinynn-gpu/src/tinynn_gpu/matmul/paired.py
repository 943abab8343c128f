"""Two independent matmuls in one dispatch: the template's matmul_pair_main (blocked.wgsl), which runs the
first problem's workgroups, then the second's, each with its own operands, layout, split count and epilogue, in
one block configuration. A linear layer's backward has such a pair (its input's gradient g @ W and its weight's,
g.T @ x): at small sizes each alone leaves a large GPU partly idle, and the two side by side fill it
(`MatmulSelector.plan_pair` picks a pair where it measures one faster). Where both problems are split, their
split-K finishes are one dispatch too (matmul_pair_finish_main): fewer dispatches a step.
"""
from __future__ import annotations

from tinynn_gpu.matmul.blocked import generate_pair, stores_quads
from tinynn_gpu.matmul.epilogue import (FINISH_NAMES, MAIN_NAMES, epilogue_slots, finish_arrays, finish_launch,
                                        split_targets)
from tinynn_gpu.matmul.configs import BlockConfig
from tinynn_gpu.matmul.problem import Epilogue, epilogue_parts, problem_plan
from tinynn_gpu.runtime.kernels import grid, trim


class PairedMatmul:
    """Two independent matmuls in one dispatch (the template's matmul_pair_main): one block configuration, a
    split count each. Each problem is (batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue); the two
    epilogues may not use the same array (bias, residual, pre, row_sums), which the problems share. The problem
    with the longer K per split goes first, so that the blocks that take longest start first."""

    def __init__(self, runtime, config: BlockConfig, splits: tuple[int, int]):
        config.check_device(runtime.ctx.limits)
        self.rt, self.config, self.splits = runtime, config, splits
        self.modules, self.plans = {}, {}
        self.description = f"paired {config.name} splits {splits[0]}+{splits[1]}"

    def describe(self) -> str:
        return self.description

    def plan(self, first: tuple, second: tuple):
        """record(a, b, out, epilogue, a2, b2, out2, epilogue2): both matmuls, each with its epilogue, and their
        split-K finishes (one dispatch where both are split)."""
        epilogues = first[-1], second[-1]
        key = tuple((*problem[:-1], *epilogue_parts(problem[-1])) for problem in (first, second))
        plan = self.plans.get(key)
        if plan is None:
            for name in "bias", "residual", "pre", "row_sums":
                if all(getattr(e, name) is not None for e in epilogues):
                    raise ValueError(f"paired matmuls share their epilogues' arrays: only one may use {name}")
            plan = self.plans[key] = self._plan(first[:-1], second[:-1], epilogues)
            trim(self.plans)
        swap, launch, finishes, both_finish, parts = plan
        rt = self.rt
        stand_ins = rt.stand_in(0), rt.stand_in(1), rt.stand_in(2)

        def record(a, b, out, epilogue, a2, b2, out2, epilogue2):
            problems = ((a2, b2, out2, epilogue2), (a, b, out, epilogue)) if swap else \
                ((a, b, out, epilogue), (a2, b2, out2, epilogue2))
            targets = [split_targets(rt, sizes, result, ends.row_sums)
                       for (_, _, result, ends), sizes in zip(problems, parts)]
            (a, b, out, first), (a2, b2, out2, second) = problems
            # each epilogue array is one problem's (plan checked that), or absent from both
            bias = first.bias if second.bias is None else second.bias
            residual = first.residual if second.residual is None else second.residual
            pre = first.pre if second.pre is None else second.pre
            (target, row_target), (target2, row_target2) = targets
            split_rows = row_target if row_target2 is None else row_target2
            shared = epilogue_slots(bias, residual, pre, split_rows, stand_ins)
            rt.launch(launch, (a, b, target, *shared, a2, b2, target2))
            if both_finish is not None:  # both split: finish_arrays', then the second problem's out, parts, row parts
                row_sums = first.row_sums if second.row_sums is None else second.row_sums
                both = Epilogue(bias=bias, residual=residual, pre=pre, row_sums=row_sums)
                rt.launch(both_finish, (*finish_arrays(out, both, target, row_target, stand_ins), out2, target2,
                                        stand_ins[0] if row_target2 is None else row_target2))
            for (_, _, result, ends), finish, (slices, row_slices) in zip(problems, finishes, targets):
                if finish is not None:
                    rt.launch(finish, finish_arrays(result, ends, slices, row_slices, stand_ins))
        return record

    def _plan(self, first, second, epilogues):
        cfg = self.config
        problems = [problem_plan(cfg, splits, *shape, epilogue)
                    for splits, shape, epilogue in zip(self.splits, (first, second), epilogues)]
        swap = problems[1][2]["k_chunk"] > problems[0][2]["k_chunk"]
        if swap:
            problems.reverse()
        layouts = (problems[0][1], problems[1][1])
        (_, _, params), (_, _, params2) = problems
        quads = stores_quads(params["n"], params2["n"])
        module = self.modules.get((layouts, quads))
        if module is None:
            name = f"matmul pair {cfg.name} " + " + ".join(
                f"ta={int(ta)} tb={int(tb)}{' vec4 loads' * vec4}{' aligned' * aligned}"
                for ta, tb, vec4, aligned in layouts) + " quads" * quads
            module = self.modules[layouts, quads] = self.rt.shader(generate_pair(cfg, *layouts, quads), name)
        workgroups = sum(-(-p["n"] // cfg.bn) * -(-p["m"] // cfg.bm) * p["batch"] * p["splits"]
                         for p in (params, params2))
        launch = self.rt.prepare(module, "matmul_pair_main", grid(workgroups), (*MAIN_NAMES, "a2", "b2", "out2"),
                                 params, more_params=(("params2", params2),))
        both_finish = None
        if params["splits"] > 1 and params2["splits"] > 1:
            # one finish for both: a thread a Value, each problem's threads in whole workgroups
            values = [p["batch"] * p["m"] * p["n"] // (4 if quads else 1) for p in (params, params2)]
            both_finish = self.rt.prepare(module, "matmul_pair_finish_main", grid(sum(-(-v // 256) for v in values)),
                                          (*FINISH_NAMES, "out2", "parts2", "row_parts2"), params,
                                          more_params=(("params2", params2),))
        finishes = [None, None] if both_finish else [finish_launch(self.rt, module, p, quads)
                                                     for p in (params, params2)]
        parts = [None if p["splits"] == 1 else (p["batch"] * p["splits"] * p["m"] * p["n"],
                                                p["batch"] * p["splits"] * p["m"]) for p in (params, params2)]
        return swap, launch, finishes, both_finish, parts
