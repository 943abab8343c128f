"""The data and interop commands end to end: tinynn prepare, training on a token folder (BPE) and on a text
file with a BPE, fine-tuning from a GPT-2 folder (--init-from), generating from one, tinynn export --format hf,
and their one-line errors. (transformers itself is checked in tests/interop.)"""
import json

import numpy as np
import pytest

from test_distributed import mpiexec  # noqa: F401 (a fixture)
from tinynn import checkpoint, hf
from tinynn.cli import main
from tinynn.tokenizer import BPETokenizer

TINY = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "batch_size": 4, "max_steps": 4,
        "warmup_steps": 1, "eval_interval": 2, "eval_steps": 1, "checkpoint_interval": 2, "sample_tokens": 10,
        "sample_prompt": "The "}
TEXT = "The quick brown fox jumps over the lazy dog. Über naïve café! " * 60


def _config(path, **overrides):
    path.write_text(json.dumps({**TINY, "out_dir": "run", **overrides}))
    return str(path)


def _error(capsys):
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("tinynn: notice:")]
    assert len(err) == 1 and err[0].startswith("tinynn: error: "), err
    return err[0]


def test_prepare_train_generate_export_with_bpe(workdir, capsys):
    assert main(["prepare", "data.txt", "--out", "tokens", "--tokenizer", "bpe", "--vocab-size", "300",
                 "--quiet"]) == 0
    assert "a bpe tokenizer of 300 tokens" in capsys.readouterr().out
    assert main(["train", "--config", _config(workdir / "c.json", data="tokens", bias=False), "--quiet"]) == 0
    assert "sample:\nThe " in capsys.readouterr().out
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert saved["tokenizer"]["type"] == "bpe" and saved["model"]["wte.weight"].shape[0] == 300
    assert main(["generate", "--checkpoint", "run/ckpt.safetensors", "--prompt", "Über", "--max-new-tokens", "8",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Über")
    assert main(["export", "--format", "hf", "run/ckpt.safetensors", "hf"]) == 0
    captured = capsys.readouterr()
    assert "wrote hf" in captured.out and "untied" in captured.err
    assert hf.load(workdir / "hf").state["lm_head.weight"].tobytes() == saved["model"]["lm_head.weight"].tobytes()


def test_bpe_trained_on_a_text_file_by_the_run(workdir, capsys):
    cfg = _config(workdir / "c.json", data="data.txt", tokenizer="bpe", vocab_size=280)
    assert main(["train", "--config", cfg, "--quiet"]) == 0
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert saved["tokenizer"]["type"] == "bpe" and saved["model"]["wte.weight"].shape == (280, 16)
    # resuming on data prepared with another tokenizer: one line naming both
    assert main(["prepare", "data.txt", "--out", "chars", "--quiet"]) == 0
    capsys.readouterr()
    cfg = _config(workdir / "c.json", data="chars", max_steps=6)
    assert main(["train", "--config", cfg, "--resume", "--quiet"]) == 2
    assert "was prepared with a char tokenizer" in _error(capsys)


def test_fine_tune_from_and_generate_from_a_gpt2_folder(workdir, capsys):
    tok = BPETokenizer.train([TEXT], vocab_size=290)
    config = {"vocab_size": 290, "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.0,
              "bias": True}
    draw = np.random.default_rng(0)
    state = {k: draw.normal(0, 0.1, v).astype(np.float32) for k, v in hf.expected_shapes(config).items()
             if k != "lm_head.bias"}
    state["lm_head.weight"] = state["wte.weight"].copy()
    hf.export(state, config, tok, workdir / "gpt2")
    assert main(["generate", "--checkpoint", "gpt2", "--prompt", "The", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("The")
    cfg = _config(workdir / "c.json", data="data.txt", n_layer=3)
    assert main(["train", "--config", cfg, "--init-from", "gpt2", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "n_layer" in captured.err  # the folder's shape wins, and the notice says so
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert saved["config"]["n_layer"] == 1 and saved["model"]["wpe.weight"].shape == (16, 16)  # cropped to 16
    assert "lm_head.bias" not in saved["model"]  # GPT-2's head has none, and fine-tuning adds none
    assert main(["export", "--format", "hf", "run/ckpt.safetensors", "out"]) == 0
    again = hf.load(workdir / "out")
    for name, value in saved["model"].items():
        assert again.state[name].tobytes() == value.tobytes(), name
    capsys.readouterr()
    (workdir / "gpt2" / "tokenizer.json").unlink()  # ids with no tokenizer to read them: refused, not guessed
    assert main(["train", "--config", cfg, "--init-from", "gpt2", "--overwrite", "--quiet"]) == 2
    assert "GPT-2 folder gpt2 has no tokenizer.json" in _error(capsys)


@pytest.mark.parametrize("args,message", [
    (["prepare", "missing.txt", "--out", "x"], "data not found: missing.txt"),
    (["prepare", "data.txt", "--out", "x", "--tokenizer", "bpe"], "needs --vocab-size"),
    (["export", "--format", "hf", "nothing.safetensors", "x"], "checkpoint not found"),
    (["generate", "--checkpoint", "data.txt"], "is corrupt or not a safetensors file"),
])
def test_errors_are_one_line(workdir, capsys, args, message):
    assert main(args) == 2
    assert message in _error(capsys)


def test_config_keys_for_data_are_checked(workdir, capsys):
    cfg = _config(workdir / "c.json", data="data.txt", tokenizer="wordpiece")
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    assert "'tokenizer' must be char, bpe or the path of a tokenizer.json" in _error(capsys)
    cfg = _config(workdir / "c.json", data="data.txt", vocab_size=300)
    assert main(["train", "--config", cfg, "--quiet"]) == 2
    assert "'vocab_size' is for tokenizer 'bpe'" in _error(capsys)
    (workdir / "gpt2").mkdir()
    (workdir / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "activation_function": "relu"}))
    cfg = _config(workdir / "c.json", data="data.txt")
    assert main(["train", "--config", cfg, "--init-from", "gpt2", "--quiet"]) == 2
    assert "gpt2/config.json: 'vocab_size' must be a positive integer, got None" in _error(capsys)


def test_a_prepared_folder_trains_exactly_as_its_text(workdir, backend):
    """Same tokens, same split, same seeded batches: a char folder and its text give the same run on every backend."""
    from tinynn.config import from_dict
    from tinynn.prepare import prepare
    from tinynn.train import train
    prepare("data.txt", "tokens", progress=False)
    common = {**TINY, "max_steps": 6, "sample_prompt": ""}
    text = train(from_dict({**common, "data": "data.txt", "out_dir": "a"}), device=backend, progress=False)
    folder = train(from_dict({**common, "data": "tokens", "out_dir": "b"}), device=backend, progress=False)
    assert text.history == folder.history and text.sample == folder.sample


def test_two_ranks_draw_the_folders_batches_as_one_process(workdir, mpiexec, backend):
    from test_distributed import CONFIG, launch
    from tinynn.config import from_dict
    from tinynn.train import train
    assert main(["prepare", "data.txt", "--out", "tokens", "--tokenizer", "bpe", "--vocab-size", "300",
                 "--quiet"]) == 0
    config = {**CONFIG, "data": "tokens", "max_steps": 6, "eval_interval": 3}
    (workdir / "dp.json").write_text(json.dumps({**config, "out_dir": "dp"}))
    done = launch(mpiexec, 2, "train", "--config", "dp.json", "--quiet", "--device",
                  "gpu" if backend.is_gpu else "cpu")
    assert done.returncode == 0, done.stderr
    parallel = checkpoint.load(workdir / "dp" / "ckpt.safetensors")
    single = train(from_dict({**config, "grad_accum_steps": 1, "out_dir": "single"}), device=backend,
                   progress=False)
    np.testing.assert_allclose(parallel["history"]["train_loss"], single.history["train_loss"], rtol=1e-5)
