"""The machine code the NVIDIA Vulkan driver made of blocked-matmul configurations: per configuration its
instruction mix, the highest register it uses (how many threads an SM can hold), any spills to local memory, and its
main loop's mix (the loop with the most FFMA: the BK loop).

    python experiments/driver_sass.py "128x128x16/8x8 vec4 db unpadded" ... [--layout nn|bt|tn]
        [--sm SM90] [--out DIR]

Needs an NVIDIA GPU, `nvdisasm` (CUDA's; /usr/local/cuda/bin on the H200 machine) and the `zstandard` package.
With `__GL_SHADER_DISK_CACHE_PATH` set before the driver loads, the driver keeps each compiled pipeline in its disk
cache: zstd frames, some of which hold an `NVuc` blob with the raw instructions. This script compiles one
configuration at a time (a 1024^2 product, aligned, no epilogue) into a fresh cache directory, decompresses the
blobs it finds there, and disassembles each from its last EXIT back, 4 KiB at a time while `nvdisasm -b SM90` reads
it (the blob's code starts at an unknown offset before that). The largest blob of a configuration's cache is its
matmul (the finish and the stand-ins' fills are small); its SASS is written to DIR.

H200, session 15 (driver 580; nn; the loop figures from that run's SASS files): loads and stores carry the driver's
bounds checks (robust buffer access). The highest register, the workgroups an SM holds (64 Ki registers; as
matmul_occupancy.py measured them where it did), and the main loop (instructions, of them FFMA, LDS, MOV; the loop's
LDS count includes the 16 of the guarded row sums, run by one block-column only):
  128x128x16/8x8 vec4 db unpadded  R176  1 of 256 threads     1323: 1024 (77%), 80, 64
  128x128x16/8x8 vec4              R144  1                    1320: 1024 (78%), 80, 35
  128x128x8/8x8 vec4               R132  1 (R127 would fit 2)  705:  512 (73%), 40, 33
  128x64x16/8x8                    R156  3 of 128             1342: 1024 (76%), 80, 33
  64x96x16/8x4 vec4 db             R142  2 of 192              851:  512 (60%), 64, 97
  128x192x16/8x12                  R174  1 of 256             1987: 1536 (77%), 96, 70
  128x128x8/8x16 vec4 db           R221  2 of 128             1313: 1024 (78%), 56, 99
  128x128x8/8x16                   R243  2 of 128             1357: 1024 (75%), 56, 117
None spills to local memory: the 8x16 tiles' losses (matmul_designs.py --wide: 128x128x8/8x16 vec4 db took
1.18-2.21x the best shipped candidate's time on its ten shapes) are not spills, and their loops are as dense as the
8x8 ones with fewer shared-memory reads per FFMA, at the same 8 warps an SM: why they lose is open.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import zstandard  # the driver's cache is zstd frames
except ImportError:
    zstandard = None

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
EXIT = bytes.fromhex("4d79000000000000")  # the low half of SM90's EXIT (opcode 0x94d, no predicate)


def blobs(cache: Path) -> list[bytes]:
    """Every zstd frame's content in the cache's files that is an NVuc blob (the driver's code containers)."""
    found = []
    for path in sorted(p for p in cache.rglob("*") if p.is_file()):
        data = path.read_bytes()
        at = data.find(ZSTD_MAGIC)
        while at >= 0:
            try:
                raw = zstandard.ZstdDecompressor().decompressobj().decompress(data[at:])  # stops at the frame's end
                if raw.startswith(b"NVDANVVMNVuc"):
                    found.append(raw)
            except zstandard.ZstdError:
                pass
            at = data.find(ZSTD_MAGIC, at + 4)
    return found


def disassemble(blob: bytes, nvdisasm: str, sm: str) -> str:
    """The longest stretch before (and with) the blob's last EXIT that nvdisasm reads, as SASS text; "" if none."""
    end = blob.rfind(EXIT)
    if end < 0:
        return ""
    end += 16
    best = ""
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code.bin"
        for pages in range(1, end // 4096 + 2):
            start = max(end % 16, end - 4096 * pages)  # instructions are 16 bytes, aligned as the EXIT is
            code.write_bytes(blob[start:end])
            run = subprocess.run([nvdisasm, "-b", sm, str(code)], capture_output=True, text=True)
            if run.returncode:
                break
            best = run.stdout
    return best


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, the line) of each instruction, predicates left out of the opcode."""
    found = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            found.append((int(m.group(1), 16), m.group(2), line))
    return found


def main_loop(code: list) -> list:
    """The instructions of the loop with the most FFMA (a backward branch's target up to the branch): a matmul's
    BK loop."""
    loops = []
    for at, op, line in code:
        target = re.search(r"BRA (0x[0-9a-f]+)", line) if op == "BRA" else None
        if target and int(target.group(1), 16) < at:
            loops.append([i for i in code if int(target.group(1), 16) <= i[0] <= at])
    return max(loops, key=lambda body: sum(op == "FFMA" for _, op, _ in body), default=[])


def summary(sass: str) -> str:
    code = instructions(sass)
    ops = collections.Counter(op for _, op, _ in code)
    registers = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1) + 1
    spills = ops["STL"] + ops["LDL"]
    top = ", ".join(f"{op} {n}" for op, n in ops.most_common(8))
    loop = collections.Counter(op for _, op, _ in main_loop(code))
    body = sum(loop.values())
    inner = (f"; its main loop {body} instructions: FFMA {loop['FFMA']} ({loop['FFMA'] / body:.0%}), "
             f"LDS {loop['LDS']}, MOV {loop['MOV']}, BAR {loop['BAR']}" if body else "")
    return (f"{len(code)} instructions ({top}); registers R0-R{registers - 1}; {spills} spill loads/stores{inner}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="*", help="BlockConfig names, e.g. '128x128x16/8x8 vec4 db unpadded'")
    parser.add_argument("--layout", default="nn", choices=("nn", "bt", "tn"))
    parser.add_argument("--sm", default="SM90")
    parser.add_argument("--nvdisasm", default="/usr/local/cuda/bin/nvdisasm")
    parser.add_argument("--out", default="sass")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: compile this configuration alone
    args = parser.parse_args()
    if args.one:
        return compile_one(args.one, args.layout)
    if zstandard is None:  # said before the first configuration's compile, not after it
        raise SystemExit("driver_sass.py needs the zstandard package: the driver's cache is zstd frames")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.configs:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, __GL_SHADER_DISK_CACHE="1", __GL_SHADER_DISK_CACHE_PATH=cache,
                       __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1")
            # a process of its own: the driver reads the cache settings when it loads, and writes as it compiles
            subprocess.run([sys.executable, __file__, "--one", name, "--layout", args.layout], env=env, check=True)
            found = sorted(blobs(Path(cache)), key=len)
        if not found:
            print(f"{name}: nothing in the driver's cache")
            continue
        sass = disassemble(found[-1], args.nvdisasm, args.sm)
        path = out / (re.sub(r"[^\w.]+", "_", name) + f"_{args.layout}.sass")
        path.write_text(sass)
        print(f"{name} ({args.layout}): {summary(sass)} -> {path}", flush=True)


def compile_one(name: str, layout: str):
    import numpy as np

    from tinynn import registry
    from tinynn_gpu.matmul.blocked import BlockedMatmul
    from tinynn_gpu.matmul.configs import BLOCK_CONFIGS, BlockConfig
    configs = {c.name: c for c in BLOCK_CONFIGS}
    if name in configs:
        config = configs[name]
    else:  # a configuration of the generator that no candidate uses: "BMxBNxBK/TMxTN" and the flags of its name
        m = re.match(r"(\d+)x(\d+)x(\d+)/(\d+)x(\d+)((?: \w+)*)$", name)
        if not m:
            raise SystemExit(f"{name!r} is not a block configuration's name")
        flags = m.group(6).split()
        number = {f.rstrip("0123456789"): int(f[len(f.rstrip("0123456789")):]) for f in flags if f[-1].isdigit()}
        config = BlockConfig(*map(int, m.groups()[:5]), splits=number.get("split", 1), vec4="vec4" in flags,
                             double="db" in flags, pad="unpadded" not in flags, ahead=number.get("ahead", 1),
                             spread="spread" in flags)
    gpu = registry.select("gpu")
    rt = gpu.rt
    ta, tb = layout == "tn", layout == "bt"
    n = 1024
    a, b = (gpu.from_numpy(np.ones((n, n), np.float32)) for _ in range(2))
    out = rt.empty((n, n))
    BlockedMatmul(rt, config).record(a, b, out, 1, n, n, n, ta, tb, True)
    rt.sync()


if __name__ == "__main__":
    main()
