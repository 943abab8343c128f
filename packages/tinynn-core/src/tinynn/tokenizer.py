"""Tokenizers: text to token ids and back, and how a tokenizer is written into a checkpoint or a data folder.

- `CharTokenizer`: one token per distinct character, numbered in sorted order (the default; pure NumPy).
- `BPETokenizer`: byte-level BPE through Hugging Face's `tokenizers` (`pip install 'tinynn-core[bpe]'`):
  trained on a corpus at a given vocabulary size, or read from a `tokenizer.json` in GPT-2's format.

Both travel as a `spec`, a JSON-able dict (`{"type": "char", "chars": [...]}` or `{"type": "bpe", "json": ...}`)
that `from_spec` turns back into the same tokenizer. Long texts are encoded in pieces cut where byte-level BPE's
pre-tokenizer would cut anyway (`last_cut`), so streaming a corpus gives the ids that encoding it whole gives.

    >>> tok = BPETokenizer.train(["some text", "more text"], vocab_size=512)
    >>> tok.decode(tok.encode("some text")) == "some text"
"""
from __future__ import annotations

import codecs
import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tinynn.errors import TinynnError, not_found

EOT = "<|endoftext|>"  # GPT-2's end-of-text token, kept as a special token by trained BPEs too
MIN_BPE_VOCAB = 257  # the 256 byte tokens and EOT
# A space, tab or line break between two characters that are not whitespace: GPT-2's split pattern never makes
# a pre-token that crosses the point before it, nor one that differs when the text ends there (see last_cut).
# Python's \S excludes more than the pattern's \s (\x1c-\x1f too), so the neighbours are surely not
# whitespace; the cut character itself is whitespace in every definition.
_CUT = re.compile(r"(?<=\S)[ \t\n\r](?=\S)")


def pieces(text: str, size: int) -> list[str]:
    """text cut at safe points into pieces of about `size` characters (longer where no safe point is near)."""
    out, start = [], 0
    while len(text) - start > size:
        cut = last_cut(text, start, start + size)
        if cut == start:  # no safe point before start + size: the first one after it
            match = _CUT.search(text, start + size)
            cut = match.start() if match else len(text)
        out.append(text[start:cut])
        start = cut
    if start < len(text) or not out:
        out.append(text[start:])
    return out


def last_cut(text: str, start: int = 0, end: int | None = None) -> int:
    """The last index i in (start, end) where byte-level BPE gives the same ids for text[:i] and text[i:] as
    for the whole, else start. It is a whitespace character with a non-whitespace one on each side: GPT-2's
    pre-tokenizer ends a letter, digit or punctuation run before any whitespace and starts a new pre-token at
    such a character (` ?\\p{L}+`, or `\\s+` alone), whether the text goes on or ends there; a run of several
    whitespace characters is never cut, since `\\s+(?!\\S)` splits it by what follows it."""
    end = len(text) if end is None else end
    last, lo = start, max(start, end - 4096)
    while True:
        for match in _CUT.finditer(text, lo, end):
            last = match.start()
        if last > start or lo == start:
            return last
        lo, end = max(start, lo - 65536), lo + 2  # further back (+2: a match across the seam)


class CharTokenizer:
    """One token per distinct character, numbered in sorted order (nanoGPT's char-level `stoi`/`itos`)."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        self._set(sorted(set(chars)))

    @classmethod
    def from_itos(cls, itos: list[str]) -> CharTokenizer:
        """A tokenizer whose ids are the positions in `itos` (distinct single characters), in that order."""
        tok = cls.__new__(cls)
        tok._set(list(itos))
        return tok

    def _set(self, chars: list[str]):
        self.chars = chars
        self.index = {ch: i for i, ch in enumerate(chars)}
        codes = np.array([ord(ch) for ch in chars], dtype=np.uint32)
        self._order = np.argsort(codes, kind="stable")
        self._codes = codes[self._order]  # sorted code points, searched to encode

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # (N,) code points
        if not len(self._codes):
            known, slots = np.zeros(len(codes), bool), np.zeros(len(codes), np.int64)
        else:
            slots = np.minimum(np.searchsorted(self._codes, codes), len(self._codes) - 1)
            known = self._codes[slots] == codes
        if not known.all():
            unknown = sorted({chr(c) for c in np.unique(codes[~known])})
            raise TinynnError(f"text has characters the tokenizer does not know: {''.join(unknown)!r}")
        return self._order[slots]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in np.ravel(ids))

    def stream_decoder(self):
        """A function of a few new ids -> their text (characters never span two tokens)."""
        return self.decode

    def spec(self) -> dict:
        return {"type": "char", "chars": self.chars}

    def same_as(self, other) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars


def tokenizers_module():
    """Hugging Face's `tokenizers`, or the error that says how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise TinynnError("the bpe tokenizer needs Hugging Face's tokenizers: pip install 'tinynn-core[bpe]'") from None
    return tokenizers


class BPETokenizer:
    """Byte-level BPE (GPT-2's kind) over a `tokenizers.Tokenizer`. Any text encodes (every byte is a token);
    ids decode to the same text."""

    kind = "bpe"

    def __init__(self, tokenizer, source: str = "tokenizer"):
        self.hf = tokenizer
        self.source = source

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, progress: bool = False, length: int | None = None):
        """A BPE of `vocab_size` tokens (or fewer, when the corpus has no more pairs to merge) learned from
        `texts`, an iterable of strings (pieces cut with `pieces` or `last_cut` count words as the whole does)."""
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < MIN_BPE_VOCAB:
            raise TinynnError(f"vocab_size must be an integer of at least {MIN_BPE_VOCAB} for bpe (the 256 bytes "
                              f"and {EOT}), got {vocab_size!r}")
        tk = tokenizers_module()
        from tokenizers import decoders, models, pre_tokenizers, trainers
        tokenizer = tk.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
        return cls(tokenizer, "trained bpe")

    @classmethod
    def from_json(cls, text: str, source: str) -> BPETokenizer:
        """The tokenizer a tokenizer.json's text describes; anything else is a TinynnError naming `source`."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise TinynnError(f"{source} is not a tokenizer.json (not JSON: {e.msg} at line {e.lineno})") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
            raise TinynnError(f"{source} is not a tokenizer.json (no 'model' object)")
        kind = raw["model"].get("type")
        if kind is not None and kind != "BPE":
            raise TinynnError(f"{source} holds a {kind} tokenizer; tinynn reads byte-level BPE (GPT-2's format)")
        if not _mentions_byte_level(raw.get("pre_tokenizer")):
            raise TinynnError(f"{source} is a BPE without byte-level pre-tokenization; tinynn reads byte-level BPE "
                              "(GPT-2's format)")
        tk = tokenizers_module()
        try:
            tokenizer = tk.Tokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise TinynnError(f"{source} is not a tokenizer.json that tokenizers reads "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        missing = [b for b, ch in _bytes_to_unicode().items() if ch not in vocab]
        if missing:  # tokenizers drops a byte it has no token for, silently: the text would lose characters
            raise TinynnError(f"{source} lacks {len(missing)} of the 256 byte tokens (byte {missing[0]} first): "
                              "byte-level BPE must be able to encode any text")
        return cls(tokenizer, source)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def eot_id(self) -> int | None:
        return self.hf.token_to_id(EOT)

    def encode(self, text: str) -> np.ndarray:
        if len(text) <= 65536:
            return np.array(self.hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        return self.encode_pieces(pieces(text, 65536))

    def encode_pieces(self, texts: list[str]) -> np.ndarray:
        """The concatenated ids of texts cut at safe points, encoded in parallel (tokenizers' threads)."""
        encoded = self.hf.encode_batch(texts, add_special_tokens=False)
        return np.array([i for e in encoded for i in e.ids], dtype=np.int64)

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in np.ravel(ids)], skip_special_tokens=False)

    def stream_decoder(self):
        """A function of a few new ids -> the text they complete: a character whose UTF-8 bytes span tokens
        comes out with its last byte (an incremental UTF-8 decoder over the tokens' bytes)."""
        table = self._token_bytes()
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda ids: utf8.decode(b"".join(table[int(i)] for i in np.ravel(ids)))

    def _token_bytes(self) -> list[bytes]:
        """Each id's bytes: its byte-level characters mapped back through GPT-2's table (special tokens: their
        text). Built on first use: a stream decoder needs it, encoding does not."""
        if getattr(self, "_bytes", None) is None:
            inverse = {ch: b for b, ch in _bytes_to_unicode().items()}
            special = {i: t.content for i, t in self.hf.get_added_tokens_decoder().items()}
            self._bytes = []
            for i in range(self.vocab_size):
                token = self.hf.id_to_token(i)
                if i in special or token is None:
                    self._bytes.append((special.get(i) or "").encode("utf-8"))
                else:
                    self._bytes.append(bytes(inverse[ch] for ch in token if ch in inverse))
        return self._bytes

    def to_json(self) -> str:
        return self.hf.to_str()

    def spec(self) -> dict:
        return {"type": "bpe", "json": self.to_json()}

    def same_as(self, other) -> bool:
        """The same ids for every text: the same merges, vocabulary and special tokens."""
        if not isinstance(other, BPETokenizer):
            return False
        mine, theirs = json.loads(self.to_json()), json.loads(other.to_json())
        return all(mine.get(k) == theirs.get(k) for k in ("model", "added_tokens", "pre_tokenizer", "normalizer"))


def _mentions_byte_level(pre_tokenizer) -> bool:
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return True
    return any(_mentions_byte_level(p) for p in pre_tokenizer.get("pretokenizers") or [])


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from the 256 byte values to printable characters (byte-level BPE's token alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def from_spec(spec: dict, source: str = "tokenizer"):
    """The tokenizer a `spec()` describes."""
    if not isinstance(spec, dict) or spec.get("type") not in ("char", "bpe"):
        raise TinynnError(f"{source}: unknown tokenizer {spec!r} (tinynn knows char and bpe)")
    if spec["type"] == "char":
        chars = spec.get("chars")
        if not isinstance(chars, list) or not all(isinstance(c, str) and len(c) == 1 for c in chars) or \
                len(set(chars)) != len(chars):
            raise TinynnError(f"{source}: a char tokenizer's 'chars' must be a list of distinct characters")
        return CharTokenizer.from_itos(chars)
    if not isinstance(spec.get("json"), str):
        raise TinynnError(f"{source}: a bpe tokenizer's 'json' must be the text of a tokenizer.json")
    return BPETokenizer.from_json(spec["json"], source)


def char_json(tok: CharTokenizer) -> str:
    """A char tokenizer as a tokenizer.json that Hugging Face's tokenizers reads: a BPE over the characters
    with no merges and no pre-tokenizer, whose decoder joins the tokens (`from_json` reads it back as char)."""
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": None, "post_processor": None, "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {ch: i for i, ch in enumerate(tok.chars)}, "merges": []}}, ensure_ascii=False)


def from_json(text: str, source: str):
    """The tokenizer a tokenizer.json's text describes: char where it is char_json's shape (no tokenizers
    library needed), else byte-level BPE."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise TinynnError(f"{source} is not a tokenizer.json (not JSON: {e.msg} at line {e.lineno})") from None
    model = raw.get("model") if isinstance(raw, dict) else None
    if isinstance(model, dict) and model.get("type") == "BPE" and model.get("merges") == [] and \
            raw.get("pre_tokenizer") is None and (raw.get("decoder") or {}).get("type") == "Fuse" and \
            isinstance(model.get("vocab"), dict) and all(len(k) == 1 for k in model["vocab"]) and \
            sorted(model["vocab"].values()) == list(range(len(model["vocab"]))) and not raw.get("added_tokens"):
        return CharTokenizer.from_itos(sorted(model["vocab"], key=model["vocab"].get))
    return BPETokenizer.from_json(text, source)


def from_json_file(path):
    path = Path(path)
    if not path.is_file():
        raise not_found("tokenizer file", path)
    try:
        return from_json(path.read_text(encoding="utf-8"), str(path))
    except UnicodeDecodeError:
        raise TinynnError(f"{path} is not a tokenizer.json (not UTF-8 text)") from None


def describe(tokenizer) -> str:
    return f"{tokenizer.kind} tokenizer of {tokenizer.vocab_size:,} tokens"
