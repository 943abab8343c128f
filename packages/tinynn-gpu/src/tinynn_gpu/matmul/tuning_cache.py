"""The autotune's choices kept between processes: one JSON file (`TINYNN_CACHE_DIR`, default ~/.cache/tinynn)
holding, for each adapter key (adapter, graphics backend, wgpu version, runtime checks: what changes which kernel
is fastest), a variant name per shape key (selection.py's; ops/attention_choice.py's "high attention ..." keys).
A choice is written as soon as it is found, so a run cut short keeps what it tuned. A missing, unreadable or
older file is an empty cache: tuning runs again; so is an entry of the wrong type in it (a hand-edited or
foreign file), dropped alone, as a choice naming no variant is left to the selector.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

# raised whenever the candidates or the kernels change: choices timed on other kernels are tuned again
CACHE_VERSION = 10
FILE_NAME = "matmul-autotune.json"


class TuningCache:
    """One adapter key's choices in the cache file under `directory`."""

    def __init__(self, directory: Path, key: str):
        self.path = Path(directory) / FILE_NAME
        self.key = key

    def choices(self) -> dict[str, str]:
        """This adapter key's choices: shape key -> variant name."""
        return self._read().get(self.key, {})

    def keep(self, shape_key: str, name: str) -> str:
        """Write one choice into the file (the other keys' kept as they are), and return it."""
        cache = self._read()
        cache.setdefault(self.key, {})[shape_key] = name
        self._write(cache)
        return name

    def _read(self) -> dict:
        """{adapter key: {shape key: name}}, holding only strings."""
        try:
            data = json.loads(self.path.read_text())
            choices = data["choices"] if data.get("version") == CACHE_VERSION else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}  # no cache yet, or an unreadable one: tune again
        if not isinstance(choices, dict):
            return {}
        return {key: {shape: name for shape, name in shapes.items() if isinstance(name, str)}
                for key, shapes in choices.items() if isinstance(shapes, dict)}

    def _write(self, cache: dict) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")  # ranks tune at once
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"version": CACHE_VERSION, "choices": cache}, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:  # a read-only home, a full disk: only costs re-tuning in the next process
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
