"""Loading WGSL: a kernel file by name from the wing that holds it (ops/ and matmul/, each beside its launcher), or
a piece of WGSL that several kernel files include (kernels/: common.wgsl, prepended to every kernel file,
op_params.wgsl, to every op's, and the group sums and row teams that group_sum.py fills in); and the two ways a
template is filled in (`fill`, `unroll`)."""
from __future__ import annotations

from functools import cache
from importlib import resources

WINGS = ("ops", "matmul", "kernels")  # file names are unique across them


def kernel_file(name: str) -> str:
    """<folder>/<name>.wgsl as it is."""
    return _located(name)[1]


@cache
def _located(name: str) -> tuple[str, str]:
    """(the wing that holds <name>.wgsl, its text)."""
    for wing in WINGS:
        path = resources.files("tinynn_gpu") / wing / f"{name}.wgsl"
        if path.is_file():
            return wing, path.read_text(encoding="utf-8")
    raise FileNotFoundError(f"no kernel file {name}.wgsl in tinynn_gpu's {', '.join(WINGS)}")


def kernel_source(name: str, fills: dict | None = None) -> str:
    """A kernel file's WGSL with common.wgsl prepended (lesson.wgsl is self-contained), and for an op's kernel
    file (ops/) the binding of its Params (op_params.wgsl); in a template, each `{{KEY}}` replaced by
    str(fills[KEY])."""
    wing, text = _located(name)
    if name != "lesson":
        text = kernel_file("common") + "\n" + (kernel_file("op_params") + "\n" if wing == "ops" else "") + text
    return fill(text, fills)


def fill(text: str, fills: dict | None) -> str:
    """A template's text with each `{{KEY}}` replaced by str(fills[KEY])."""
    for key, value in (fills or {}).items():
        text = text.replace("{{" + key + "}}", str(value))
    return text


def unroll(text: str, counts: dict) -> str:
    """Repeat each code line that holds a marker in its code (not in a comment) once per value of it (0 ..
    count-1), the marker replaced."""
    lines = []
    for line in text.splitlines():
        copies = [line]
        for marker, count in counts.items():
            if marker in line.split("//")[0]:
                copies = [copy.replace(marker, str(i)) for copy in copies for i in range(count)]
        lines += copies
    return "\n".join(lines) + "\n"
