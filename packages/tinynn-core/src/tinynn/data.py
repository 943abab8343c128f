"""Text data: the embedded default corpus, a character tokenizer, and seeded random batches.

The default corpus needs no download: it is the docstrings of the Python standard library's top-level
modules, read with `ast` (nothing is imported or run) in sorted file order and kept to printable ASCII, so
the same Python gives the same text every time.
"""
from __future__ import annotations

import ast
import functools
import string
import sysconfig
from pathlib import Path

import numpy as np

from tinynn.errors import TinynnError

ALLOWED = set(string.printable) - set("\x0b\x0c\r")


@functools.lru_cache(maxsize=1)
def stdlib_docstrings() -> str:
    """About 700 KB of English prose from the standard library's docstrings."""
    pieces = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    pieces.append("".join(ch for ch in doc if ch in ALLOWED))
    return "\n\n".join(pieces) + "\n"


def load_text(path: str | None) -> str:
    """The text of a UTF-8 file, or the embedded corpus when path is None."""
    if path is None:
        text = stdlib_docstrings()
    else:
        p = Path(path)
        if not p.is_file():
            raise TinynnError(f"data file not found: {path}")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise TinynnError(f"data file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text:
        raise TinynnError(f"data file {path} is empty" if path else "the embedded corpus is empty")
    return text


class CharTokenizer:
    """One token per distinct character, numbered in sorted order."""

    def __init__(self, chars):
        self.chars = sorted(set(chars))
        self.index = {ch: i for i, ch in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise TinynnError(f"text has characters the tokenizer does not know: {''.join(unknown)!r}")
        return np.array([self.index[ch] for ch in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class Batches:
    """Train and validation token streams with seeded random (x, y) batches: y is x shifted by one."""

    def __init__(self, tokens: np.ndarray, block_size: int, val_fraction: float):
        n_val = int(len(tokens) * val_fraction)
        self.train, self.val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]
        self.block_size = block_size
        if len(self.train) <= block_size:
            raise TinynnError(f"the training text has {len(self.train)} tokens, fewer than block_size+1 "
                              f"({block_size + 1}): use more data or a smaller block_size")

    @property
    def has_val(self) -> bool:
        return len(self.val) > self.block_size

    def sample(self, split: str, batch_size: int, rng: np.random.Generator):
        data = self.train if split == "train" else self.val
        starts = rng.integers(0, len(data) - self.block_size, size=batch_size)
        x = np.stack([data[s: s + self.block_size] for s in starts])  # (B, T)
        y = np.stack([data[s + 1: s + 1 + self.block_size] for s in starts])  # (B, T)
        return x, y
