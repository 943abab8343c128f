"""Kernel parameters by name: each kernel file declares its uniform block as a WGSL struct,

    struct Params { rows: u32, cols: u32, scale: f32, shape: array<vec4<u32>, 2> }
    @group(0) @binding(3) var<uniform> params: Params;

and Python passes a dict, `{"rows": n, "cols": c, "scale": 0.5, "shape": (4, 5, 6)}`. `ParamsLayout` reads
the struct once per shader module and packs such dicts into its bytes: a field not given is 0, a name the
struct lacks is an error. Fields are u32, i32 or f32 scalars, or `array<vec4<T>, N>` (4N values of T, e.g. a
shape or stride list; a shorter list is padded with 0). WGSL's uniform layout: scalars take 4 bytes at
4-byte alignment, arrays of vec4 16-byte aligned, the struct rounded up to 16 bytes.

Packing runs on every eager dispatch, so the layout is compiled to one `struct.Struct` and its default
values. A call site passes the same names in the same order every time, so for each such order of scalar
fields `pack` keeps an `itemgetter` that picks the struct's values from the dict's values followed by the
defaults: the values go in without a Python loop. A dict with an array field (a shape, say) is filled in
by a loop (`_fill`).
"""
from __future__ import annotations

import operator
import re
import struct

CODES = {"u32": "I", "i32": "i", "f32": "f"}
_STRUCT = re.compile(r"struct\s+Params\s*\{(.*?)\}", re.S)
_FIELD = re.compile(r"(\w+)\s*:\s*(?:(u32|i32|f32)|array\s*<\s*vec4\s*<\s*(u32|i32|f32)\s*>\s*,\s*(\d+)u?\s*>)\s*,?")
_COMMENT = re.compile(r"//[^\n]*")


class ParamsLayout:
    """The byte layout of one WGSL `struct Params`: `pack(dict) -> bytes`."""
    __slots__ = ("label", "fields", "size", "_struct", "_defaults", "_scalars", "_arrays", "_picks")

    def __init__(self, label: str, fields: list[tuple[str, str, int]]):
        """fields: (name, WGSL scalar type, count) in declaration order; count 1 for a scalar, 4N for an
        array<vec4<T>, N>."""
        self.label = label
        self.fields = {}  # name -> (byte offset, type, count)
        fmt, offset, defaults = "<", 0, []
        self._scalars, self._arrays = {}, {}  # name -> index in defaults; name -> (index, count)
        for name, kind, count in fields:
            if name in self.fields:
                raise ValueError(f"{label}: Params declares {name!r} twice")
            align = 4 if count == 1 else 16
            pad = -offset % align
            fmt += f"{pad}x" if pad else ""
            offset += pad
            self.fields[name] = (offset, kind, count)
            if count == 1:
                self._scalars[name] = len(defaults)
            else:
                self._arrays[name] = (len(defaults), count)
            fmt += f"{count}{CODES[kind]}"
            defaults += [0.0 if kind == "f32" else 0] * count
            offset += 4 * count
        self.size = max(16, -(-offset // 16) * 16)
        fmt += f"{self.size - offset}x" if self.size > offset else ""
        self._struct = struct.Struct(fmt)
        self._defaults = tuple(defaults)
        self._picks = {}  # the names of a dict, in its order -> `_pick`'s answer

    @classmethod
    def parse(cls, wgsl: str, label: str = "kernel") -> ParamsLayout | None:
        """The layout of the `struct Params` in this WGSL source; None when it declares none."""
        found = _STRUCT.search(_COMMENT.sub("", wgsl))
        if found is None:
            return None
        body = found.group(1)
        fields, end = [], 0
        for match in _FIELD.finditer(body):
            if body[end:match.start()].strip():
                break
            name, scalar, element, length = match.groups()
            fields.append((name, scalar, 1) if scalar else (name, element, 4 * int(length)))
            end = match.end()
        if body[end:].strip():
            raise ValueError(f"{label}: cannot read Params field {body[end:].strip()[:40]!r} "
                             "(fields are u32, i32, f32 or array<vec4<T>, N>)")
        return cls(label, fields)

    def pack(self, values: dict) -> bytes:
        names = tuple(values)
        pick = self._picks.get(names)
        if pick is None:
            pick = self._picks[names] = self._pick(names)
        try:
            if pick is _FILL:
                return self._struct.pack(*self._fill(values))
            return self._struct.pack(*pick(tuple(values.values()) + self._defaults))
        except struct.error:
            raise ValueError(self._explain(values)) from None

    def _pick(self, names: tuple):
        """The struct's values, in order, from a dict with these names (all scalar fields): an itemgetter
        over its values followed by the defaults. _FILL where a name is an array field."""
        for name in names:
            if name not in self._scalars:
                self._array(name)  # refuses an unknown name
                return _FILL
        given = {self._scalars[name]: i for i, name in enumerate(names)}  # index in the defaults -> in names
        indices = [given.get(j, len(names) + j) for j in range(len(self._defaults))]
        if len(indices) == 1:  # an itemgetter of one index gives the value, not a tuple of it
            return lambda source: (source[indices[0]],)
        return operator.itemgetter(*indices)

    def _fill(self, values: dict) -> list:
        flat = list(self._defaults)
        for name, value in values.items():
            i = self._scalars.get(name)
            if i is None:
                i, count = self._array(name)
                if len(value) > count:
                    raise ValueError(f"{self.label}: Params field {name!r} holds {count} values, got {len(value)}")
                flat[i:i + len(value)] = value
            else:
                flat[i] = value
        return flat

    def _array(self, name: str) -> tuple[int, int]:
        """An array field's (index in the defaults, count)."""
        slot = self._arrays.get(name)
        if slot is None:
            raise KeyError(f"{self.label}: Params has no field {name!r} (fields: {', '.join(self.fields)})")
        return slot

    def _explain(self, values: dict) -> str:
        """Which value does not fit its field (only on the error path: pack itself checks nothing)."""
        for name, value in values.items():
            _, kind, count = self.fields[name]
            for v in ([value] if count == 1 else value):
                try:
                    struct.pack("<" + CODES[kind], v)
                except struct.error as e:
                    return f"{self.label}: Params field {name!r} ({kind}) cannot hold {v!r}: {e}"
        return f"{self.label}: cannot pack {values}"


_FILL = object()  # `_pick`'s answer for names that include an array field
