"""What the generated matmul kernels share (epilogue.wgsl): the epilogue applied as results are stored, the
split-K finish, one problem's bindings and loads, and the Python that fills them in and binds their arrays. The
register-blocked kernel (blocked.py, paired.py) and the tensor-core kernel (tensor.py) both write them into
their modules."""
from __future__ import annotations

from tinynn_gpu.matmul.problem import Epilogue, epilogue_parts, problem_plan
from tinynn_gpu.runtime.kernels import MAX_GROUPS, grid, trim
from tinynn_gpu.runtime.wgsl import kernel_file

XYZW = "xyzw"
EPILOGUE_NAMES = ("bias", "residual", "pre", "row_sums")  # the bindings the template names, shared by a pair
MAIN_NAMES = ("a", "b", "out", *EPILOGUE_NAMES)
FINISH_NAMES = ("out", *EPILOGUE_NAMES, "parts", "row_parts")


def parts() -> tuple[str, str]:
    """epilogue.wgsl's two parts: what a module holds once, and one problem's declarations."""
    module, problem = kernel_file("epilogue").split("//:: problem\n")
    return module, problem


def module_fills(quads: bool) -> dict:
    """The module part's fills: results stored (and the epilogue's arrays read) 4 columns at a time, or 1."""
    return {
        "VALUE": "vec4<f32>" if quads else "f32", "WIDTH": 4 if quads else 1,
        "GELU_VALUE": "Value(" + ", ".join(f"gelu(x.{x})" for x in XYZW) + ")" if quads else "gelu(x)",
        "GELU_GRAD_VALUE": "Value(" + ", ".join(f"gelu_grad(x.{x}, g.{x})" for x in XYZW) + ")" if quads
        else "gelu_grad(x, g)",
    }


def problem_fills(transpose_a: bool, transpose_b: bool, vec4: bool, aligned: bool, p: str, binding: int,
                  quads: bool, loads: str) -> dict:
    """The problem part's fills for one problem: names suffixed by p, its own bindings from `binding` on (a, b,
    out, params: 0-3 for the first problem, 10-13 for a pair's second; its split-K slices and row sums: 8-9,
    14-15); vec4: its loads read quads; aligned: without bounds checks; `loads` describes them."""
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
        "LOADS": loads,
        "ALIGNED": ", aligned (no load checks)" if aligned else "",
        "A_GUARD": "" if aligned else f"    if (m >= params{p}.m || k >= k_end) {{ return {zero}; }}",
        "B_GUARD": "" if aligned else f"    if (k >= k_end || n >= params{p}.n) {{ return {zero}; }}",
        "A_INDEX": f"base + k * params{p}.m + m" if transpose_a else f"base + m * params{p}.k + k",
        "B_INDEX": f"base + n * params{p}.k + k" if transpose_b else f"base + k * params{p}.n + n",
        "STORE_VALUES": "\n".join(store_values),
    }


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


def main_launches(rt, module, names: tuple, cfg, zs: int, m: int, n: int, params: dict) -> list:
    """matmul_main's Launches over the grid of cfg's blocks (x along n, y along m, z = batch x splits): several
    where the grid passes the per-dimension limit, each told where it starts (y_offset, z_offset)."""
    blocks_n, blocks_m = -(-n // cfg.bn), -(-m // cfg.bm)
    return [rt.prepare(module, "matmul_main", (blocks_n, min(MAX_GROUPS, blocks_m - y0), min(MAX_GROUPS, zs - z0)),
                       names, {**params, "y_offset": y0, "z_offset": z0})
            for z0 in range(0, zs, MAX_GROUPS) for y0 in range(0, blocks_m, MAX_GROUPS)]


def finish_launch(rt, module, params: dict, quads: bool):
    """The split-K finish's Launch for a problem's params (None without splits): it adds the splits' slices into the
    output and its row sums, a thread per Value (4 floats where the module stores quads)."""
    if params["splits"] == 1:
        return None
    values = params["batch"] * params["m"] * params["n"] // (4 if quads else 1)
    return rt.prepare(module, "matmul_finish_main", grid(-(-values // 256)), FINISH_NAMES, params)


class GeneratedMatmul:
    """A variant of a generated kernel (blocked.py's, tensor.py's): its modules per layout, and per shape and
    epilogue parts the dispatches made ready once (`_plan`, given `problem_plan`'s splits, layout and parameters)
    and the function that records them (`_recorder`)."""
    prefix = ""  # of the description: the kind of kernel, where the configuration's name does not say it

    def __init__(self, runtime, config):
        config.check_device(runtime.ctx.limits)
        self.rt = runtime
        self.config = config
        self.modules = {}
        self.description = self.prefix + config.name  # made once: the selector asks for it every matmul
        self.plans = {}  # (layout, shape, epilogue parts) -> what `_plan` made ready

    def describe(self) -> str:
        return self.description

    def module(self, layout: tuple, name: str, source):
        """The shader module for a layout of the kernel, made from source() the first time (compiles are slow)."""
        module = self.modules.get(layout)
        if module is None:
            module = self.modules[layout] = self.rt.shader(source(), f"matmul {self.config.name} {name}")
        return module

    def record(self, a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()) -> bool:
        """Record out = epilogue(op(a) @ op(b)); True: the epilogue was applied (always, for these kernels)."""
        return self.plan(batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue)(a, b, out, epilogue)

    def plan(self, batch, m, n, k, transpose_a, transpose_b, shared_b, epilogue=Epilogue()):
        """record(a, b, out, epilogue) for this shape and the epilogue's parts (see `MatmulSelector.plan`)."""
        key = (transpose_a, transpose_b, batch, m, n, k, shared_b, *epilogue_parts(epilogue))
        plan = self.plans.get(key)
        if plan is None:
            shape = (batch, m, n, k, transpose_a, transpose_b, shared_b)
            problem = problem_plan(self.config, self.config.splits, *shape, epilogue)
            plan = self.plans[key] = self._plan(problem, *shape, epilogue)
            trim(self.plans)
        return self._recorder(plan, batch, m, n, shared_b)
