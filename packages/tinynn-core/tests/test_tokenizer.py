"""Tokenizers: char and byte-level BPE round trips, streaming cuts that keep BPE's ids, specs, tokenizer.json
reading (and refusing what is not one), and the message when the bpe extra is missing."""
import json
import re
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinynn import tokenizer as tk
from tinynn.data import stdlib_docstrings
from tinynn.errors import TinynnError
from tinynn.tokenizer import BPETokenizer, CharTokenizer, pieces

# whitespace runs of every kind, digits, punctuation, contractions and characters of 2, 3 and 4 UTF-8 bytes:
# what GPT-2's pre-tokenizer splits on
TRICKY = st.lists(st.sampled_from(list("ab ZxY19'.,!?-\n\t\ré日🙂\x1c\xa0\u2028") +
                                  ["  ", "\n\n", "'s", " \n", "the ", " x"]), max_size=150).map("".join)


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(pieces(stdlib_docstrings()[:150_000], 8192) + ["é日🙂 \n\n\t"], vocab_size=400)


def test_char_tokenizer_encodes_like_its_index(rng):
    text = "".join(rng.choice(list("hello world\n日é"), size=500))
    tok = CharTokenizer(text)
    np.testing.assert_array_equal(tok.encode(text), [tok.index[c] for c in text])
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(TinynnError, match="'iquz'"):
        tok.encode("quiz")
    # from_itos keeps the given order (nanoGPT's itos need not be sorted)
    odd = CharTokenizer.from_itos(["b", "a", "\n"])
    np.testing.assert_array_equal(odd.encode("ab\n"), [1, 0, 2])
    assert tk.from_spec(odd.spec()).chars == ["b", "a", "\n"]


def test_bpe_round_trips_any_text_and_counts_its_vocabulary(bpe):
    assert bpe.vocab_size == 400 and bpe.eot_id is not None
    text = "Return the value of x.\n\n  Indented\té日🙂 ok"
    ids = bpe.encode(text)
    assert ids.dtype == np.int64 and len(ids) < len(text.encode())  # merges happened
    assert bpe.decode(ids) == text
    assert tk.from_spec(bpe.spec()).encode(text).tolist() == ids.tolist()
    with pytest.raises(TinynnError, match="vocab_size must be an integer of at least 257"):
        BPETokenizer.train(["abc"], vocab_size=100)


@settings(max_examples=150, deadline=None)
@given(text=TRICKY, size=st.integers(1, 40))
def test_pieces_keep_bpe_ids(bpe, text, size):
    cut = pieces(text, size)
    assert "".join(cut) == text
    whole = np.array(bpe.hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    np.testing.assert_array_equal(bpe.encode_pieces(cut), whole)


@settings(max_examples=60, deadline=None)
@given(text=TRICKY)
def test_stream_decoder_gives_the_text_one_token_at_a_time(bpe, text):
    decode = bpe.stream_decoder()
    assert "".join(decode([i]) for i in bpe.encode(text)) == text


def test_long_text_is_encoded_in_parallel_pieces_with_the_same_ids(bpe):
    text = stdlib_docstrings()[:200_000]
    np.testing.assert_array_equal(bpe.encode(text), bpe.hf.encode(text, add_special_tokens=False).ids)


def test_tokenizer_json_round_trip_and_refusals(bpe, tmp_path):
    good = tmp_path / "tokenizer.json"
    bpe.hf.save(str(good))
    assert tk.from_json_file(good).encode("some text").tolist() == bpe.encode("some text").tolist()
    cases = {
        "not json {": "not a tokenizer.json (not JSON",
        json.dumps({"vocab": {}}): "no 'model' object",
        json.dumps({"model": {"type": "WordPiece", "vocab": {}}}): "holds a WordPiece tokenizer",
        json.dumps({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}}):
            "without byte-level pre-tokenization",
        json.dumps({"model": {"type": "BPE", "vocab": "x"}, "pre_tokenizer": {"type": "ByteLevel"}}):
            "not a tokenizer.json that tokenizers reads",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(TinynnError, match=re.escape(message)) as e:
            tk.from_json_file(bad)
        assert "\n" not in str(e.value) and str(bad) in str(e.value)
    with pytest.raises(TinynnError, match="tokenizer file not found"):
        tk.from_json_file(tmp_path / "missing.json")


def test_a_tokenizer_json_without_every_byte_is_refused(bpe, tmp_path):
    """tokenizers drops a byte its vocabulary lacks without a word: training text would lose characters."""
    raw = json.loads(bpe.to_json())
    del raw["model"]["vocab"]["h"]
    raw["model"]["merges"] = [m for m in raw["model"]["merges"] if "h" not in (m if isinstance(m, list) else m.split())]
    bad = tmp_path / "no-h.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(TinynnError, match=rf"^{re.escape(str(bad))} lacks 1 of the 256 byte tokens \(byte 104"):
        tk.from_json_file(bad)


def test_char_tokenizer_as_tokenizer_json(tmp_path):
    """char_json is a file Hugging Face's tokenizers reads with the same ids, and that tinynn reads back as char."""
    tok = CharTokenizer("hello world\n日")
    text = tk.char_json(tok)
    from tokenizers import Tokenizer
    theirs = Tokenizer.from_str(text)
    assert theirs.encode("world 日\n").ids == tok.encode("world 日\n").tolist()
    assert theirs.decode(tok.encode("hello").tolist()) == "hello"
    back = tk.from_json(text, "char.json")
    assert isinstance(back, CharTokenizer) and back.chars == tok.chars


def test_bpe_without_the_extra_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now raises ImportError
    with pytest.raises(TinynnError, match=r"pip install 'tinynn-core\[bpe\]'"):
        BPETokenizer.train(["some text"], vocab_size=300)


def test_spec_refusals():
    with pytest.raises(TinynnError, match="unknown tokenizer"):
        tk.from_spec({"type": "wordpiece"}, "ckpt")
    with pytest.raises(TinynnError, match="distinct characters"):
        tk.from_spec({"type": "char", "chars": ["a", "a"]}, "ckpt")
