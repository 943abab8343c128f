"""The embedded corpus, the tokenizer, batches, and config validation."""
import json

import numpy as np
import pytest

from tinynn import config
from tinynn.data import Batches, CharTokenizer, load_text, stdlib_docstrings
from tinynn.errors import TinynnError


def test_embedded_corpus_is_large_deterministic_english():
    text = stdlib_docstrings()
    assert len(text) > 300_000
    assert 60 <= len(set(text)) <= 100
    assert text.count(" the ") > 1000
    stdlib_docstrings.cache_clear()
    assert stdlib_docstrings() == text


def test_tokenizer_roundtrip_and_unknown_characters():
    tok = CharTokenizer("hello world")
    assert tok.vocab_size == 8
    assert tok.decode(tok.encode("low")) == "low"
    with pytest.raises(TinynnError, match="'z'"):
        tok.encode("zero")


def test_batches_are_shifted_and_seeded():
    tokens = np.arange(1000)
    b = Batches(tokens, block_size=16, val_fraction=0.1)
    x, y = b.sample("train", 4, np.random.default_rng(0))
    assert x.shape == y.shape == (4, 16)
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    assert x.max() < 900 and b.sample("val", 2, np.random.default_rng(0))[0].min() >= 900
    np.testing.assert_array_equal(x, b.sample("train", 4, np.random.default_rng(0))[0])
    with pytest.raises(TinynnError, match="block_size"):
        Batches(tokens[:10], block_size=16, val_fraction=0.0)


def test_data_file_errors(tmp_path):
    with pytest.raises(TinynnError, match="not found"):
        load_text(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(TinynnError, match="empty"):
        load_text(str(tmp_path / "empty.txt"))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(TinynnError, match="not UTF-8"):
        load_text(str(tmp_path / "bin.txt"))


@pytest.mark.parametrize("raw,message", [
    ({"n_layers": 2}, "unknown key 'n_layers'"),
    ({"batch_size": "16"}, "'batch_size' must be int"),
    ({"batch_size": 1.5}, "'batch_size' must be int"),
    ({"bias": 1}, "'bias' must be bool"),
    ({"n_embd": 30, "n_head": 4}, "'n_embd' (30) must be divisible by n_head (4)"),
    ({"dropout": 1.0}, "'dropout' must be in [0, 1)"),
    ({"max_steps": 0}, "'max_steps' must be at least 1"),
    ({"min_lr": 1.0, "learning_rate": 0.1}, "'min_lr' must be between"),
    ({"grad_clip": -1}, "'grad_clip' must be positive or null"),
    ([1, 2], "must hold a JSON object"),
    ({"grad_clip": float("nan")}, "'grad_clip' must be a finite number, got nan"),
    ({"weight_decay": float("nan")}, "'weight_decay' must be a finite number"),
    ({"learning_rate": float("inf")}, "'learning_rate' must be a finite number, got inf"),
    ({"learning_rate": float("nan")}, "'learning_rate' must be a finite number"),
    ({"seed": -1}, "'seed' must not be negative"),
    ({"out_dir": " "}, "'out_dir' must not be empty"),
    ({"data": ""}, "'data' must be a path or null, got an empty string"),
    ({"init_from": " "}, "'init_from' must be a path or null"),
    ({"loss_plot": ""}, "'loss_plot' must be a path or null"),
])
def test_config_errors_name_the_key(raw, message, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(TinynnError) as e:
        config.load(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_flags_go_through_the_same_checks_and_are_named(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"max_steps": 10}))
    assert config.load(path, {"--max-steps": ("max_steps", None)}).max_steps == 10  # not given: the file's
    assert config.load(path, {"--max-steps": ("max_steps", 3)}).max_steps == 3
    with pytest.raises(TinynnError) as e:
        config.load(path, {"--max-steps": ("max_steps", 0)})
    assert str(e.value) == "--max-steps must be at least 1, got 0"
    with pytest.raises(TinynnError, match="'learning_rate' must be positive"):
        config.TrainConfig(learning_rate=-1.0).validate()  # what train() runs on a config built in Python


def test_memory_estimate_counts_the_models_parameters():
    from tinynn import memory
    from tinynn.model import GPT
    for bias in (True, False):
        cfg = config.TrainConfig(n_embd=32, n_head=2, n_layer=3, block_size=16, bias=bias)
        model = GPT(cfg.model_config(50))
        assert memory.parameter_count(cfg, 50) == sum(p.size for p in model.parameters())
    with pytest.raises(TinynnError, match=r"needs about .* GiB .* only 0.00 GiB of host memory is available"):
        memory.check(config.TrainConfig(), vocab_size=96, n_tokens=1000, available=1000)
    assert set(memory.training_bytes(config.TrainConfig(), 96, 1000, on_device=True)) == {
        "parameters, gradients and AdamW state", "token ids"}  # activations and logits live on the GPU


def test_config_file_errors_and_defaults(tmp_path):
    with pytest.raises(TinynnError, match="config file not found"):
        config.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"n_layer": 2,,}')
    with pytest.raises(TinynnError, match="not valid JSON .* line 1"):
        config.load(tmp_path / "bad.json")
    (tmp_path / "ok.json").write_text('{"learning_rate": 1, "grad_clip": null}')
    cfg = config.load(tmp_path / "ok.json")
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float) and cfg.grad_clip is None


def test_shipped_app_configs_are_valid():
    from pathlib import Path
    apps = Path(__file__).resolve().parents[3] / "apps"
    if not apps.is_dir():
        pytest.skip("apps/ is not beside this test tree")
    for path in apps.glob("*/*.json"):
        config.load(path)
    from tinynn import bench
    for lesson in ("chargpt/lesson.json", "bench/lesson.json"):  # bench's default times the lesson's scale
        cfg = config.load(apps / lesson)
        assert {key: getattr(cfg, key) for key in bench.LESSON} == bench.LESSON, lesson


def test_a_checkpoints_config_is_flat_and_loads_back():
    """The config a checkpoint stores (to_dict) keeps its flat keys, the model's among them, so checkpoints of
    every version load (`tinynn generate`, resume); and the model fields are the GPT's, checked once."""
    from tinynn.model import GPT, GPTConfig
    saved = config.to_dict(config.TrainConfig(n_layer=3, n_head=4, n_embd=32, block_size=16, dropout=0.1))
    assert set(saved) == {
        "data", "val_fraction", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "batch_size",
        "grad_accum_steps", "max_steps", "learning_rate", "min_lr", "warmup_steps", "weight_decay", "beta1",
        "beta2", "grad_clip", "seed", "eval_interval", "eval_steps", "checkpoint_interval", "out_dir",
        "sample_tokens", "sample_prompt", "loss_plot", "tokenizer", "vocab_size", "init_from", "head_bias",
        "tie_embeddings", "vocab_multiple", "matmul_precision"}
    cfg = config.from_dict(json.loads(json.dumps(saved)), "checkpoint")
    assert config.to_dict(cfg) == saved
    assert cfg.model_config(50) == GPTConfig(vocab_size=50, block_size=16, n_layer=3, n_head=4, n_embd=32,
                                             dropout=0.1)
    with pytest.raises(TinynnError, match=r"^n_embd \(30\) must be divisible by n_head \(4\)$"):
        GPT(GPTConfig(vocab_size=5, n_embd=30, n_head=4))


def test_a_key_given_twice_is_refused(tmp_path):
    """JSON keeps the last of two equal keys: a config that sets learning_rate twice would train on one of them."""
    path = tmp_path / "c.json"
    path.write_text('{"learning_rate": 0.01, "max_steps": 5, "learning_rate": 0.001}')
    with pytest.raises(TinynnError) as e:
        config.load(path)
    assert str(e.value) == f"{path}: key 'learning_rate' is given twice"


def test_a_byte_order_mark_is_not_text(tmp_path):
    """Some editors begin a UTF-8 file with a byte-order mark: it is neither a config's JSON nor a token."""
    (tmp_path / "c.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"max_steps": 5}).encode())
    assert config.load(tmp_path / "c.json").max_steps == 5
    (tmp_path / "d.txt").write_bytes(b"\xef\xbb\xbfhello world")
    assert load_text(str(tmp_path / "d.txt")) == "hello world"
    assert "\ufeff" not in CharTokenizer(load_text(str(tmp_path / "d.txt"))).chars


def test_out_dir_moves_a_loss_plot_kept_in_the_configs_out_dir(tmp_path, monkeypatch):
    """Two runs of one config in two out_dirs must not write one plot."""
    import warnings
    path = tmp_path / "c.json"
    flags = {"--out-dir": ("out_dir", "runs/b")}
    path.write_text(json.dumps({"out_dir": "out/a", "loss_plot": "out/a/plots/loss.png"}))
    assert config.load(path, flags).loss_plot == "runs/b/plots/loss.png"
    assert config.load(path).loss_plot == "out/a/plots/loss.png"
    path.write_text(json.dumps({"loss_plot": "./out/loss.svg"}))  # out_dir's default, "out"
    assert config.load(path, flags).loss_plot == "runs/b/loss.svg"
    path.write_text(json.dumps({"out_dir": "out/a", "loss_plot": "plots/loss.png"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert config.load(path, flags).loss_plot == "plots/loss.png"
    assert [str(w.message) for w in caught] == [
        "loss_plot 'plots/loss.png' is outside out_dir 'out/a', so --out-dir does not move it: runs of this config "
        "write one plot"]


def test_a_long_bad_value_is_cut_in_the_error(tmp_path):
    """A damaged checkpoint's config can hold a key or value kilobytes long: the error stays one short line."""
    raw = {"data": ["x" * 2000], ("y" * 2000): 1}
    for key in raw:
        with pytest.raises(TinynnError) as e:
            config.from_dict({key: raw[key]}, "checkpoint c.safetensors")
        assert len(str(e.value)) < 300 and "checkpoint c.safetensors" in str(e.value), str(e.value)
