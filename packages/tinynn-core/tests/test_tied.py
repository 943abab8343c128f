"""GPT-2's layout (`tie_embeddings`, `head_bias: false`) and a padded vocabulary (`vocab_multiple`) through
everything that holds a model: one parameter for the table and the head, their gradients summed, a training
step on every backend (no NumPy fallback on the GPU, the CPU's losses), checkpoints, resume, generation,
`tinynn generate` and `tinynn export --format hf`, parameter counts, the memory estimate and the bench."""
import json
from pathlib import Path

import numpy as np
import pytest

import tinynn
from tinynn import bench, checkpoint, config, hf, memory, registry
from tinynn.cli import main
from tinynn.errors import TinynnError
from tinynn.model import GPT, GPTConfig, parameter_count
from tinynn.optim import AdamW
from tinynn.tokenizer import CharTokenizer
from tinynn.train_step import TrainStep
from helpers import assert_close

TIED = GPTConfig(vocab_size=61, vocab_multiple=16, block_size=16, n_layer=2, n_head=2, n_embd=16,
                 tie_embeddings=True, head_bias=False)
UNTIED = GPTConfig(**{**TIED.__dict__, "tie_embeddings": False})
CHARS = "".join(chr(48 + i) for i in range(TIED.vocab_size))
RUN = {"data": "data.txt", "out_dir": "run", "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16,
       "batch_size": 4, "max_steps": 6, "warmup_steps": 2, "eval_interval": 3, "eval_steps": 2,
       "checkpoint_interval": 3, "sample_tokens": 10, "sample_prompt": "The ", "tie_embeddings": True,
       "head_bias": False, "vocab_multiple": 16}


def test_a_tied_head_is_the_token_table_counted_once():
    model = GPT(TIED)
    assert model.lm_head.weight is model.wte.weight and model.lm_head.bias is None
    names = [name for name, _ in model.named_parameters()]
    assert "wte.weight" in names and not any(name.startswith("lm_head") for name in names)
    assert sorted(model.state_dict()) == sorted(names)  # a checkpoint holds the table once
    assert parameter_count(TIED) == sum(p.size for p in model.parameters()) == \
        parameter_count(UNTIED) - 64 * 16
    gpt2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, tie_embeddings=True,
                     head_bias=False)
    assert parameter_count(gpt2) == 124_439_808  # GPT-2 small's, as transformers counts it
    assert parameter_count(GPTConfig(**{**gpt2.__dict__, "vocab_multiple": 64})) == 124_439_808 + 47 * 768


def test_the_tables_gradient_is_the_sum_of_its_two_uses(backend, rng):
    """The tied model's gradient of wte is an untied model's gradient of wte plus that of its head, when that
    head holds the same values: the embedding's and the classifier's contributions, added."""
    tinynn.manual_seed(0)
    tied = GPT(TIED).to(backend)
    untied = GPT(UNTIED).to(backend)
    state = tied.state_dict()
    untied.load_state_dict({**state, "lm_head.weight": state["wte.weight"]})
    idx = rng.integers(0, TIED.vocab_size, (2, 9))
    for model in (tied, untied):
        model(idx[:, :-1], idx[:, 1:])[1].backward()
    assert_close(tied.wte.weight.grad.numpy(), untied.wte.weight.grad.numpy() + untied.lm_head.weight.grad.numpy(),
                 rtol=1e-5, atol=1e-7, what="wte gradient")
    assert not tied.wte.weight.grad.numpy()[TIED.vocab_size:].any()  # the padded rows: no token, no gradient


def test_a_tied_training_step_runs_every_op_on_the_backend_and_gives_the_cpus_losses(backend):
    """Three AdamW steps of a narrow GPT with GPT-2's layout and vocabulary (50257 tokens in 50304 rows): no NumPy
    fallback counted on the backend, and the CPU's losses and weights (the padded rows stay zero there too: never
    read, never given a gradient)."""
    gpt2 = GPTConfig(**{**TIED.__dict__, "vocab_size": 50257, "vocab_multiple": 64, "n_layer": 1})
    batch = np.random.default_rng(0).integers(0, gpt2.vocab_size, (4, 17))
    results = {}
    for be in {registry.reference(), backend}:
        tinynn.manual_seed(0)
        model = GPT(gpt2)
        with tinynn.no_grad():
            model.wte.weight.data[gpt2.vocab_size:] = 0  # as a GPT-2 folder's padding is
        model.to(be)
        step = TrainStep(model, AdamW(model.parameters(), lr=1e-2, max_grad_norm=1.0), 4, 16)
        before = dict(be.fallbacks)
        losses = [step(batch[:, :-1], batch[:, 1:], 1e-2).item() for _ in range(3)]
        assert dict(be.fallbacks) == before, f"NumPy fallbacks on {be.name}"
        results[be.name] = losses, model.state_dict()
    losses, state = results[backend.name]
    cpu_losses, cpu_state = results["cpu"]
    assert_close(losses, cpu_losses, rtol=1e-4, what="losses")
    # a hundredth of a step of lr 1e-2: AdamW turns the rounding of gradients near zero into whole steps
    assert_close(state["wte.weight"], cpu_state["wte.weight"], rtol=1e-3, atol=1e-4, what="wte")
    assert not state["wte.weight"][gpt2.vocab_size:].any()


def test_generation_with_a_tied_padded_head_is_the_recompute_and_never_draws_padding(backend):
    tinynn.manual_seed(0)
    model = GPT(TIED).to("cpu")
    for p in model.parameters():  # scaled up: greedy text that varies, logits far apart
        if p.ndim == 2:
            p.backend.write_(p.data, p.numpy() * 20)
    with tinynn.no_grad():  # padded rows that would win every draw, were they sampled
        model.wte.weight.data[TIED.vocab_size:] = model.wte.weight.data[:TIED.vocab_size].max(0) * 100
    model.to(backend)
    prompt = np.array([[1, 2, 3], [40, 50, 60]])
    cached = model.generate(prompt, 30, temperature=0)
    np.testing.assert_array_equal(model.generate(prompt, 30, temperature=0, use_cache=False), cached)
    assert cached.max() < TIED.vocab_size and len(set(cached[0, 3:].tolist())) > 2
    assert model.generate(prompt, 30, temperature=2.0, seed=5).max() < TIED.vocab_size


def test_a_state_dict_of_the_other_layout_is_one_line_naming_it():
    tied, untied = GPT(TIED), GPT(UNTIED)
    with pytest.raises(TinynnError, match=r"^state dict has a head of its own \(lm_head.weight\).*tie_embeddings "
                                          r"false$"):
        tied.load_state_dict(untied.state_dict())
    with pytest.raises(TinynnError, match=r"^state dict has no lm_head.weight.*tie_embeddings true$"):
        untied.load_state_dict(tied.state_dict())


def test_a_tied_run_checkpoints_once_resumes_exactly_and_generates(workdir, backend, capsys):
    """`tinynn train` with GPT-2's layout and a padded table: the checkpoint holds the table once (padded) and the
    model's vocabulary; a run resumed halfway ends with the straight run's bits; `tinynn generate` samples from it;
    a resume with the head untied is refused with the reason."""
    (workdir / "a.json").write_text(json.dumps({**RUN, "out_dir": "a"}))
    (workdir / "b.json").write_text(json.dumps({**RUN, "out_dir": "b"}))
    device = ["--quiet", "--device", backend.name]
    assert main(["train", "--config", "a.json", *device]) == 0
    assert main(["train", "--config", "b.json", "--max-steps", "3", *device]) == 0
    assert main(["train", "--config", "b.json", "--resume", *device]) == 0
    a, b = (checkpoint.load(workdir / run / "ckpt.safetensors") for run in "ab")
    vocab = len(set((workdir / "data.txt").read_text()))
    assert a["vocab_size"] == checkpoint.vocab_size(a) == vocab and vocab % 16
    assert "lm_head.weight" not in a["model"] and "lm_head.bias" not in a["model"]
    assert a["model"]["wte.weight"].shape == (-(-vocab // 16) * 16, 16)
    assert b["step"] == 6 and b["history"] == a["history"]
    for name in a["model"]:
        assert b["model"][name].tobytes() == a["model"][name].tobytes(), name
    capsys.readouterr()
    assert main(["generate", "--checkpoint", "a/ckpt.safetensors", "--prompt", "The ", "--max-new-tokens", "20",
                 "--temperature", "2.0", "--device", backend.name]) == 0
    assert capsys.readouterr().out.startswith("The ")  # every id decodes: no padded row was drawn
    (workdir / "c.json").write_text(json.dumps({**RUN, "out_dir": "b", "tie_embeddings": False, "max_steps": 9}))
    assert main(["train", "--config", "c.json", "--resume", *device]) == 2
    assert "it has tie_embeddings=True, the config says False" in capsys.readouterr().err


def test_a_checkpoint_older_than_the_saved_vocabulary_is_its_tables_rows(tmp_path):
    state = GPT(UNTIED).state_dict()
    checkpoint.save(tmp_path / "old.safetensors", model_state=state, optimizer_state={}, config={}, step=0,
                    rng_state={}, history={}, chars=list(CHARS))
    assert checkpoint.vocab_size(checkpoint.load(tmp_path / "old.safetensors")) == 64


def _gpt2_folder(tmp_path, tied=True):
    """A random GPT-2 folder of TIED's shape (unpadded), written by export."""
    tinynn.manual_seed(1)
    base = GPTConfig(**{**TIED.__dict__, "vocab_multiple": 1, "tie_embeddings": tied})
    state = GPT(base).state_dict()
    hf.export(state, {**base.__dict__}, CharTokenizer(CHARS), tmp_path / "gpt2")
    return tmp_path / "gpt2", state


def test_a_gpt2_folder_loads_tied_and_padded_and_exports_back_bit_for_bit(tmp_path, rng):
    folder, state = _gpt2_folder(tmp_path)
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True
    pretrained = hf.load(folder, vocab_multiple=16)
    assert pretrained.config["tie_embeddings"] and pretrained.config["vocab_multiple"] == 16
    assert "lm_head.weight" not in pretrained.state
    table = pretrained.state["wte.weight"]
    assert table.shape == (64, 16) and not table[61:].any() and table[:61].tobytes() == state["wte.weight"].tobytes()
    padded, plain = hf.build(pretrained), hf.build(hf.load(folder))
    idx = rng.integers(0, 61, (2, 10))
    assert_close(padded(idx)[0].numpy(), plain(idx)[0].numpy(), rtol=0, atol=1e-6, what="logits")
    assert hf.export(padded.state_dict(), {**pretrained.config}, pretrained.tokenizer, tmp_path / "out") == []
    again = hf.load(tmp_path / "out")
    assert sorted(again.state) == sorted(state)
    for name, value in state.items():
        assert again.state[name].tobytes() == value.tobytes(), name
    with pytest.raises(TinynnError, match="wte.weight has 61 rows, the vocabulary 61 padded to a multiple of 16 "
                                          "has 64"):
        hf.export(state, {**pretrained.config}, pretrained.tokenizer, tmp_path / "bad")
    with pytest.raises(TinynnError, match="vocab_multiple must be an integer of at least 1, got 0"):
        hf.load(folder, vocab_multiple=0)


def test_an_untied_gpt2_folder_loads_untied(tmp_path):
    folder, state = _gpt2_folder(tmp_path, tied=False)
    pretrained = hf.load(folder, vocab_multiple=16)
    assert not pretrained.config["tie_embeddings"]
    assert pretrained.state["lm_head.weight"][:61].tobytes() == state["lm_head.weight"].tobytes()
    assert hf.build(pretrained).lm_head.weight is not None


def test_init_from_fine_tunes_tied_and_exports_a_tied_folder(workdir, capsys):
    """--init-from a GPT-2 folder (tied, as GPT-2's) with vocab_multiple: the run's model is tied and padded,
    its checkpoint exports to a tied folder of the folder's vocabulary, which loads back to the run's weights."""
    folder, _ = _gpt2_folder(workdir)
    (workdir / "data.txt").write_text("".join(CHARS[i % 61] for i in range(3000)))
    (workdir / "c.json").write_text(json.dumps({"data": "data.txt", "out_dir": "run", "block_size": 16,
                                                "batch_size": 4, "max_steps": 3, "warmup_steps": 1,
                                                "eval_interval": 3, "eval_steps": 1, "sample_tokens": 5,
                                                "vocab_multiple": 16, "init_from": str(folder)}))
    assert main(["train", "--config", "c.json", "--quiet"]) == 0
    saved = checkpoint.load(workdir / "run" / "ckpt.safetensors")
    assert saved["config"]["tie_embeddings"] and "lm_head.weight" not in saved["model"]
    assert saved["model"]["wte.weight"].shape == (64, 16) and saved["vocab_size"] == 61
    assert not saved["model"]["wte.weight"][61:].any()  # the padding stays zero through fine-tuning
    capsys.readouterr()
    assert main(["export", "--format", "hf", "run/ckpt.safetensors", "hf"]) == 0
    assert "notice" not in capsys.readouterr().err  # nothing untied to say
    written = json.loads((workdir / "hf" / "config.json").read_text())
    assert written["tie_word_embeddings"] is True and written["vocab_size"] == 61
    back = hf.load(workdir / "hf", vocab_multiple=16)
    for name, value in saved["model"].items():
        assert back.state[name].tobytes() == value.tobytes(), name


def test_bench_takes_the_vocabulary_and_head_from_its_config(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8, "batch_size": 2,
                                "tokenizer": "bpe", "vocab_size": 300, "vocab_multiple": 64,
                                "tie_embeddings": True, "head_bias": False}))
    result = bench.bench_train(registry.reference(), config.load(path), steps=1)
    assert result["config"]["vocab_size"] == 300 and result["config"]["padded_vocab_size"] == 320
    assert "n_embd 8, vocab 300 in 320 rows, head tied to wte without bias, batch 2" in \
        bench.describe_config(result["config"])


def test_the_gpt2_bench_config_is_gpt2_small():
    """apps/bench/gpt2.json: GPT-2 small (12 x 768, context 1024) with its vocabulary in 50304 rows, its head the
    token table and without a bias; 124.48 M parameters with the padding."""
    path = Path(__file__).resolve().parents[3] / "apps" / "bench" / "gpt2.json"
    if not path.is_file():
        pytest.skip("apps/ is not beside this test tree")
    cfg = config.load(path)
    description = bench.model_description(cfg)
    assert description == {"block_size": 1024, "n_layer": 12, "n_head": 12, "n_embd": 768, "batch_size": 4,
                           "vocab_size": 50257, "padded_vocab_size": 50304, "tie_embeddings": True,
                           "head_bias": False}
    assert memory.parameter_count(cfg, bench.vocabulary(cfg)) == 124_439_808 + 47 * 768


def test_the_memory_estimate_counts_a_tied_head_once_and_the_padded_logits():
    cfg = config.TrainConfig(n_embd=64, tie_embeddings=True, vocab_multiple=64)
    untied = config.TrainConfig(n_embd=64, vocab_multiple=64)
    assert memory.parameter_count(untied, 1000) - memory.parameter_count(cfg, 1000) == 1024 * 64
    tokens = cfg.batch_size * cfg.block_size
    assert memory.training_bytes(cfg, 1000, 0)["logits"] == memory.FLOAT * memory.LOGIT_COPIES * tokens * 1024
