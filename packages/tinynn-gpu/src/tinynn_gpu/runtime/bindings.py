"""Kernel arguments by name: the `@group(0) @binding(n) var<...> NAME` declarations of a WGSL module, and which of
them each entry point uses, so that Python binds every array by the name the kernel gives it.

An entry point uses a binding when its body, or a function it calls, names it (comments aside): what
`layout: "auto"` puts in its pipeline's bind group layout. `Bindings.slots(entry, names)` turns the names a
launcher gives into binding slots once, when a dispatch is prepared, and refuses a name the module does not
declare, a binding the entry point uses that was not given, and one it does not use, each by name.
"""
from __future__ import annotations

import re

_COMMENT = re.compile(r"//[^\n]*")
_BINDING = re.compile(r"@group\(\s*0\s*\)\s*@binding\(\s*(\d+)\s*\)\s*var(?:\s*<[^>]*>)?\s+(\w+)\s*:")
_ENTRY = re.compile(r"@compute\s+@workgroup_size\([^)]*\)\s*fn\s+(\w+)")
_FUNCTION = re.compile(r"\bfn\s+(\w+)\s*\(")
_DECLARED = re.compile(r"\b(?:let|var|const)\s+(\w+)")
_PARAMETER = re.compile(r"(\w+)\s*:")
_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)")


class Bindings:
    """A module's bindings: `slot` by name, its entry points, and `used(entry)`, the names an entry point binds."""
    __slots__ = ("label", "slot", "entries", "_bodies", "_used")

    def __init__(self, label: str, slot: dict[str, int], entries: tuple, bodies: dict):
        self.label = label
        self.slot = slot  # name -> binding number
        self.entries = entries  # the module's entry points
        self._bodies = bodies  # function name -> (the text of its body, the names it declares: parameters, locals)
        self._used = {}  # entry point -> frozenset of binding names

    @classmethod
    def parse(cls, wgsl: str, label: str = "kernel") -> Bindings:
        code = _COMMENT.sub("", wgsl)
        slot = {}
        for number, name in _BINDING.findall(code):
            if name in slot:
                raise ValueError(f"{label}: binding {name!r} is declared twice")
            slot[name] = int(number)
        return cls(label, slot, tuple(_ENTRY.findall(code)), _bodies(code))

    def used(self, entry: str) -> frozenset:
        """The bindings entry point `entry` names, itself or through the functions it calls."""
        found = self._used.get(entry)
        if found is None:
            if entry not in self._bodies:
                raise KeyError(f"{self.label}: no entry point {entry!r}")
            names, seen, todo = set(), {entry}, [entry]
            while todo:
                body, local = self._bodies[todo.pop()]
                for name in _NAME.findall(body):
                    if name in local:
                        continue
                    if name in self.slot:
                        names.add(name)
                    elif name in self._bodies and name not in seen:
                        seen.add(name)
                        todo.append(name)
            found = self._used[entry] = frozenset(names)
        return found

    def slots(self, entry: str, names) -> tuple[int, ...]:
        """The binding slots of `names`, in their order, for a dispatch of `entry`: every binding it uses given once,
        and nothing else, or a ValueError naming what is wrong."""
        unknown = [name for name in names if name not in self.slot]
        if unknown:
            raise ValueError(f"{self.label}.{entry}: no binding named {', '.join(map(repr, unknown))} "
                             f"(the module declares {', '.join(sorted(self.slot))})")
        used = self.used(entry)
        given = set(names)
        if len(given) < len(names):
            raise ValueError(f"{self.label}.{entry}: a binding is given twice in {list(names)}")
        if given != used:
            missing, unused = sorted(used - given), sorted(given - used)
            raise ValueError(f"{self.label}.{entry}: " + "; ".join(
                ([f"binding {', '.join(map(repr, missing))} not given"] if missing else []) +
                ([f"{', '.join(map(repr, unused))} not used by this entry point"] if unused else [])))
        return tuple(self.slot[name] for name in names)


def _bodies(code: str) -> dict[str, tuple[str, set]]:
    """Each function's body text (between its braces) and the names it declares (its parameters and locals, which
    may shadow a binding's name), by name."""
    bodies = {}
    for match in _FUNCTION.finditer(code):
        start = code.find("{", match.end())
        signature = code[match.end():start]
        depth, i = 0, start
        while i < len(code):
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        body = code[start + 1:i]
        local = set(_DECLARED.findall(body)) | set(_PARAMETER.findall(signature.split("->")[0]))
        bodies[match.group(1)] = (body, local)
    return bodies
