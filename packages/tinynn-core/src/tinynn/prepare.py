"""`tinynn prepare`: a UTF-8 text file, a folder of them, or the built-in corpus -> a token folder in nanoGPT's
layout (`train.bin`, `val.bin`, `meta.json`; see data.py), streamed with a progress bar.

The text is read in chunks of half a MiB, cut where the tokenizer's ids do not depend on the cut
(tokenizer.last_cut), so memory holds a chunk at a time however large the corpus. The tokenizer is `char`
(its characters are collected in a first pass), `bpe` (a byte-level BPE of `vocab_size` tokens trained in a
first pass), or the path of a tokenizer.json. A folder's files are read in sorted order (hidden ones
skipped); with BPE, GPT-2's end-of-text token separates them. The ids go to train.bin as they come; the last
`val_fraction` of them is then moved to val.bin, so the split is the one training on the text would make.
A char folder also gets nanoGPT's `meta.pkl`, a BPE folder its `tokenizer.json`.

    tinynn prepare --out data/stdlib-bpe --tokenizer bpe --vocab-size 2048    # the built-in corpus
    tinynn prepare corpus/ --out data/corpus --tokenizer gpt2/tokenizer.json
"""
from __future__ import annotations

import codecs
import io
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from tinynn.data import FORMAT, META, stdlib_docstrings, token_dtype
from tinynn.errors import TinynnError
from tinynn.tokenizer import BPETokenizer, CharTokenizer, describe, from_json_file, last_cut, pieces

CHUNK_BYTES = 1 << 19  # a few MB of temporaries a chunk (its code points, ids)
OUTPUTS = ("train.bin", "val.bin", META, "meta.pkl", "tokenizer.json")


class Corpus:
    """The text files to read (or the built-in corpus, when `path` is None) and their total size."""

    def __init__(self, path: str | None):
        self.name = path or "the built-in corpus"
        if path is None:
            self.files = [None]
            self.builtin = stdlib_docstrings().encode("utf-8")
            self.size = len(self.builtin)
            return
        root = Path(path)
        if root.is_file():
            self.files = [root]
        elif root.is_dir():
            self.files = sorted(p for p in root.rglob("*") if p.is_file() and
                                not any(part.startswith(".") for part in p.relative_to(root).parts))
            if not self.files:
                raise TinynnError(f"data folder {path} has no files")
        else:
            raise TinynnError(f"data not found: {path}")
        self.size = sum(p.stat().st_size for p in self.files)
        if self.size == 0:
            raise TinynnError(f"data {path} is empty")

    def texts(self, bar: tqdm | None = None, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, str]]:
        """(file index, text) in reading order: each text ends at a safe cut or at its file's end."""
        for index, path in enumerate(self.files):
            name = str(path) if path else self.name
            f = open(path, "rb") if path else io.BytesIO(self.builtin)
            with f:
                decoder, buffer, offset = codecs.getincrementaldecoder("utf-8")(), "", 0
                while True:
                    raw = f.read(chunk_bytes)
                    pending = len(decoder.getstate()[0])
                    try:
                        buffer += decoder.decode(raw, final=not raw)
                    except UnicodeDecodeError as e:
                        raise TinynnError(f"{name} is not UTF-8 text ({e.reason} at byte "
                                          f"{offset - pending + e.start})") from None
                    offset += len(raw)
                    if bar is not None:
                        bar.update(len(raw))
                    cut = last_cut(buffer) if raw else len(buffer)
                    if cut:
                        yield index, buffer[:cut]
                        buffer = buffer[cut:]
                    if not raw:
                        break


def prepare(data: str | None, out: str, tokenizer: str = "char", vocab_size: int | None = None,
            val_fraction: float = 0.1, overwrite: bool = False, progress: bool = True,
            chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Write the token folder `out` from `data` (see the module docstring); returns its meta."""
    if not 0.0 <= val_fraction < 1.0:
        raise TinynnError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if vocab_size is not None and tokenizer != "bpe":
        raise TinynnError("vocab_size is for training a bpe tokenizer (--tokenizer bpe)")
    corpus = Corpus(data)
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise TinynnError(f"--out {out} is a file, not a folder")
    held = [name for name in OUTPUTS if (out_dir / name).exists()]
    if held and not overwrite:
        raise TinynnError(f"{out} already holds {held[0]}: use --overwrite to replace it, or another folder")
    tok = _tokenizer(corpus, tokenizer, vocab_size, progress, chunk_bytes)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TinynnError(f"--out {out} cannot be created ({e.strerror or e})") from None
    dtype = token_dtype(tok.vocab_size)
    tmp = {name: out_dir / f"{name}.tmp-{os.getpid()}" for name in OUTPUTS}
    try:
        count = _write_tokens(corpus, tok, tmp["train.bin"], np.dtype(dtype), progress, chunk_bytes)
        n_val = int(count * val_fraction)
        _move_tail(tmp["train.bin"], tmp["val.bin"], n_val * np.dtype(dtype).itemsize)
        meta = {"format": FORMAT, "tokenizer": {"type": tok.kind}, "vocab_size": tok.vocab_size, "dtype": dtype,
                "train_tokens": count - n_val, "val_tokens": n_val, "source": corpus.name}
        if tok.kind == "char":
            meta["tokenizer"]["chars"] = tok.chars
            with open(tmp["meta.pkl"], "wb") as f:  # nanoGPT's sample.py decodes with it
                pickle.dump({"vocab_size": tok.vocab_size, "itos": dict(enumerate(tok.chars)),
                             "stoi": dict(tok.index)}, f)
        else:
            meta["tokenizer"]["file"] = "tokenizer.json"
            tmp["tokenizer.json"].write_text(tok.to_json(), encoding="utf-8")
        tmp[META].write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        for name in OUTPUTS:
            if tmp[name].exists():
                os.replace(tmp[name], out_dir / name)
            elif (out_dir / name).exists():  # a stale file of the other tokenizer kind
                (out_dir / name).unlink()
    except OSError as e:
        raise TinynnError(f"cannot write the token folder {out} ({e.strerror or e})") from None
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    return meta


def _tokenizer(corpus: Corpus, name: str, vocab_size: int | None, progress: bool, chunk_bytes: int):
    if name == "char":
        chars = set()
        with _bar(corpus, "characters", progress) as bar:
            for _, text in corpus.texts(bar, chunk_bytes):
                chars.update(text)
        return CharTokenizer(chars)
    if name == "bpe":
        if vocab_size is None:
            raise TinynnError("--tokenizer bpe needs --vocab-size (e.g. 2048; GPT-2's is 50257)")
        with _bar(corpus, "bpe (reading)", progress) as bar:
            texts = (p for _, text in corpus.texts(bar, chunk_bytes) for p in pieces(text, 65536))
            return BPETokenizer.train(texts, vocab_size, progress=progress)
    if name.endswith(".json") or Path(name).is_file():
        return from_json_file(name)
    raise TinynnError(f"--tokenizer must be char, bpe or the path of a tokenizer.json, got {name!r}")


def _write_tokens(corpus: Corpus, tok, path: Path, dtype: np.dtype, progress: bool, chunk_bytes: int) -> int:
    count, last_file = 0, 0
    eot = getattr(tok, "eot_id", None)
    with open(path, "wb") as f, _bar(corpus, f"tokenize ({describe(tok)})", progress) as bar:
        for index, text in corpus.texts(bar, chunk_bytes):
            ids = tok.encode_pieces(pieces(text, 16384)) if tok.kind == "bpe" else tok.encode(text)
            if index != last_file and eot is not None:  # a new file: a new document
                ids = np.concatenate([[eot], ids])
            last_file = index
            f.write(ids.astype(dtype).tobytes())
            count += len(ids)
    if count == 0:
        raise TinynnError(f"{corpus.name} has no text to tokenize")
    return count


def _move_tail(train: Path, val: Path, nbytes: int) -> None:
    """The last nbytes of train go to val (in chunks), and train is cut short."""
    size = train.stat().st_size
    with open(train, "rb") as src, open(val, "wb") as dst:
        src.seek(size - nbytes)
        while chunk := src.read(min(CHUNK_BYTES * 16, size - src.tell())):
            dst.write(chunk)
    os.truncate(train, size - nbytes)


def _bar(corpus: Corpus, desc: str, progress: bool) -> tqdm:
    return tqdm(total=corpus.size, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
                dynamic_ncols=True, leave=False)
