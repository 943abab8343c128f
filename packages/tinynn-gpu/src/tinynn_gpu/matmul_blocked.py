"""The register-blocked matmul: WGSL generated from kernels/matmul_blocked.wgsl for one block configuration.

`BlockConfig` names a variant (block BM x BN x BK, TM x TN results per thread); `generate` fills the template
with fully unrolled code, one variable per vec4 accumulator (see the template's header for why).
`BlockedMatmul` compiles a variant per operand layout on first use and records its dispatches.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

XYZW = "xyzw"


@dataclass(frozen=True)
class BlockConfig:
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    group: int = 8
    splits: int = 1  # split-K: this many workgroups share each output block's K range

    @property
    def name(self) -> str:
        split = f" split{self.splits}" if self.splits > 1 else ""
        return f"{self.bm}x{self.bn}x{self.bk}/{self.tm}x{self.tn}{split}"

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def check(self, max_threads=256, max_workgroup_bytes=16384) -> None:
        if self.tm % 4 or self.tn % 4 or self.bm % self.tm or self.bn % self.tn or self.bk < 1:
            raise ValueError(f"matmul config {self.name}: TM, TN must be multiples of 4 dividing BM, BN")
        if not 1 <= self.threads <= max_threads:
            raise ValueError(f"matmul config {self.name}: {self.threads} threads, the device allows {max_threads}")
        if 4 * self.bk * (self.bm + self.bn) > max_workgroup_bytes:
            raise ValueError(f"matmul config {self.name}: tiles exceed {max_workgroup_bytes} bytes of workgroup memory")


def _load_lines(cfg: BlockConfig, operand: str, k_fastest: bool) -> list[str]:
    """Copy one operand's tile (BK x B{M,N}, as vec4 along m or n) into workgroup memory."""
    width4 = (cfg.bm if operand == "a" else cfg.bn) // 4
    total = cfg.bk * width4
    lines = []
    for i in range(-(-total // cfg.threads)):
        slot = f"lid + {i * cfg.threads}u"
        if k_fastest:  # k contiguous in memory: neighbouring threads take neighbouring k
            k, w4 = f"({slot}) % {cfg.bk}u", f"({slot}) / {cfg.bk}u"
        else:  # m (or n) contiguous: neighbouring threads take neighbouring 4-wide groups
            k, w4 = f"({slot}) / {width4}u", f"({slot}) % {width4}u"
        if operand == "a":
            values = ", ".join(f"load_a(a_base, row0 + 4u * w4 + {c}u, k0 + k, k_end)" for c in range(4))
        else:
            values = ", ".join(f"load_b(b_base, k0 + k, col0 + 4u * w4 + {c}u, k_end)" for c in range(4))
        body = (f"let k = {k}; let w4 = {w4}; "
                f"{operand}_tile[k * {width4}u + w4] = vec4<f32>({values});")
        guard = f"if ({slot} < {total}u) " if (i + 1) * cfg.threads > total else ""
        lines.append(f"        {guard}{{ {body} }}")
    return lines


def generate(cfg: BlockConfig, transpose_a: bool, transpose_b: bool) -> str:
    qm, qn = cfg.tm // 4, cfg.tn // 4
    declare = [f"    var acc_{i}_{q} = vec4<f32>(0.0);" for i in range(cfg.tm) for q in range(qn)]
    load = _load_lines(cfg, "a", k_fastest=not transpose_a) + _load_lines(cfg, "b", k_fastest=transpose_b)
    inner = []
    for kk in range(cfg.bk):
        inner += [f"        let a{kk}_{q} = a_tile[{kk * cfg.bm // 4}u + ty + {q}u * THREADS_M];" for q in range(qm)]
        inner += [f"        let b{kk}_{q} = b_tile[{kk * cfg.bn // 4}u + tx + {q}u * THREADS_N];" for q in range(qn)]
        inner += [f"        acc_{i}_{q} = acc_{i}_{q} + a{kk}_{i // 4}.{XYZW[i % 4]} * b{kk}_{q};"
                  for i in range(cfg.tm) for q in range(qn)]
    store = [f"    store(out_base, row0 + 4u * (ty + {i // 4}u * THREADS_M) + {i % 4}u, "
             f"col0 + 4u * (tx + {q}u * THREADS_N), acc_{i}_{q}, add_bias);" for i in range(cfg.tm) for q in range(qn)]
    fills = {
        "BM": cfg.bm, "BN": cfg.bn, "BK": cfg.bk, "THREADS_M": cfg.bm // cfg.tm, "THREADS_N": cfg.bn // cfg.tn,
        "THREADS": cfg.threads, "GROUP": cfg.group, "A_TILE_VEC4": cfg.bk * cfg.bm // 4,
        "B_TILE_VEC4": cfg.bk * cfg.bn // 4,
        "A_LAYOUT": "stored K x M (transposed)" if transpose_a else "stored M x K",
        "B_LAYOUT": "stored N x K (transposed)" if transpose_b else "stored K x N",
        "A_INDEX": "base + k * params.m + m" if transpose_a else "base + m * params.k + k",
        "B_INDEX": "base + n * params.k + k" if transpose_b else "base + k * params.n + n",
        "DECLARE": "\n".join(declare), "LOAD": "\n".join(load), "INNER": "\n".join(inner),
        "STORE": "\n".join(store),
    }
    text = (resources.files("tinynn_gpu") / "kernels" / "matmul_blocked.wgsl").read_text(encoding="utf-8")
    for key, value in fills.items():
        text = text.replace("{{" + key + "}}", str(value))
    return text


class BlockedMatmul:
    def __init__(self, runtime, config: BlockConfig):
        limits = runtime.ctx.limits
        config.check(limits.get("max-compute-invocations-per-workgroup", 256),
                     limits.get("max-compute-workgroup-storage-size", 16384))
        self.rt = runtime
        self.config = config
        self.modules = {}
        self.no_bias = runtime.empty((1,))  # bound when there is no bias (the kernel never reads it then)

    def describe(self) -> str:
        return f"blocked {self.config.name}"

    def record(self, a, b, out, batch, m, n, k, transpose_a, transpose_b, shared_b, bias=None) -> bool:
        """Record out = op(a) @ op(b) (+ bias); True: the bias was added."""
        layout = (bool(transpose_a), bool(transpose_b))
        cfg = self.config
        name = f"matmul {cfg.name} ta={int(layout[0])} tb={int(layout[1])}"
        if layout not in self.modules:
            self.modules[layout] = self.rt.shader(generate(cfg, *layout), name)
        splits = max(1, min(cfg.splits, -(-k // cfg.bk)))
        k_chunk = -(-k // (splits * cfg.bk)) * cfg.bk
        target = out if splits == 1 else self.rt.empty((batch * splits * m * n,))  # one slice per split
        groups = (-(-n // cfg.bn), -(-m // cfg.bm), batch * splits)
        self.rt.dispatch(self.modules[layout], "matmul_main", groups,
                         {0: a, 1: b, 2: target, 4: self.no_bias if bias is None else bias},
                         {"m": m, "n": n, "k": k, "shared_b": int(shared_b), "splits": splits, "k_chunk": k_chunk,
                          "has_bias": int(bias is not None)})
        if splits > 1:  # out[b] = sum of the splits' slices
            self.rt.dispatch("reduce", "reduce_main", -(-batch * m * n // 256), {0: target, 2: out},
                             (batch, splits, m * n, 0, splits, 1))
        return bias is not None
