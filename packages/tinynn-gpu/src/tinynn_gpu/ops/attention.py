"""Fused causal self-attention on the GPU: the launches of its forward (one dispatch) and backward (two), from
templates filled in and unrolled per head size.

The forward is attention_tiled.py's (attention_tiled.wgsl, a register-blocked matmul-like kernel), with the
first tile of TILES whose workgroup memory fits the device; where none fits, attention.wgsl's per-row forward
runs. TINYNN_ATTENTION_TILE=ROWSxKEYSxSN forces a tile, =0 the per-row forward. In matmul precision "high" on a
device with tensor cores, attention_tensor.py's forward and attention_tensor_backward.py's backward may run
instead, where a tile of theirs fits, once they have answered a test case of the head size right on this device
(attention_tensor_check.py; else the float32 kernels run, with one notice, and `tinynn info` says why): per shape,
where they were timed faster than the float32 kernels (attention_choice.py; untimed, float32 runs).

The backward is attention_backward_tiled.py's (dK, dV and dQ's per-key-block slices, then dQ as the slices' sum)
with the first tile of BACKWARD_TILES that fits the head size and the device; where none does (head sizes 16 and
20, too little workgroup memory, or dQ slices past a storage binding: they grow as T^2), attention.wgsl's per-row
kernels (dQ, then dK/dV). TINYNN_ATTENTION_BACKWARD_TILE=KEYSxQUERIESxSN forces a tile, =0 the per-row kernels.
The tiled backward was faster at every sequence length measured, so none keeps the per-row kernels.

The per-row kernels: a layout is (ROWS, SPLITS, LANES): a workgroup owns ROWS rows (queries; keys in the
dK/dV kernel), LANES threads share a row (subgroup shuffles add their parts of a dot product; 1 without the
`subgroup` feature) and SPLITS groups of threads walk over the other side interleaved. `choose_layout` takes
ROWS and SPLITS from LAYOUTS, the first whose workgroup memory fits the device; TINYNN_ATTENTION_LAYOUT=
ROWSxSPLITS forces one (experiments/attention_tiles.py times them all, and every tile).
"""
from __future__ import annotations

import warnings

from tinynn.errors import TinynnError, TinynnNotice
from tinynn_gpu.ops.attention_backward_tiled import BACKWARD_TILE, backward_tiled_source, choose_backward_tile
from tinynn_gpu.ops.attention_choice import TENSOR, AttentionChoice
from tinynn_gpu.ops.attention_tensor import TensorAttention
from tinynn_gpu.ops.attention_tensor_check import check
from tinynn_gpu.ops.attention_tensor_backward import TensorBackward
from tinynn_gpu.ops.attention_tiled import FORWARD_TILE, THREADS, choose_tile, tiled_source
from tinynn_gpu.runtime import settings
from tinynn_gpu.runtime.arrays import OnCpu, bindable
from tinynn_gpu.runtime.kernels import MAX_GROUPS
from tinynn_gpu.runtime.wgsl import kernel_file, kernel_source, unroll

# fastest first (experiments/attention_tiles.py; BENCHMARKS.md, "Kernel tuning notes")
LAYOUTS = ((8, 4), (8, 2), (8, 1))
SUBGROUP_LANES = 4  # WebGPU's smallest subgroup


def unsupported(qkv_shape: tuple, n_head: int) -> str:
    """Why the kernels cannot run attention on a qkv of this shape (B, T, 3C), or "" when they can."""
    head_size = qkv_shape[-1] // 3 // n_head
    if head_size % 4:
        return f"head size {head_size} is not a multiple of 4 (the kernels load vec4s)"
    if head_size > 128:
        return f"head size {head_size} exceeds 128 (the per-thread accumulators would spill)"
    heads = qkv_shape[0] * n_head
    if heads > MAX_GROUPS:  # every grid has a dimension of one row of workgroups per head
        return f"{heads} heads (batch x n_head) exceed a dispatch dimension's {MAX_GROUPS}"
    return ""


def lanes_for(head_size: int, subgroups: bool) -> int:
    """Threads per row: the most, up to SUBGROUP_LANES, that split the row's vec4s evenly."""
    hs4 = head_size // 4
    return max(n for n in (1, 2, SUBGROUP_LANES) if hs4 % n == 0) if subgroups else 1


def workgroup_bytes(head_size: int, rows: int, splits: int) -> int:
    """The splits' padded accumulators and the forward's per-split maxima and sums."""
    return 16 * splits * rows * (head_size // 4 + 1) + 8 * splits * rows


def choose_layout(head_size: int, max_bytes: int) -> tuple[int, int]:
    forced = settings.current().attention_layout
    if forced:
        rows, splits = (int(n) for n in forced.split("x"))  # its form checked by settings.py
        if workgroup_bytes(head_size, rows, splits) > max_bytes:
            raise TinynnError(f"TINYNN_ATTENTION_LAYOUT={forced}: head size {head_size} needs more than the "
                              f"adapter's {max_bytes} bytes of workgroup memory")
        return rows, splits
    for rows, splits in LAYOUTS:
        if workgroup_bytes(head_size, rows, splits) <= max_bytes:
            return rows, splits
    raise TinynnError(f"attention: no layout fits head size {head_size} in {max_bytes} bytes of workgroup memory")


def lane_sum_body(lanes: int) -> str:
    """lane_sum's WGSL: a butterfly over the row's lanes, so that every lane gets the same bits."""
    lines = ["    var s = x;"]
    offset = 1
    while offset < lanes:
        lines.append(f"    s = s + subgroupShuffleXor(s, {offset}u);")
        offset *= 2
    return "\n".join(lines + ["    return s;"])


def source(head_size: int, rows: int, splits: int, lanes: int) -> str:
    if rows * splits * lanes > THREADS:
        raise TinynnError(f"attention layout {rows}x{splits} with {lanes} lanes exceeds {THREADS} threads")
    hs4 = head_size // 4
    text = kernel_source("attention", {"HEAD": kernel_file("attention_head"), "HS4": hs4, "ROWS": rows,
                                       "SPLITS": splits, "LANES": lanes, "LANE_SUM": lane_sum_body(lanes)})
    return unroll(text, {"$n": hs4 // lanes})


class Attention:
    """Compiles a kernel module per (head size, layout) on first use and records the dispatches."""

    def __init__(self, runtime, selector):
        self.rt = runtime
        self.max_bytes = runtime.ctx.limits.get("max-compute-workgroup-storage-size", 16384)
        self.shaders = {}  # (head size, rows, splits, lanes) -> Shader
        self.tiled_shaders = {}  # (variable, head size, its setting) -> `_tiled_shader`'s answer
        self.tensor = TensorAttention(runtime)
        self.tensor_backward = TensorBackward(runtime)
        self.checked = {}  # head size -> why the tensor-core kernels must not run it ("": they may), at first use
        self.choice = AttentionChoice(selector)  # per shape, whether they run (where usable): timed by the selector

    def tensor_cores(self, head_size: int) -> bool:
        """Whether the tensor-core kernels answered the head size's test case right here (run when "high" first
        asks for it on a device with tensor cores) and no other's wrong: a driver that got one wrong is trusted
        with none. The first wrong answer's notice says why."""
        if self.refused():
            return False
        if head_size not in self.checked:
            why = self.checked[head_size] = check(self.tensor, self.tensor_backward, head_size)
            if why:
                warnings.warn(f"attention in matmul precision 'high' runs in float32: {why}", TinynnNotice)
        return not self.checked[head_size]

    def refused(self) -> str:
        """Why no head size runs on the tensor-core kernels here (one answered its test case wrong), or ""."""
        return next((why for why in self.checked.values() if why), "")

    def describe(self) -> str:
        """What "high" attention runs on, for `tinynn info`."""
        if not self.checked:
            return "float32; in matmul precision 'high', f16 tensor cores where they pass a check at first use " \
                   "and are timed faster, per shape"
        why = self.refused()
        return f"float32 in every precision: {why}" if why else self.choice.describe()

    def _shader(self, head_size: int):
        rows, splits = choose_layout(head_size, self.max_bytes)
        key = (head_size, rows, splits, lanes_for(head_size, self.rt.subgroups))
        if key not in self.shaders:
            self.shaders[key] = self.rt.shader(source(*key), f"attention hs{head_size} {rows}x{splits}x{key[3]}")
        return self.shaders[key], rows

    def _tiled_shader(self, head_size: int, backward: bool = False):
        """(Shader, tile) of the tiled forward or backward, (None, None) where no tile runs: chosen once per
        head size and setting of the variable that forces a tile (every eager call asks)."""
        now = settings.current()
        variable, forced = (BACKWARD_TILE, now.attention_backward_tile) if backward else \
            (FORWARD_TILE, now.attention_tile)
        key = (variable, head_size, forced)
        found = self.tiled_shaders.get(key)
        if found is None:
            choose, source = (choose_backward_tile, backward_tiled_source) if backward else (choose_tile, tiled_source)
            tile = choose(head_size, self.max_bytes)
            label = f"attention {'backward' if backward else 'tiled'} hs{head_size} {tile}"
            found = self.tiled_shaders[key] = (None, None) if tile is None else \
                (self.rt.shader(source(head_size, tile), label), tile)
        return found

    def forward(self, qkv, y, lse, n_head: int, scale: float, high: bool = False) -> None:
        """high: the matmul precision is "high" and the tensor-core kernels passed their check here; they run
        where a tile of theirs takes the head size and this shape's choice is theirs (attention_choice.py)."""
        args = (qkv, y, lse, n_head, scale)
        if high and self.tensor.tile(qkv.shape[2] // 3 // n_head) is not None and \
                self.choice("forward", qkv.shape, n_head, args, self.tensor.forward, self._forward_float32) == TENSOR:
            return self.tensor.forward(*args)
        self._forward_float32(*args)

    def _forward_float32(self, qkv, y, lse, n_head: int, scale: float) -> None:
        batch, seq, c3 = qkv.shape
        shader, tile = self._tiled_shader(c3 // 3 // n_head)
        shader, rows = self._shader(c3 // 3 // n_head) if shader is None else (shader, tile.rows)
        rt, key = self.rt, ("attention_forward", shader, batch, seq, n_head, scale)
        launch = rt.launches.get(key) or rt.keep(key, rt.prepare(
            shader, "attention_forward_main", (batch * n_head, -(-seq // rows), 1), ("qkv", "out", "lse"),
            {"seq": seq, "n_head": n_head, "scale": scale}))
        rt.launch(launch, (qkv, y, lse))

    def _backward_plan(self, qkv_shape: tuple, n_head: int):
        """(Shader, tile) of the tiled backward for this shape, (None, None) for the per-row kernels: also where
        the tile's dQ slices, which grow as T^2 / KEYS, would not fit one storage binding (the per-row
        kernels' delta grows as T; the slices, refused, would send the whole backward to NumPy)."""
        batch, seq, c3 = qkv_shape
        head_size = c3 // 3 // n_head
        shader, tile = self._tiled_shader(head_size, backward=True)
        if tile is not None and 4 * tile.part_floats(batch, seq, n_head, head_size) > self.rt.max_binding:
            return None, None
        return shader, tile

    def backward(self, g, qkv, y, lse, g_qkv, n_head: int, scale: float, high: bool = False) -> None:
        """g_qkv from g, through a scratch array allocated before any dispatch (too large: TooLarge, and nothing
        recorded). Tiled: dK, dV and dQ's slices, then dQ. Per row: the dQ kernel saves delta = rowsum(g * y) in
        the scratch for the dK/dV kernel. high: as `forward`'s (attention_tensor_backward.py)."""
        args = (g, qkv, y, lse, g_qkv, n_head, scale)
        if high and self.tensor_backward.tile(qkv.shape, n_head) is not None and self.choice(
                "backward", qkv.shape, n_head, args, self.tensor_backward.backward, self._backward_float32) == TENSOR:
            return self.tensor_backward.backward(*args)
        self._backward_float32(*args)

    def _backward_float32(self, g, qkv, y, lse, g_qkv, n_head: int, scale: float) -> None:
        batch, seq, c3 = qkv.shape
        head_size = c3 // 3 // n_head
        params = {"seq": seq, "n_head": n_head, "scale": scale}
        shader, tile = self._backward_plan(qkv.shape, n_head)
        scratch = self.rt.empty((batch, n_head, seq) if tile is None else
                                (tile.part_floats(batch, seq, n_head, head_size),))
        if shader is not None:
            self.rt.dispatch(shader, "attention_backward_kv_main", (batch * n_head, -(-seq // tile.keys), 1),
                             {"qkv": qkv, "g": g, "lse": lse, "y": y, "part": scratch, "out": g_qkv}, params)
            self.rt.dispatch(shader, "attention_backward_q_main", (-(-seq * head_size // 4 // 256), batch * n_head, 1),
                             {"part": scratch, "out": g_qkv}, params)
            return
        shader, rows = self._shader(head_size)
        grid = (-(-seq // rows), batch * n_head, 1)
        bindings = {"qkv": qkv, "g": g, "lse": lse, "delta": scratch, "out": g_qkv}
        self.rt.dispatch(shader, "attention_backward_q_main", grid, {**bindings, "y": y}, params)
        self.rt.dispatch(shader, "attention_backward_kv_main", grid, bindings, params)


def attention_forward(self, qkv, n_head, scale, for_backward=True):
    """A method of the backend (backend.py's table), as is attention_backward."""
    why = unsupported(qkv.shape, n_head)
    if why:
        raise OnCpu(why)
    batch, seq, c3 = qkv.shape
    operand = bindable(qkv)
    y = self._empty((batch, seq, c3 // 3))
    lse = self._empty((batch, n_head, seq)) if for_backward else self.rt.scratch(0, batch * n_head * seq)
    high = self.mm.high() and self.attention.tensor_cores(c3 // 3 // n_head)
    self.attention.forward(operand, y, lse, n_head, scale, high=high)
    return y, (lse if for_backward else None)


def attention_backward(self, g, qkv, y, lse, n_head, scale):
    why = unsupported(qkv.shape, n_head)
    if why:
        raise OnCpu(why)
    g_qkv = self._empty(qkv.shape)
    self.attention.backward(bindable(g), bindable(qkv), bindable(y), bindable(lse), g_qkv, n_head, scale,
                            high=self.mm.high() and self.attention.tensor_cores(qkv.shape[2] // 3 // n_head))
    return g_qkv
