"""tinynn and transformers on the same GPT-2: a random GPT2LMHeadModel (2 layers, width 64, with a BPE trained
here) loads in tinynn (tied, as GPT-2's head is) with the same logits and greedy tokens; export and load again
keeps every bit; a model trained by tinynn (untied, or fine-tuned tied in a padded table), exported, loads in
transformers with the same logits; the PyTorch reference bench builds tinynn's models. Runs once per backend
(conftest)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from helpers import assert_close
from tinynn import bench, checkpoint, config, hf, memory
from tinynn.config import TrainConfig
from tinynn.data import stdlib_docstrings
from tinynn.tokenizer import BPETokenizer, pieces
from tinynn.train import train

RTOL = 1e-5  # relative to the largest logit: float32 sums in another order


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(pieces(stdlib_docstrings()[:200_000], 8192), vocab_size=512)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory, bpe):
    """A GPT2LMHeadModel with every parameter drawn at random (biases and LayerNorms too, so a misplaced one
    shows), saved with save_pretrained beside the BPE's tokenizer.json."""
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=bpe.vocab_size, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=bpe.eot_id, eos_token_id=bpe.eot_id)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("ln_1.weight") or "ln_" in name and
                    name.endswith("weight") else 0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    bpe.hf.save(str(folder / "tokenizer.json"))
    return folder, model


def _tokens(bpe, text="The quick brown fox returns the value of"):
    return bpe.encode(text)


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)[None]).logits[0].numpy()


def _tinynn_logits(model, ids):
    logits, _ = model(np.asarray(ids)[None])
    return logits.numpy()[0]


def test_gpt2_folder_loads_with_equal_logits_and_greedy_tokens(gpt2_folder, bpe, backend):
    folder, reference = gpt2_folder
    pretrained = hf.load(folder)
    assert pretrained.tokenizer.to_json() == bpe.to_json()
    model = hf.build(pretrained).to(backend).eval()
    ids = _tokens(bpe)
    expected = _hf_logits(reference, ids)
    assert_close(_tinynn_logits(model, ids), expected, rtol=0, atol=RTOL * np.abs(expected).max(), what="logits")
    with torch.no_grad():
        theirs = reference.generate(torch.tensor(ids)[None], max_new_tokens=20, do_sample=False,
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    pad_token_id=bpe.eot_id)[0].numpy()
    ours = model.generate(ids[None], 20, temperature=0.0)[0]
    np.testing.assert_array_equal(ours, theirs)


def test_export_then_load_is_bit_identical(gpt2_folder, tmp_path):
    folder, reference = gpt2_folder
    pretrained = hf.load(folder)
    notes = hf.export(pretrained.state, pretrained.config, pretrained.tokenizer, tmp_path / "out")
    assert notes == [] and pretrained.config["tie_embeddings"]  # tied, as it came
    again = hf.load(tmp_path / "out")
    assert sorted(again.state) == sorted(pretrained.state)
    for name, value in pretrained.state.items():
        assert again.state[name].tobytes() == value.tobytes(), name
    exported = GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    theirs = dict(reference.named_parameters())
    for name, p in exported.named_parameters():
        assert torch.equal(p, theirs[name]), name


def test_tinynn_trained_checkpoint_exports_to_transformers(tmp_path, bpe):
    text = tmp_path / "text.txt"
    text.write_text(stdlib_docstrings()[:100_000])
    cfg = TrainConfig(data=str(text), block_size=32, n_layer=2, n_head=4, n_embd=64, bias=False, batch_size=4,
                      max_steps=5, warmup_steps=1, eval_interval=5, eval_steps=1, out_dir=str(tmp_path / "run"),
                      sample_tokens=5)
    result = train(cfg, device="cpu", progress=False)
    saved = checkpoint.load(result.checkpoint)
    notes = hf.export_checkpoint(result.checkpoint, tmp_path / "hf")
    assert any("untied" in n for n in notes) and any("zeros" in n for n in notes)
    exported = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids = np.arange(20) % saved["model"]["wte.weight"].shape[0]
    expected = _tinynn_logits(result.model.to("cpu").eval(), ids)
    assert_close(_hf_logits(exported, ids), expected, rtol=0, atol=RTOL * np.abs(expected).max(), what="logits")


def test_fine_tuned_gpt2_exports_to_transformers_with_equal_logits(gpt2_folder, bpe, tmp_path):
    """--init-from the folder into a padded table (vocab_multiple), a few steps (the head stays wte and keeps no
    bias), export: transformers reads a tied head of the folder's vocabulary and every bias, and computes
    tinynn's logits."""
    folder, _ = gpt2_folder
    text = tmp_path / "text.txt"
    text.write_text(stdlib_docstrings()[:50_000])
    cfg = TrainConfig(data=str(text), init_from=str(folder), n_head=4, block_size=32, batch_size=4, max_steps=3,
                      warmup_steps=1, eval_interval=3, eval_steps=1, out_dir=str(tmp_path / "run"), sample_tokens=5,
                      vocab_multiple=100)
    result = train(cfg, device="cpu", progress=False)
    assert result.model.wte.weight.shape[0] == 600 and result.model.lm_head.weight is result.model.wte.weight
    notes = hf.export_checkpoint(result.checkpoint, tmp_path / "hf")
    assert notes == []
    exported = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert exported.config.n_positions == 32  # the context the run kept
    assert exported.config.tie_word_embeddings and exported.config.vocab_size == bpe.vocab_size
    ids = bpe.encode("Return the value of")
    expected = _tinynn_logits(result.model.to("cpu").eval(), ids)
    assert_close(_hf_logits(exported, ids), expected, rtol=0, atol=RTOL * np.abs(expected).max(), what="logits")


def test_the_pytorch_reference_builds_tinynns_models():
    """apps/bench/torch_reference.py's GPT for each bench config has tinynn's parameters: the same sizes,
    biases, head (gpt2: tied, without bias) and padded vocabulary."""
    apps = Path(__file__).resolve().parents[4] / "apps" / "bench"
    if not apps.is_dir():
        pytest.skip("apps/ is not beside this test tree")
    spec = importlib.util.spec_from_file_location("torch_reference", apps / "torch_reference.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    for name in ("lesson", "mid", "big", "gpt2"):
        s, cfg = reference.shape(name), config.load(apps / f"{name}.json")
        with torch.device("meta"):  # shapes only: GPT-2 small's weights are not drawn
            model = reference.GPT(s["vocab"], s["block"], s["d"], s["n_head"], s["n_layer"], True, s["bias"],
                                  s["head_bias"], s["tie"])
        assert sum(p.numel() for p in model.parameters()) == memory.parameter_count(cfg, bench.vocabulary(cfg)), name
