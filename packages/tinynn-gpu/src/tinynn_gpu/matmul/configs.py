"""Matmul configurations: `BlockConfig`, the blocking of the register-blocked kernel (blocked.py), `TensorConfig`,
the tensor-core kernel's (tensor.py), and the candidates the selector chooses among (selection.py): the lesson's
tiles, BLOCK_CONFIGS and, in matmul precision "high", TENSOR_CONFIGS."""
from __future__ import annotations

import re
from dataclasses import dataclass


class Blocking:
    """What both kernels' configurations share: blocks of bm x bn outputs, k in steps of bk (their fields)."""

    def aligned(self, m, n, k, splits, k_chunk) -> bool:
        """Every tile of the shape lies whole inside the operands and every split has work: the loads need no
        bounds checks (the stores keep theirs)."""
        return m % self.bm == 0 and n % self.bn == 0 and k % self.bk == 0 and (splits - 1) * k_chunk < k


@dataclass(frozen=True)
class BlockConfig(Blocking):
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    group: int = 8
    splits: int = 1  # split-K: this many workgroups share each output block's K range
    vec4: bool = False  # global loads of 4 floats at once where the shape allows (`uses_vec4`)
    double: bool = False  # two tiles in workgroup memory: the next one's loads overlap this one's products
    # ahead = 2 (double-buffered): the global loads run two tiles ahead, into a second set of registers, so that
    # a load has two steps of products to arrive in instead of one;
    ahead: int = 1
    # spread: vec4 loads of an operand stored with k contiguous give each thread one quad of k, written into 4
    # tile rows, instead of a 4 x 4 block transposed (which leaves three quarters of the threads without loads);
    # no shipped candidate uses it (experiments/matmul_designs.py measures it).
    spread: bool = False
    # each tile row padded by a vec4, against bank conflicts where a warp stores neighbouring k of a row (scalar
    # loads of an operand stored with k contiguous); vec4-load stashes write 512 bytes a warp, 4 wavefronts
    # either way. Unpadded, 128x128x16 double-buffered tiles take 32 KB, which every Vulkan adapter offers.
    pad: bool = True

    @property
    def name(self) -> str:
        split = f" split{self.splits}" if self.splits > 1 else ""
        return (f"{self.bm}x{self.bn}x{self.bk}/{self.tm}x{self.tn}{split}{' vec4' * self.vec4}{' db' * self.double}"
                f"{' unpadded' * (not self.pad)}{f' ahead{self.ahead}' * (self.ahead > 1)}{' spread' * self.spread}")

    @property
    def buffers(self) -> int:
        return 2 if self.double else 1

    @property
    def workgroup_bytes(self) -> int:
        """The A and B tiles (rows of BM/4 and BN/4 vec4s, padded or not)."""
        return 16 * self.buffers * self.bk * (self.bm // 4 + self.bn // 4 + 2 * self.pad)

    def uses_vec4(self, m, n, k, transpose_a, transpose_b) -> bool:
        """vec4 loads need each operand's contiguous dimension to be a multiple of 4 (so every quad is
        aligned and whole); other shapes run the scalar-load code of the same configuration."""
        return self.vec4 and (m if transpose_a else k) % 4 == 0 and (k if transpose_b else n) % 4 == 0

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def check_device(self, limits: dict) -> None:
        """`check` against a device's limits (its adapter's dict, WebGPU's defaults where one is missing)."""
        self.check(limits.get("max-compute-invocations-per-workgroup", 256),
                   limits.get("max-compute-workgroup-storage-size", 16384))

    def check(self, max_threads=256, max_workgroup_bytes=16384) -> None:
        if self.tm % 4 or self.tn % 4 or self.bm % self.tm or self.bn % self.tn or self.bk < 1 or \
                (self.vec4 and self.bk % 4):
            raise ValueError(f"matmul config {self.name}: TM, TN must be multiples of 4 dividing BM, BN")
        if self.spread and (self.bk % 8 or self.bm % 16 or self.bn % 16):  # a warp's 2 quads of k by 16 rows
            raise ValueError(f"matmul config {self.name}: spread loads need BK a multiple of 8, BM and BN of 16")
        if self.ahead not in (1, 2) or (self.ahead > 1 and not self.double):
            raise ValueError(f"matmul config {self.name}: loads run 1 or 2 tiles ahead, 2 only double-buffered")
        if not 1 <= self.threads <= max_threads:
            raise ValueError(f"matmul config {self.name}: {self.threads} threads, the device allows {max_threads}")
        if self.workgroup_bytes > max_workgroup_bytes:
            raise ValueError(f"matmul config {self.name}: tiles exceed {max_workgroup_bytes} bytes of workgroup memory")



LESSON_TILES = (8, 16, 32)
# The candidates the autotune times: each won some training shape of the benchmark models, or 4096^2 (small blocks
# and split-K where M = 2048 meets a small N or K, big blocks for big outputs); BENCHMARKS.md's "Kernel tuning
# notes" say which, by how much, and where each was measured.
BLOCK_CONFIGS = (
    BlockConfig(32, 64, 16, 4, 4),
    BlockConfig(64, 64, 16, 4, 4),
    BlockConfig(64, 64, 16, 4, 4, double=True),
    BlockConfig(64, 64, 16, 8, 4),
    BlockConfig(128, 64, 16, 8, 4),
    BlockConfig(128, 128, 16, 8, 8),
    BlockConfig(128, 128, 16, 8, 8, vec4=True),
    BlockConfig(64, 64, 16, 8, 4, splits=4),
    BlockConfig(128, 64, 16, 8, 8, splits=2),
    BlockConfig(64, 32, 16, 4, 4, splits=4),
    BlockConfig(128, 128, 16, 8, 8, splits=4, vec4=True),
    BlockConfig(64, 64, 16, 4, 4, splits=8, vec4=True),
    BlockConfig(64, 64, 16, 4, 4, splits=4, vec4=True, double=True),
    BlockConfig(32, 64, 16, 4, 4, splits=8, vec4=True, double=True),
    BlockConfig(64, 64, 32, 4, 4),
    BlockConfig(128, 64, 32, 8, 4, splits=2),
    BlockConfig(64, 64, 32, 8, 4, splits=4, vec4=True),
    BlockConfig(32, 64, 32, 4, 4, splits=4, vec4=True, double=True),
    # unpadded, so that double-buffered 128x128 tiles fit 32 KB of workgroup memory
    BlockConfig(128, 128, 16, 8, 8, vec4=True, double=True, pad=False),
    BlockConfig(128, 128, 16, 8, 8, splits=2, vec4=True, double=True, pad=False),
    BlockConfig(128, 128, 16, 8, 8, splits=4, vec4=True, double=True, pad=False),
    BlockConfig(64, 64, 16, 8, 4, vec4=True, double=True),
    # global loads two tiles ahead: a long K split over few output blocks
    BlockConfig(64, 64, 16, 8, 4, splits=4, vec4=True, double=True, ahead=2),
    # blocks 96 wide, so that sides of 384, 1152 and 1536 give workgroup counts in whole waves of a 132-SM GPU
    BlockConfig(128, 96, 16, 8, 8, vec4=True),
    BlockConfig(64, 96, 16, 8, 4),
    BlockConfig(64, 96, 16, 8, 4, splits=2, vec4=True, double=True),
    BlockConfig(64, 96, 16, 8, 4, vec4=True, double=True),
    # split 3: a square weight gradient's workgroups in about one wave
    BlockConfig(128, 128, 16, 8, 8, splits=3, vec4=True, double=True, pad=False),
    # split 6: a small weight gradient's workgroups in one wave
    BlockConfig(64, 64, 16, 8, 4, splits=6, vec4=True, double=True),
    # a tile a pair of the lesson's gradient matmuls takes (paired.py)
    BlockConfig(128, 64, 16, 8, 8, vec4=True, double=True),
)
S = 16  # a subgroup matrix's side
PAD = 8  # f16s padding each stored tile line of the tensor-core kernel, against bank conflicts


@dataclass(frozen=True)
class TensorConfig(Blocking):
    bm: int
    bn: int
    bk: int
    sg_rows: int  # subgroups along m
    sg_cols: int  # and along n
    double: bool = False
    splits: int = 1

    @property
    def name(self) -> str:
        split = f" split{self.splits}" if self.splits > 1 else ""
        return f"tensor {self.bm}x{self.bn}x{self.bk}/{self.sg_rows}x{self.sg_cols}{split}{' db' * self.double}"

    @classmethod
    def named(cls, name: str) -> TensorConfig:
        """The configuration a name describes, with or without "tensor " before it: "128x128x32/2x4 split2 db"."""
        match = re.fullmatch(r"(?:tensor )?(\d+)x(\d+)x(\d+)/(\d+)x(\d+)(?: split(\d+))?( db)?", name)
        if match is None:
            raise ValueError(f"{name!r} is not a tensor-core matmul configuration (BMxBNxBK/ROWSxCOLS [splitS] [db])")
        *sizes, splits, double = match.groups()
        return cls(*map(int, sizes), double=bool(double), splits=int(splits or 1))

    @property
    def threads(self) -> int:
        return 32 * self.sg_rows * self.sg_cols

    @staticmethod
    def uses_vec4(m, n, k, transpose_a, transpose_b) -> bool:
        """Whether the kernel takes this shape: it reads both operands as vec4s along their contiguous side."""
        return (m if transpose_a else k) % 4 == 0 and (k if transpose_b else n) % 4 == 0

    @property
    def buffers(self) -> int:
        return 2 if self.double else 1

    def tiles(self, transpose_a: bool, transpose_b: bool) -> tuple[int, int, int, int]:
        """(A_STRIDE, A_TILE, B_STRIDE, B_TILE): each tile stored in its operand's layout, lines padded."""
        a_stride = (self.bm if transpose_a else self.bk) + PAD
        b_stride = (self.bk if transpose_b else self.bn) + PAD
        return (a_stride, a_stride * (self.bk if transpose_a else self.bm),
                b_stride, b_stride * (self.bn if transpose_b else self.bk))

    def workgroup_bytes(self, transpose_a=True, transpose_b=False, half_bytes: int = 2) -> int:
        """The A and B tiles (of f16s, or of f32s in an emulation without f16) and the subgroups' result slots."""
        _, a_tile, _, b_tile = self.tiles(transpose_a, transpose_b)
        return half_bytes * self.buffers * (a_tile + b_tile) + 4 * S * S * self.sg_rows * self.sg_cols

    def check_device(self, limits: dict, half_bytes: int = 2) -> None:
        if self.bm % (S * self.sg_rows) or self.bn % (S * self.sg_cols) or self.bk % S or \
                (self.bm * self.bk // 4) % self.threads or (self.bk * self.bn // 4) % self.threads:
            raise ValueError(f"matmul config {self.name}: blocks must split into 16 x 16 matrices per subgroup, "
                             "and their vec4s evenly over the threads")
        if self.threads > limits.get("max-compute-invocations-per-workgroup", 256):
            raise ValueError(f"matmul config {self.name}: {self.threads} threads, more than the device allows")
        most = max(self.workgroup_bytes(ta, tb, half_bytes) for ta in (False, True) for tb in (False, True))
        if most > limits.get("max-compute-workgroup-storage-size", 16384):
            raise ValueError(f"matmul config {self.name}: {most} bytes of workgroup memory, more than the device has")


# The tensor-core candidates, by name (BENCHMARKS.md times each on the step's shapes): 128 x 128 blocks of 8
# subgroups for large outputs; 8 subgroups on half the block, for 4096^2 outputs (64 x 128) and a linear
# layer's forward (128 x 64); 4 subgroups for outputs of a few hundred blocks; split-K for weight gradients, whose
# K is the batch's tokens. BK = 64 (half the barriers a K) and 4 x 4 result matrices a subgroup (each loaded matrix
# used 4 times, where a 4 x 2 subgroup uses its left ones twice) need 35-45 KiB of workgroup memory each, so are
# candidates only where the device has it.
TENSOR_CONFIGS = tuple(map(TensorConfig.named, (
    "128x128x32/2x4", "128x128x32/2x4 db", "128x64x32/4x2", "64x128x32/2x4", "64x64x32/2x2", "64x64x32/2x2 db",
    "128x128x32/2x4 split2", "64x64x32/2x2 split4", "64x64x32/2x2 split8",
    "64x128x64/2x4", "128x128x64/2x4", "128x128x32/2x2 db")))
PAIR_SPLITS = (1, 2, 3, 4)  # the split counts a pair's tuning tries for each of its two matmuls
