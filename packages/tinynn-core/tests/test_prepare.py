"""tinynn prepare and token folders: streamed files equal to the whole text's tokens, nanoGPT's layouts read,
memory-mapped seeded batches, and one-line errors for corrupt or foreign files."""
import json
import pickle
import re

import numpy as np
import pytest

from tinynn.data import Batches, TokenFolder, is_token_folder, stdlib_docstrings
from tinynn.errors import TinynnError
from tinynn.prepare import prepare
from tinynn.tokenizer import BPETokenizer, CharTokenizer, pieces

TEXT = "Return the value.\n\n  Indented line\twith a tab.\nÉté 日本 🙂 ok\n" * 40


def _one_line(e):
    assert "\n" not in str(e.value)
    return str(e.value)


def test_char_folder_holds_the_texts_tokens_split_as_training_would(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    meta = prepare(str(tmp_path / "a.txt"), str(tmp_path / "out"), val_fraction=0.1, progress=False,
                   chunk_bytes=97)  # small chunks: multi-byte characters and cuts across reads
    folder = TokenFolder(tmp_path / "out")
    tok = CharTokenizer(TEXT)
    assert folder.tokenizer.chars == tok.chars and meta["dtype"] == "uint16"
    expected = Batches(tok.encode(TEXT), 8, 0.1)
    np.testing.assert_array_equal(folder.train, expected.train)
    np.testing.assert_array_equal(folder.val, expected.val)
    assert isinstance(folder.train, np.memmap)  # mapped, not read
    with open(tmp_path / "out" / "meta.pkl", "rb") as f:  # nanoGPT's sample.py reads this
        nanogpt = pickle.load(f)
    assert nanogpt["vocab_size"] == tok.vocab_size and nanogpt["itos"][3] == tok.chars[3]


def test_same_seed_same_batches_from_the_folder_and_from_memory(tmp_path, rng):
    prepare(None, str(tmp_path / "out"), progress=False)  # the built-in corpus
    text = stdlib_docstrings()
    memory = Batches(CharTokenizer(text).encode(text), 32, 0.1)
    mapped = TokenFolder(tmp_path / "out").batches(32)
    seed = int(rng.integers(1 << 30))
    for split in ("train", "val"):
        a = memory.sample(split, 8, np.random.default_rng(seed))
        b = mapped.sample(split, 8, np.random.default_rng(seed))
        for x, y in zip(a, b):
            assert y.dtype == np.int64 and y.flags.c_contiguous
            np.testing.assert_array_equal(x, y)


def test_bpe_folder_of_files_streams_to_the_ids_of_each_file(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "b.txt").write_text(TEXT[:900])
    (corpus / "sub" / "a.txt").write_text(TEXT[300:])
    (corpus / ".hidden").write_text("skipped")
    meta = prepare(str(corpus), str(tmp_path / "out"), tokenizer="bpe", vocab_size=300, val_fraction=0.0,
                   progress=False, chunk_bytes=64)
    folder = TokenFolder(tmp_path / "out")
    tok = folder.tokenizer
    assert isinstance(tok, BPETokenizer) and meta["tokenizer"] == {"type": "bpe", "file": "tokenizer.json"}
    # sorted order (b.txt before sub/a.txt), each file's own ids, the end-of-text token between them
    expected = np.concatenate([tok.encode(TEXT[:900]), [tok.eot_id], tok.encode(TEXT[300:])])
    np.testing.assert_array_equal(folder.train, expected)
    assert len(folder.val) == 0 and tok.decode(folder.train).count("skipped") == 0

    (tmp_path / "out" / "tokenizer.json").write_text('{"vocab": {}}')  # a fault in it names it, not meta.json
    with pytest.raises(TinynnError, match=rf"^{re.escape(str(tmp_path / 'out' / 'tokenizer.json'))} is not a "):
        TokenFolder(tmp_path / "out")


def test_prepare_with_a_tokenizer_json_and_a_vocabulary_past_uint16(tmp_path):
    bpe = BPETokenizer.train(pieces(TEXT, 100), vocab_size=300)
    bpe.hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "a.txt").write_text(TEXT)
    prepare(str(tmp_path / "a.txt"), str(tmp_path / "out"), tokenizer=str(tmp_path / "tokenizer.json"),
            val_fraction=0.0, progress=False)
    np.testing.assert_array_equal(TokenFolder(tmp_path / "out").train, bpe.encode(TEXT))
    wide = "".join(chr(0x10000 + i) for i in range(70_000))  # 70,000 distinct characters: ids past 65535
    (tmp_path / "wide.txt").write_text(wide + wide[::-1])
    meta = prepare(str(tmp_path / "wide.txt"), str(tmp_path / "wide"), val_fraction=0.5, progress=False)
    folder = TokenFolder(tmp_path / "wide")
    assert meta["dtype"] == "uint32" and folder.train.dtype == np.uint32
    assert folder.tokenizer.decode(np.concatenate([folder.train, folder.val])) == wide + wide[::-1]


def test_prepare_refusals(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    prepare(str(tmp_path / "a.txt"), str(tmp_path / "out"), progress=False)
    before = (tmp_path / "out" / "train.bin").read_bytes()
    with pytest.raises(TinynnError, match="already holds train.bin: use --overwrite") as e:
        prepare(str(tmp_path / "a.txt"), str(tmp_path / "out"), progress=False)
    _one_line(e)
    assert (tmp_path / "out" / "train.bin").read_bytes() == before  # nothing saved is lost
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 ok".encode("latin-1"))
    with pytest.raises(TinynnError, match=r"latin1.txt is not UTF-8 text \(invalid continuation byte at byte 3\)"):
        prepare(str(tmp_path / "latin1.txt"), str(tmp_path / "o2"), progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TinynnError, match="has no files"):
        prepare(str(tmp_path / "empty"), str(tmp_path / "o3"), progress=False)
    with pytest.raises(TinynnError, match="needs --vocab-size"):
        prepare(str(tmp_path / "a.txt"), str(tmp_path / "o4"), tokenizer="bpe", progress=False)
    with pytest.raises(TinynnError, match="must be char, bpe or the path of a tokenizer.json"):
        prepare(str(tmp_path / "a.txt"), str(tmp_path / "o5"), tokenizer="wordpiece", progress=False)
    assert not any((tmp_path / name).exists() for name in ("o2", "o3", "o4", "o5"))


def test_nanogpt_folders_read(tmp_path):
    """nanoGPT's shakespeare_char (meta.pkl, uint16) and openwebtext (no meta: GPT-2 ids, uint16) layouts."""
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in TEXT], dtype=np.uint16)
    char_dir = tmp_path / "char"
    char_dir.mkdir()
    ids[:1000].tofile(char_dir / "train.bin")
    ids[1000:].tofile(char_dir / "val.bin")
    with open(char_dir / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    assert is_token_folder(char_dir)
    folder = TokenFolder(char_dir)
    assert folder.tokenizer.decode(folder.train) == TEXT[:1000]
    gpt2_dir = tmp_path / "gpt2"
    gpt2_dir.mkdir()
    np.arange(100, dtype=np.uint16).tofile(gpt2_dir / "train.bin")
    np.arange(10, dtype=np.uint16).tofile(gpt2_dir / "val.bin")
    folder = TokenFolder(gpt2_dir)
    assert folder.tokenizer is None and folder.train.dtype == np.uint16 and folder.train[99] == 99


class _Evil:
    def __reduce__(self):
        return (print, ("ran",))


def test_corrupt_and_foreign_token_folders(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    out = tmp_path / "out"
    prepare(str(tmp_path / "a.txt"), str(out), progress=False)
    data = (out / "train.bin").read_bytes()
    (out / "train.bin").write_bytes(data[:-1])
    with pytest.raises(TinynnError, match=r"train.bin is truncated: \d+ bytes is not a whole number of uint16"):
        TokenFolder(out)
    (out / "train.bin").write_bytes(data[:-2])
    with pytest.raises(TinynnError, match="train.bin holds .* tokens, meta.json says .*: it was truncated"):
        TokenFolder(out)
    (out / "train.bin").write_bytes(data)
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "dtype": "int8"}))
    with pytest.raises(TinynnError, match="dtype must be uint16 or uint32"):
        TokenFolder(out)
    (out / "meta.json").write_text("{")
    with pytest.raises(TinynnError, match="meta.json is not valid JSON"):
        TokenFolder(out)
    # token ids from a larger vocabulary than the folder's tokenizer
    (out / "meta.json").write_text(json.dumps(meta))
    foreign = np.full(len(data) // 2, 200, np.uint16)
    foreign.tofile(out / "train.bin")
    with pytest.raises(TinynnError, match="holds token id 200 in its train tokens, outside the vocabulary of"):
        TokenFolder(out).batches(8).sample("train", 2, np.random.default_rng(0))
    # a meta.pkl that would run code when unpickled is refused, not run
    (out / "meta.json").unlink()
    with open(out / "meta.pkl", "wb") as f:
        pickle.dump(_Evil(), f)
    with pytest.raises(TinynnError, match="is not nanoGPT's meta.pkl .*names builtins.print"):
        TokenFolder(out)
    for name in ("train.bin", "meta.pkl"):
        (out / name).unlink()
    with pytest.raises(TinynnError, match="train.bin not found"):
        TokenFolder(out)


def test_training_data_picks_the_tokenizer_and_refuses_one_that_does_not_fit(tmp_path):
    from tinynn.data import training_data
    (tmp_path / "a.txt").write_text(TEXT)
    text = str(tmp_path / "a.txt")
    bpe = training_data(text, "bpe", 300, 8, 0.1)
    assert isinstance(bpe.tokenizer, BPETokenizer) and bpe.in_memory == len(bpe.tokenizer.encode(TEXT))
    with pytest.raises(TinynnError, match="tokenizer 'bpe' needs a vocab_size"):
        training_data(text, "bpe", None, 8, 0.1)
    prepare(text, str(tmp_path / "chars"), progress=False)
    folder = training_data(str(tmp_path / "chars"), None, None, 8, 0.1)
    assert isinstance(folder.tokenizer, CharTokenizer) and folder.in_memory == 0
    assert isinstance(folder.batches.train, np.memmap)
    with pytest.raises(TinynnError, match="tokenizer is 'bpe', but data .* was prepared with a char tokenizer"):
        training_data(str(tmp_path / "chars"), "bpe", None, 8, 0.1)
    # a checkpoint's (or GPT-2 folder's) tokenizer and the data's meta disagree: one line naming both
    with pytest.raises(TinynnError, match=r"prepared with a char tokenizer of \d+ tokens, checkpoint c.safetensors "
                                          r"has a bpe tokenizer of 300 tokens") as e:
        training_data(str(tmp_path / "chars"), None, None, 8, 0.1, fixed=bpe.tokenizer,
                      fixed_source="checkpoint c.safetensors")
    _one_line(e)
    gpt2 = tmp_path / "gpt2"  # nanoGPT's GPT-2 layout: ids and no meta
    gpt2.mkdir()
    bpe.tokenizer.encode(TEXT).astype(np.uint16).tofile(gpt2 / "train.bin")
    np.zeros(0, np.uint16).tofile(gpt2 / "val.bin")
    with pytest.raises(TinynnError, match="has no meta.json or meta.pkl: .*tokenizer.json must then be given"):
        training_data(str(gpt2), None, None, 8, 0.1)
    bpe.tokenizer.hf.save(str(tmp_path / "tokenizer.json"))
    given = training_data(str(gpt2), str(tmp_path / "tokenizer.json"), None, 8, 0.1)
    assert given.tokenizer.decode(given.batches.train) == TEXT
