"""Two independent matmuls in one dispatch: the template's matmul_pair_main (matmul_blocked.wgsl), which runs the
first problem's workgroups, then the second's, each with its own operands, layout, split count and epilogue, in
one block configuration. A linear layer's backward has such a pair (its input's gradient g @ W and its weight's,
g.T @ x): at the lesson and mid sizes each alone leaves the H200 partly idle, and the two side by side fill it
(`MatmulSelector.plan_pair` picks a pair where it measures one faster).
"""
from __future__ import annotations

from tinynn_gpu.matmul_blocked import BlockConfig, epilogue_parts, finish_launch, generate_pair, problem_plan
from tinynn_gpu.runtime import Launch, _trim, grid


class PairedMatmul:
    """Two independent matmuls in one dispatch (the template's matmul_pair_main): one block configuration, a
    split count each. Each problem is (batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue); the two
    epilogues may not use the same array (bias, residual, pre, row_sums), which the problems share. The problem
    with the longer K per split goes first, so that the blocks that take longest start first."""

    def __init__(self, runtime, config: BlockConfig, splits: tuple[int, int]):
        limits = runtime.ctx.limits
        config.check(limits.get("max-compute-invocations-per-workgroup", 256),
                     limits.get("max-compute-workgroup-storage-size", 16384))
        self.rt, self.config, self.splits = runtime, config, splits
        self.modules, self.plans = {}, {}
        self.description = f"paired {config.name} splits {splits[0]}+{splits[1]}"

    def describe(self) -> str:
        return self.description

    def plan(self, first: tuple, second: tuple):
        """record(a, b, out, epilogue, a2, b2, out2, epilogue2): both matmuls, each with its epilogue, and their
        split-K finishes."""
        epilogues = first[-1], second[-1]
        key = tuple((*problem[:-1], *epilogue_parts(problem[-1])) for problem in (first, second))
        plan = self.plans.get(key)
        if plan is None:
            for name in "bias", "residual", "pre", "row_sums":
                if all(getattr(e, name) is not None for e in epilogues):
                    raise ValueError(f"paired matmuls share their epilogues' arrays: only one may use {name}")
            plan = self.plans[key] = self._plan(first[:-1], second[:-1], epilogues)
            _trim(self.plans)
        swap, launch, finishes, parts = plan
        rt = self.rt
        stand_ins = rt.stand_in(0), rt.stand_in(1), rt.stand_in(2)

        def record(a, b, out, epilogue, a2, b2, out2, epilogue2):
            problems = ((a2, b2, out2, epilogue2), (a, b, out, epilogue)) if swap else \
                ((a, b, out, epilogue), (a2, b2, out2, epilogue2))
            targets, row_targets = [], []
            for (_, _, result, ends), (size, row_size) in zip(problems, parts):
                targets.append(result if size is None else rt.empty((size,)))  # split-K: a slice per split
                row_targets.append(ends.row_sums if size is None or ends.row_sums is None else rt.empty((row_size,)))
            shared = [stand_ins[0], stand_ins[0], stand_ins[1], stand_ins[2]]  # bias, residual, pre, row sums
            for (_, _, _, ends), row_target in zip(problems, row_targets):
                for j, array in enumerate((ends.bias, ends.residual, ends.pre, row_target)):
                    if array is not None:
                        shared[j] = array
            (first_a, first_b, _, _), (second_a, second_b, _, _) = problems
            rt.launch(launch, (first_a, first_b, targets[0], *shared, second_a, second_b, targets[1]))
            for (_, _, result, ends), finish, target, row_target in zip(problems, finishes, targets, row_targets):
                if finish is not None:
                    rt.launch(finish, (result, stand_ins[0] if ends.bias is None else ends.bias,
                                       stand_ins[0] if ends.residual is None else ends.residual,
                                       stand_ins[1] if ends.pre is None else ends.pre,
                                       stand_ins[2] if ends.row_sums is None else ends.row_sums,
                                       target, stand_ins[0] if row_target is None else row_target))
        return record

    def _plan(self, first, second, epilogues):
        cfg = self.config
        problems = [problem_plan(cfg, splits, *shape, epilogue)
                    for splits, shape, epilogue in zip(self.splits, (first, second), epilogues)]
        swap = problems[1][2]["k_chunk"] > problems[0][2]["k_chunk"]
        if swap:
            problems.reverse()
        layouts = (problems[0][1], problems[1][1])
        module = self.modules.get(layouts)
        if module is None:
            name = f"matmul pair {cfg.name} " + " + ".join(
                f"ta={int(ta)} tb={int(tb)}{' vec4 loads' * vec4}{' aligned' * aligned}" for ta, tb, vec4, aligned in layouts)
            module = self.modules[layouts] = self.rt.shader(generate_pair(cfg, *layouts), name)
        (_, _, params), (_, _, params2) = problems
        workgroups = sum(-(-p["n"] // cfg.bn) * -(-p["m"] // cfg.bm) * p["batch"] * p["splits"] for p in (params, params2))
        launch = self.rt.prepare(module, "matmul_pair_main", grid(workgroups), (0, 1, 2, 4, 5, 6, 7, 10, 11, 12), params)
        launch = Launch(launch.shader, launch.entry, launch.pipeline, (*launch.slots, 13),
                        (*launch.uniforms, self.rt.uniform(module.params.pack(params2))), launch.groups)
        finishes = [finish_launch(self.rt, module, p) for p in (params, params2)]
        parts = [(None, None) if p["splits"] == 1 else (p["batch"] * p["splits"] * p["m"] * p["n"],
                                                        p["batch"] * p["splits"] * p["m"]) for p in (params, params2)]
        return swap, launch, finishes, parts
