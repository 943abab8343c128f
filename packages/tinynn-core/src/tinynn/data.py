"""Training data: the embedded default corpus, folders of token files, and seeded random batches.

The default corpus needs no download: it is the docstrings of the Python standard library's top-level
modules, read with `ast` (nothing is imported or run) in sorted file order and kept to printable ASCII, so
the same Python gives the same text every time.

A token folder is nanoGPT's layout, written by `tinynn prepare` (prepare.py) or by nanoGPT's own scripts:
`train.bin` and `val.bin` hold the token ids back to back (uint16 where the vocabulary fits, else uint32) and
are memory-mapped, so a corpus larger than memory is trained on without being loaded; `meta.json` names the
tokenizer. nanoGPT's folders work too: a `meta.pkl` holds a char tokenizer's `itos`, and a folder with
neither holds uint16 ids of GPT-2's BPE, whose tokenizer.json must then come from elsewhere.
"""
from __future__ import annotations

import ast
import functools
import json
import pickle
import string
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinynn import tokenizer as tokenizers
from tinynn.errors import TinynnError, not_found
from tinynn.tokenizer import BPETokenizer, CharTokenizer, describe, from_json_file, pieces

META = "meta.json"
FORMAT = "tinynn-tokens-1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}

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
            raise not_found("data file", path, "a folder with no train.bin: not a token folder (tinynn prepare "
                                               "writes one)")
        try:
            text = p.read_text(encoding="utf-8-sig")  # a byte-order mark some editors write is not text
        except UnicodeDecodeError as e:
            raise TinynnError(f"data file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text:
        raise TinynnError(f"data file {path} is empty" if path else "the embedded corpus is empty")
    return text


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned type that holds every id of the vocabulary (nanoGPT's uint16 where it fits)."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def is_token_folder(path) -> bool:
    return path is not None and Path(path).is_dir() and (Path(path) / "train.bin").is_file()


class TokenFolder:
    """train.bin and val.bin memory-mapped, and the tokenizer their meta file names (None for nanoGPT's
    GPT-2 files, which have no meta: the caller supplies GPT-2's tokenizer). A file that does not fit its
    meta (truncated, replaced, foreign) is a TinynnError naming it."""

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise TinynnError(f"data folder not found: {path}")
        self.tokenizer, self.dtype, counts = self._meta()
        self.vocab_size = self.tokenizer.vocab_size if self.tokenizer else None
        self.train = self._map("train.bin", counts.get("train_tokens"))
        self.val = self._map("val.bin", counts.get("val_tokens"))

    def _meta(self):
        meta, pkl = self.path / META, self.path / "meta.pkl"
        if meta.is_file():
            try:
                raw = json.loads(meta.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise TinynnError(f"{meta} is not valid JSON ({getattr(e, 'msg', e)})") from None
            found = raw.get("format") if isinstance(raw, dict) else None
            if found != FORMAT:
                raise TinynnError(f"{meta} is not tinynn's token meta (format {found!r})")
            for key, kind in (("dtype", str), ("train_tokens", int), ("val_tokens", int), ("tokenizer", dict)):
                if not isinstance(raw.get(key), kind):
                    raise TinynnError(f"{meta}: {key!r} is missing or not {kind.__name__}")
            if raw["dtype"] not in DTYPES:
                raise TinynnError(f"{meta}: dtype must be uint16 or uint32, got {raw['dtype']!r}")
            spec, source = dict(raw["tokenizer"]), str(meta)
            if spec.get("type") == "bpe" and isinstance(spec.get("file"), str):  # written beside the meta
                source = str(self.path / spec["file"])  # a fault is that file's
                spec = {"type": "bpe", "json": self._read(self.path / spec["file"])}
            tok = tokenizers.from_spec(spec, source)
            return tok, DTYPES[raw["dtype"]], raw
        if pkl.is_file():
            return _nanogpt_char_meta(pkl), np.uint16, {}
        return None, np.uint16, {}  # nanoGPT's GPT-2 BPE: uint16 ids, no meta

    @staticmethod
    def _read(path: Path) -> str:
        if not path.is_file():
            raise not_found("tokenizer file", path)
        return path.read_text(encoding="utf-8")

    def _map(self, name: str, expected: int | None) -> np.ndarray:
        path = self.path / name
        if not path.is_file():
            raise TinynnError(f"{path} not found: a token folder holds train.bin and val.bin")
        size, item = path.stat().st_size, np.dtype(self.dtype).itemsize
        if size % item:
            raise TinynnError(f"{path} is truncated: {size} bytes is not a whole number of "
                              f"{np.dtype(self.dtype).name} tokens")
        if expected is not None and size // item != expected:
            raise TinynnError(f"{path} holds {size // item:,} tokens, {META} says {expected:,}: "
                              "it was truncated or replaced (prepare the folder again)")
        if size == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(path, dtype=self.dtype, mode="r")

    def batches(self, block_size: int, vocab_size: int | None = None) -> Batches:
        return Batches.of(self.train, self.val, block_size, vocab_size or self.vocab_size, str(self.path))


class _PlainUnpickler(pickle.Unpickler):
    """nanoGPT's meta.pkl holds only dicts, ints and strings: anything that names a class (and so could run
    code) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}, not plain data")


def _nanogpt_char_meta(path: Path) -> CharTokenizer:
    try:
        with open(path, "rb") as f:
            meta = _PlainUnpickler(f).load()
    except Exception as e:  # a damaged pickle raises anything from EOFError to ValueError
        raise TinynnError(f"{path} is not nanoGPT's meta.pkl ({e})") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not isinstance(itos, dict) or sorted(itos) != list(range(len(itos))) or \
            not all(isinstance(c, str) and len(c) == 1 for c in itos.values()):
        raise TinynnError(f"{path} is not nanoGPT's char meta.pkl (no 'itos' from 0..n-1 to characters)")
    if meta.get("vocab_size", len(itos)) != len(itos):
        raise TinynnError(f"{path}: vocab_size {meta['vocab_size']} differs from the {len(itos)} characters of itos")
    return CharTokenizer.from_itos([itos[i] for i in range(len(itos))])


class Batches:
    """Train and validation token streams with seeded random (x, y) batches: y is x shifted by one. The
    streams may be memory-mapped files: a batch reads only its rows. Every backend and every MPI rank draws
    from the same generator state, so the same seed gives the same batches everywhere."""

    def __init__(self, tokens: np.ndarray, block_size: int, val_fraction: float):
        n_val = int(len(tokens) * val_fraction)
        self._set(tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:], block_size, None, "the training text")

    @classmethod
    def of(cls, train: np.ndarray, val: np.ndarray, block_size: int, vocab_size: int | None = None,
           source: str = "the data") -> Batches:
        """Batches over separate train and val streams (a token folder's); ids at or past vocab_size in a
        drawn batch are an error naming source."""
        batches = cls.__new__(cls)
        batches._set(train, val, block_size, vocab_size, source)
        return batches

    def _set(self, train, val, block_size, vocab_size, source):
        self.train, self.val, self.block_size = train, val, block_size
        self.vocab_size, self.source = vocab_size, source
        if len(self.train) <= block_size:
            raise TinynnError(f"{source} has {len(self.train)} training tokens, fewer than block_size+1 "
                              f"({block_size + 1}): use more data or a smaller block_size")

    @property
    def has_val(self) -> bool:
        return len(self.val) > self.block_size

    def sample(self, split: str, batch_size: int, rng: np.random.Generator):
        data = self.train if split == "train" else self.val
        starts = rng.integers(0, len(data) - self.block_size, size=batch_size)
        rows = data[starts[:, None] + np.arange(self.block_size + 1)].astype(np.int64)  # (B, T + 1)
        if self.vocab_size is not None and rows.size and rows.max() >= self.vocab_size:
            raise TinynnError(f"{self.source} holds token id {rows.max()} in its {split} tokens, outside the "
                              f"vocabulary of {self.vocab_size}: it was prepared with another tokenizer")
        return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])  # x, y (B, T)


@dataclass
class TrainingData:
    tokenizer: CharTokenizer | BPETokenizer
    batches: Batches
    first: np.ndarray  # the first training token, (1,): the sample's prompt when the config gives none
    in_memory: int  # token ids held in memory (a token folder's stay on disk)


def training_data(data: str | None, tokenizer: str | None, vocab_size: int | None, block_size: int,
                  val_fraction: float, *, fixed=None, fixed_source: str = "", progress: bool = False) -> TrainingData:
    """A run's tokenizer and batches. `data` is a token folder (memory-mapped), a UTF-8 text file or None (the
    built-in corpus), both tokenized in memory; `tokenizer` is the config's: None (the folder's, or char),
    "char", "bpe" (trained here on the text at `vocab_size`) or a tokenizer.json. `fixed` is a tokenizer the
    run must use (a resumed checkpoint's, a GPT-2 folder's): data prepared with another is an error naming
    both."""
    if is_token_folder(data):
        if vocab_size is not None:
            raise TinynnError(f"vocab_size is for training a bpe tokenizer on text; data {data} is already tokenized")
        folder = TokenFolder(data)
        tok = folder.tokenizer
        if tokenizer in ("char", "bpe") and tok is not None and tok.kind != tokenizer:
            raise TinynnError(f"tokenizer is {tokenizer!r}, but data {data} was prepared with a {describe(tok)}")
        if tokenizer not in (None, "char", "bpe"):
            named = from_json_file(tokenizer)
            if tok is not None and not named.same_as(tok):
                raise TinynnError(f"tokenizer {tokenizer} is not the one data {data} was prepared with "
                                  f"({describe(tok)})")
            tok = named
        if fixed is not None and tok is not None and not tok.same_as(fixed):
            raise TinynnError(f"data {data} was prepared with a {describe(tok)}, {fixed_source} has a "
                              f"{describe(fixed)}: prepare the data with that one (--tokenizer)")
        tok = tok or fixed
        if tok is None:
            raise TinynnError(f"data {data} has no meta.json or meta.pkl: nanoGPT writes none for GPT-2's BPE, whose "
                              "tokenizer.json must then be given (the tokenizer key, or --init-from a GPT-2 folder)")
        vocab = max(tok.vocab_size, fixed.vocab_size if fixed is not None else 0)
        batches = Batches.of(folder.train, folder.val, block_size, vocab, str(folder.path))
        return TrainingData(tok, batches, np.asarray(folder.train[:1], dtype=np.int64), 0)
    text = load_text(data)
    if fixed is not None:
        if tokenizer in ("char", "bpe") and fixed.kind != tokenizer:
            raise TinynnError(f"tokenizer is {tokenizer!r}, but {fixed_source} has a {describe(fixed)}")
        tok = fixed
    elif tokenizer in (None, "char"):
        tok = CharTokenizer(text)
    elif tokenizer == "bpe":
        if vocab_size is None:
            raise TinynnError("tokenizer 'bpe' needs a vocab_size (e.g. 2048)")
        tok = BPETokenizer.train(pieces(text, 65536), vocab_size, progress=progress)
    else:
        tok = from_json_file(tokenizer)
    try:
        tokens = tok.encode(text)
    except TinynnError as e:
        kept = f" (a run keeps the tokenizer of {fixed_source}: train on text it covers)" if fixed is not None else ""
        raise TinynnError(f"data {data or 'the built-in corpus'}: {e}{kept}") from None
    return TrainingData(tok, Batches(tokens, block_size, val_fraction), tokens[:1], len(tokens))
