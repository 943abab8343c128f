"""GPT-2 folders without transformers: export and load again keep every bit, GPT-2's storage (transposed Conv1D
weights, a tied head with no bias) maps onto tinynn's GPT, and a folder that does not fit is a one-line error
naming the key. (tests/interop checks the same folders against transformers itself.)"""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tinynn import checkpoint, hf, rng
from tinynn.errors import TinynnError
from tinynn.model import GPT, GPTConfig
from tinynn.tokenizer import BPETokenizer, CharTokenizer

CONFIG = dict(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=8, dropout=0.0, bias=True)


def _state(seed=0, **changes):
    rng.manual_seed(seed)
    model = GPT(GPTConfig(**{**CONFIG, **changes}))
    draw = np.random.default_rng(seed)
    state = {k: draw.normal(size=v.shape).astype(np.float32) for k, v in model.state_dict().items()}
    if "lm_head.bias" in state:
        state["lm_head.bias"][:] = 0
    return state


def _folder(tmp_path, tied=True):
    state = _state()
    if tied:
        state["lm_head.weight"] = state["wte.weight"].copy()
    hf.export(state, CONFIG, CharTokenizer("".join(chr(65 + i) for i in range(40))), tmp_path / "gpt2")
    return tmp_path / "gpt2", state


def test_storage_is_gpt2s_and_load_gives_back_every_bit(tmp_path):
    folder, state = _folder(tmp_path)
    stored = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in stored  # tied, as save_pretrained writes it
    assert stored["transformer.h.1.attn.c_attn.weight"].shape == (8, 24)  # Conv1D: (in, out)
    np.testing.assert_array_equal(stored["transformer.h.1.mlp.c_fc.weight"], state["blocks.1.mlp.fc.weight"].T)
    config = json.loads((folder / "config.json").read_text())
    assert config["activation_function"] == "gelu_new" and config["layer_norm_epsilon"] == 1e-5
    assert config["tie_word_embeddings"] is True and config["n_positions"] == 16
    pretrained = hf.load(folder)
    assert pretrained.config == {**CONFIG, "head_bias": False, "tie_embeddings": True, "vocab_multiple": 1}
    assert isinstance(pretrained.tokenizer, CharTokenizer)
    # GPT-2's head has no bias, and is wte
    assert sorted(pretrained.state) == sorted(set(state) - {"lm_head.bias", "lm_head.weight"})
    for name, value in pretrained.state.items():
        assert value.tobytes() == state[name].tobytes(), name
    model = hf.build(pretrained)
    assert model.lm_head.bias is None and model.lm_head.weight is model.wte.weight
    logits, _ = model(np.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, 40)


def test_untied_head_and_missing_biases_are_written_as_gpt2_can_hold_them(tmp_path):
    tok = BPETokenizer.train(["some text to learn from " * 20], vocab_size=300)
    with pytest.raises(TinynnError, match="the tokenizer has 274 tokens, more than the model's vocab_size 40"):
        hf.export(_state(), CONFIG, tok, tmp_path / "out")
    state = _state(bias=False, vocab_size=tok.vocab_size)
    config = {**CONFIG, "bias": False, "vocab_size": tok.vocab_size}
    notes = hf.export(state, config, tok, tmp_path / "out")
    assert any("untied" in n for n in notes) and any("zeros" in n for n in notes)
    pretrained = hf.load(tmp_path / "out")
    np.testing.assert_array_equal(pretrained.state["lm_head.weight"], state["lm_head.weight"])
    assert not pretrained.state["blocks.0.attn.qkv.bias"].any() and "lm_head.bias" not in pretrained.state
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == tok.eot_id


def test_export_refuses_a_head_bias_and_an_occupied_folder(tmp_path):
    state = _state()
    state["lm_head.bias"][3] = 0.5
    with pytest.raises(TinynnError, match="the head has a bias that is not zero"):
        hf.export(state, CONFIG, CharTokenizer("ab"), tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    state["lm_head.bias"][3] = 0
    with pytest.raises(TinynnError, match="already exists and is not an empty folder"):
        hf.export(state, CONFIG, CharTokenizer("ab"), tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("change,message", [
    ({"activation_function": "relu"}, "activation_function is 'relu', which tinynn cannot compute exactly (tinynn's "
                                      "GELU is the tanh approximation"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon is 1e-06, which tinynn cannot compute exactly"),
    ({"n_inner": 12}, "n_inner is 12"),
    ({"model_type": "llama"}, "model_type is 'llama'; tinynn reads GPT-2"),
    ({"n_layer": 3}, "lacks 12 weight(s) the config.json asks for: h.2.ln_1.weight"),
    ({"n_embd": "8"}, "'n_embd' must be a positive integer, got '8'"),
    ({"vocab_size": 41}, "transformer.wte.weight has shape (40, 8), the config.json says (41, 8)"),
])
def test_folders_that_do_not_fit_are_one_line_errors(tmp_path, change, message):
    folder, _ = _folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(TinynnError) as e:
        hf.load(folder)
    assert message.replace("transformer.", "") in str(e.value) and "\n" not in str(e.value)


def test_weight_files_that_do_not_fit_are_one_line_errors(tmp_path):
    folder, _ = _folder(tmp_path)
    weights = load_file(folder / "model.safetensors")
    save_file({**weights, "transformer.h.0.attn.extra": np.zeros(3, np.float32)}, folder / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(TinynnError, match="has weights a GPT-2 of this config.json does not: h.0.attn.extra"):
        hf.load(folder)
    mask = np.tril(np.ones((1, 1, 16, 16), np.float32))  # older files keep the causal mask: skipped
    save_file({**weights, "transformer.h.0.attn.bias": mask}, folder / "model.safetensors")
    hf.load(folder)
    (folder / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(TinynnError, match="model.safetensors is corrupt or not a safetensors file"):
        hf.load(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(TinynnError, match=r"has no model.safetensors \(it has pytorch_model.bin"):
        hf.load(folder)
    (folder / "config.json").unlink()
    with pytest.raises(TinynnError, match="is not a Hugging Face model folder"):
        hf.load(folder)


@pytest.mark.parametrize("tied", [True, False])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, tied):
    """A NaN in a layer made every logit NaN: generate printed one token over and over, and fine-tuning blamed
    the learning rate."""
    folder, _ = _folder(tmp_path, tied=tied)
    key = "transformer.h.1.mlp.c_fc.weight" if tied else "lm_head.weight"
    stored = load_file(folder / "model.safetensors")
    stored[key][0, 0] = np.nan if tied else np.inf
    save_file(stored, folder / "model.safetensors")
    with pytest.raises(TinynnError, match=f"model.safetensors: {key.removeprefix('transformer.')} holds non-finite"):
        hf.load(folder)


def test_checkpoint_carries_a_bpe_tokenizer_and_reads_old_char_ones(tmp_path):
    tok = BPETokenizer.train(["hello there, general text " * 10], vocab_size=270)
    common = dict(model_state={"w": np.ones(2, np.float32)}, optimizer_state={}, config={}, step=1,
                  rng_state={}, history={})
    checkpoint.save(tmp_path / "bpe.safetensors", tokenizer=tok.spec(), **common)
    saved = checkpoint.load(tmp_path / "bpe.safetensors")
    assert saved["tokenizer"]["type"] == "bpe" and saved["chars"] == []
    checkpoint.save(tmp_path / "char.safetensors", chars=["a", "b"], **common)
    assert checkpoint.load(tmp_path / "char.safetensors")["tokenizer"] == {"type": "char", "chars": ["a", "b"]}
    with pytest.raises(TinynnError, match="holds no GPT"):
        hf.export_checkpoint(tmp_path / "bpe.safetensors", tmp_path / "hf")
    state = _state(vocab_size=tok.vocab_size)
    del state["blocks.1.mlp.fc.weight"]
    checkpoint.save(tmp_path / "gpt.safetensors", tokenizer=tok.spec(),
                    **{**common, "model_state": state, "config": {**CONFIG, "vocab_size": tok.vocab_size}})
    with pytest.raises(TinynnError, match="the model has no blocks.1.mlp.fc.weight"):
        hf.export_checkpoint(tmp_path / "gpt.safetensors", tmp_path / "hf")


def test_bfloat16_weights_are_widened_exactly(tmp_path):
    """NumPy has no bfloat16: such a file (as transformers saves a bf16 model) is read by its layout."""
    import struct
    folder, _ = _folder(tmp_path)
    weights = load_file(folder / "model.safetensors")
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for key, value in weights.items():
        bits = (np.ascontiguousarray(value, np.float32).view(np.uint32) >> 16).astype("<u2")  # truncated to bf16
        header[key] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + bits.nbytes]}
        blobs.append(bits.tobytes())
        offset += bits.nbytes
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    pretrained = hf.load(folder)
    widened = (weights["transformer.h.1.mlp.c_fc.weight"].view(np.uint32) & 0xFFFF0000).view(np.float32)
    np.testing.assert_array_equal(pretrained.state["blocks.1.mlp.fc.weight"], widened.T)
    assert pretrained.state["wte.weight"].dtype == np.float32


def test_a_sharded_folder_is_read_shard_by_shard(tmp_path):
    folder, state = _folder(tmp_path)
    weights = load_file(folder / "model.safetensors")
    keys = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": keys[:10], "model-00002-of-00002.safetensors": keys[10:]}
    for name, part in shards.items():
        save_file({k: weights[k] for k in part}, folder / name, metadata={"format": "pt"})
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: name for name, part in shards.items() for k in part}}))
    assert hf.load(folder).state["blocks.1.attn.qkv.weight"].tobytes() == state["blocks.1.attn.qkv.weight"].tobytes()
    (folder / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(TinynnError, match="is not a safetensors index"):
        hf.load(folder)
