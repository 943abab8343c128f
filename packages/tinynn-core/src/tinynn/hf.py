"""Hugging Face GPT-2 folders in and out: `config.json`, `model.safetensors` and `tokenizer.json`, the files
`transformers`' `save_pretrained` writes and `from_pretrained` reads (transformers itself is not needed).

GPT-2 is tinynn's GPT with differences of storage, none of arithmetic:
- its linear layers are `Conv1D`s, whose weights are stored (in, out): tinynn's `Linear` holds (out, in), so
  each is transposed on the way in and out;
- its head is tied to the token embedding and has no bias: a folder loads as a GPT with `tie_embeddings: true`
  and `head_bias: false` (one table, trained as one when fine-tuned, as transformers does), or, where its
  config.json says `tie_word_embeddings: false`, with the `lm_head.weight` it then holds. Export writes a tied
  head for a tied model, and for an untied one whose head still equals `wte`; else an untied one
  (`tie_word_embeddings: false`, which transformers reads). A head bias that is not zero (a model trained with
  `bias: true` and `head_bias: true`) has no place in GPT-2, and export refuses it;
- a model without biases (`bias: false`) is written with zero biases;
- tinynn's tables may pad the vocabulary (`vocab_multiple`: GPT-2's 50257 tokens in 50304 rows): load adds
  zero rows (no token reads them and their logits are masked, so they stay zero in training), export drops
  them.
Its GELU is the tanh approximation ("gelu_new") and its LayerNorm eps 1e-5, as tinynn's: a config.json with
another activation, eps or layout is refused with the reason. Weights stored in float16 or bfloat16 are widened
to float32 (exactly); a sharded folder (model.safetensors.index.json) is read shard by shard.

    >>> pretrained = hf.load("gpt2-folder", vocab_multiple=64)  # config, tinynn state dict, tokenizer
    >>> hf.export(state, model_config, tokenizer, "out/hf")
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as serialize

from tinynn.errors import TinynnError
from tinynn.tokenizer import BPETokenizer, CharTokenizer, char_json, from_json_file

CONFIG, WEIGHTS, INDEX, TOKENIZER = "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tinynn's
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which GPT uses
# (GPT-2's name in a block, tinynn's name in a block, stored transposed)
BLOCK = [("ln_1.weight", "ln1.weight", False), ("ln_1.bias", "ln1.bias", False),
         ("attn.c_attn.weight", "attn.qkv.weight", True), ("attn.c_attn.bias", "attn.qkv.bias", False),
         ("attn.c_proj.weight", "attn.proj.weight", True), ("attn.c_proj.bias", "attn.proj.bias", False),
         ("ln_2.weight", "ln2.weight", False), ("ln_2.bias", "ln2.bias", False),
         ("mlp.c_fc.weight", "mlp.fc.weight", True), ("mlp.c_fc.bias", "mlp.fc.bias", False),
         ("mlp.c_proj.weight", "mlp.proj.weight", True), ("mlp.c_proj.bias", "mlp.proj.bias", False)]
TOP = [("wte.weight", "wte.weight"), ("wpe.weight", "wpe.weight"), ("ln_f.weight", "ln_f.weight"),
       ("ln_f.bias", "ln_f.bias")]
# buffers older GPT-2 files keep beside the weights (the causal mask): not weights, skipped
BUFFERS = (".attn.bias", ".attn.masked_bias")


def is_folder(path) -> bool:
    return path is not None and Path(path).is_dir() and (Path(path) / CONFIG).is_file()


@dataclass
class Pretrained:
    config: dict  # GPTConfig's fields: vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias, head_bias,
    # tie_embeddings, vocab_multiple
    state: dict  # tinynn's state dict (GPT's parameter names)
    tokenizer: BPETokenizer | CharTokenizer | None  # None where the folder has no tokenizer.json
    path: Path


def names(n_layer: int) -> list[tuple[str, str, bool]]:
    """(GPT-2 key, tinynn key, transposed) for every weight but the head."""
    out = [(hf, ours, False) for hf, ours in TOP]
    for i in range(n_layer):
        out += [(f"h.{i}.{hf}", f"blocks.{i}.{ours}", t) for hf, ours, t in BLOCK]
    return out


def read_config(folder) -> dict:
    """GPTConfig's fields from folder/config.json (tie_embeddings: whether its head is tied); a GPT-2 that
    tinynn's GPT cannot compute exactly is a TinynnError naming the key."""
    path = Path(folder) / CONFIG
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TinynnError(f"{folder} is not a Hugging Face model folder (no {CONFIG})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TinynnError(f"{path} is not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(raw, dict):
        raise TinynnError(f"{path} must hold a JSON object")
    if raw.get("model_type") != "gpt2":
        raise TinynnError(f"{path}: model_type is {raw.get('model_type')!r}; tinynn reads GPT-2 ('gpt2')")
    fields = {}
    for ours, theirs in (("vocab_size", "vocab_size"), ("block_size", "n_positions"), ("n_layer", "n_layer"),
                         ("n_head", "n_head"), ("n_embd", "n_embd")):
        value = raw.get(theirs, raw.get("n_ctx") if theirs == "n_positions" else None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TinynnError(f"{path}: {theirs!r} must be a positive integer, got {value!r}")
        fields[ours] = value
    if fields["n_embd"] % fields["n_head"]:
        raise TinynnError(f"{path}: n_embd ({fields['n_embd']}) is not divisible by n_head ({fields['n_head']})")
    checks = [("activation_function", raw.get("activation_function", "gelu_new") in GELU_TANH,
               "tinynn's GELU is the tanh approximation (gelu_new)"),
              ("layer_norm_epsilon", raw.get("layer_norm_epsilon", LAYER_NORM_EPS) == LAYER_NORM_EPS,
               f"tinynn's LayerNorm eps is {LAYER_NORM_EPS}"),
              ("n_inner", raw.get("n_inner") in (None, 4 * fields["n_embd"]),
               f"tinynn's MLP is 4 x n_embd ({4 * fields['n_embd']}) wide"),
              ("scale_attn_weights", raw.get("scale_attn_weights", True) is True,
               "tinynn's attention scales by 1/sqrt(head size)"),
              ("scale_attn_by_inverse_layer_idx", not raw.get("scale_attn_by_inverse_layer_idx", False),
               "tinynn's attention does not scale by layer"),
              ("add_cross_attention", not raw.get("add_cross_attention", False), "tinynn's GPT is decoder-only")]
    for key, ok, why in checks:
        if not ok:
            raise TinynnError(f"{path}: {key} is {raw.get(key)!r}, which tinynn cannot compute exactly ({why})")
    dropout = raw.get("resid_pdrop", 0.0)
    fields["dropout"] = float(dropout) if isinstance(dropout, (int, float)) and 0 <= dropout < 1 else 0.0
    fields["bias"], fields["head_bias"] = True, False
    fields["tie_embeddings"] = raw.get("tie_word_embeddings", True) is not False
    return fields


def _read_weights(folder: Path) -> dict[str, np.ndarray]:
    files = [folder / WEIGHTS]
    if not files[0].is_file() and (folder / INDEX).is_file():  # sharded: the index names each key's file
        try:
            weight_map = json.loads((folder / INDEX).read_text(encoding="utf-8"))["weight_map"]
            files = [folder / name for name in sorted(set(weight_map.values()))]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise TinynnError(f"{folder / INDEX} is not a safetensors index ({e})") from None
    if not files[0].is_file():
        other = [n for n in ("pytorch_model.bin", "model.bin", "tf_model.h5") if (folder / n).is_file()]
        hint = f" (it has {other[0]}: save it with safe_serialization=True)" if other else ""
        raise TinynnError(f"{folder} has no {WEIGHTS}{hint}")
    tensors = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                bfloat16 = [key for key in f.keys() if f.get_slice(key).get_dtype() == "BF16"]
                tensors.update({key: f.get_tensor(key) for key in f.keys() if key not in bfloat16})
            tensors.update(_read_bfloat16(path, bfloat16))
        except (SafetensorError, OSError, ValueError, TypeError, KeyError) as e:
            raise TinynnError(f"{path} is corrupt or not a safetensors file ({str(e).splitlines()[0]})") from None
    return tensors


def _read_bfloat16(path: Path, keys: list[str]) -> dict[str, np.ndarray]:
    """bfloat16 tensors, which NumPy has no type for, widened to float32 exactly (a bfloat16 is the top half of
    a float32's bits), read by the safetensors layout: an 8-byte header length, the JSON header, the data."""
    out = {}
    if not keys:
        return out
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        for key in keys:
            start, end = header[key]["data_offsets"]
            f.seek(8 + size + start)
            bits = np.frombuffer(f.read(end - start), dtype="<u2").astype(np.uint32) << 16
            out[key] = bits.view(np.float32).reshape(header[key]["shape"])
    return out


def load(folder, vocab_multiple: int = 1) -> Pretrained:
    """The GPT-2 in a Hugging Face folder as tinynn's GPT: its config, state dict and tokenizer, its tables
    padded to a multiple of `vocab_multiple` rows."""
    folder = Path(folder)
    if isinstance(vocab_multiple, bool) or not isinstance(vocab_multiple, int) or vocab_multiple < 1:
        raise TinynnError(f"vocab_multiple must be an integer of at least 1, got {vocab_multiple!r}")
    config = read_config(folder)
    config["vocab_multiple"] = vocab_multiple
    tied = config["tie_embeddings"]
    raw = _read_weights(folder)
    tensors = {}
    for key, value in raw.items():
        name = key.removeprefix("transformer.")
        if name.endswith(BUFFERS) and value.ndim != 1:
            continue
        tensors[name] = value
    wanted = names(config["n_layer"])
    missing = [hf for hf, _, _ in wanted if hf not in tensors]
    if not tied and "lm_head.weight" not in tensors:
        missing.append("lm_head.weight")
    unexpected = sorted(set(tensors) - {hf for hf, _, _ in wanted} - {"lm_head.weight"})
    where = folder / WEIGHTS
    if missing:
        raise TinynnError(f"{where} lacks {len(missing)} weight(s) the config.json asks for: "
                          f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    if unexpected:
        raise TinynnError(f"{where} has weights a GPT-2 of this config.json does not: "
                          f"{', '.join(unexpected[:4])}{' ...' if len(unexpected) > 4 else ''}")
    shapes = expected_shapes(config)
    state = {}
    for hf, ours, transposed in wanted:
        value = tensors[hf].T if transposed else tensors[hf]
        if tuple(value.shape) != shapes[ours]:
            stored = tuple(tensors[hf].shape)
            want = shapes[ours][::-1] if transposed else shapes[ours]
            raise TinynnError(f"{where}: {hf} has shape {stored}, the config.json says {want}")
        if value.dtype.kind != "f":
            raise TinynnError(f"{where}: {hf} holds {value.dtype}, not floating-point weights")
        state[ours] = np.ascontiguousarray(value, dtype=np.float32)
    if not tied:
        head = tensors["lm_head.weight"]
        if tuple(head.shape) != shapes["lm_head.weight"]:
            raise TinynnError(f"{where}: lm_head.weight has shape {tuple(head.shape)}, the config.json says "
                              f"{shapes['lm_head.weight']}")
        state["lm_head.weight"] = np.asarray(head, dtype=np.float32)
    for hf, ours, _ in [*wanted, ("lm_head.weight", "lm_head.weight", False)]:
        if ours in state and not np.isfinite(state[ours]).all():  # as checkpoint.load refuses them
            raise TinynnError(f"{where}: {hf} holds non-finite values (NaN or infinity): the weights are damaged")
    padding = padded_rows(config) - config["vocab_size"]  # vocab_multiple's rows, zeros
    for name in ("wte.weight", "lm_head.weight"):
        if name in state and padding:
            state[name] = np.pad(state[name], ((0, padding), (0, 0)))  # (V, C) -> (Vp, C)
    tokenizer = from_json_file(folder / TOKENIZER) if (folder / TOKENIZER).is_file() else None
    if tokenizer is not None and tokenizer.vocab_size > config["vocab_size"]:
        raise TinynnError(f"{folder / TOKENIZER} has {tokenizer.vocab_size} tokens, more than the model's "
                          f"vocab_size {config['vocab_size']}")
    return Pretrained(config, state, tokenizer, folder)


def padded_rows(config: dict) -> int:
    """The rows of tinynn's token table and head: vocab_size rounded up to a multiple of vocab_multiple
    (GPTConfig.padded_vocab_size, from a dict that may predate the key)."""
    multiple = config.get("vocab_multiple", 1)
    return -(-config["vocab_size"] // multiple) * multiple


def expected_shapes(config: dict) -> dict[str, tuple]:
    """GPT-2's shapes of tinynn's parameters (the vocabulary unpadded), as tinynn names them."""
    V, T, C = config["vocab_size"], config["block_size"], config["n_embd"]
    shapes = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,),
              "lm_head.weight": (V, C), "lm_head.bias": (V,)}
    block = {"ln1.weight": (C,), "ln1.bias": (C,), "attn.qkv.weight": (3 * C, C), "attn.qkv.bias": (3 * C,),
             "attn.proj.weight": (C, C), "attn.proj.bias": (C,), "ln2.weight": (C,), "ln2.bias": (C,),
             "mlp.fc.weight": (4 * C, C), "mlp.fc.bias": (4 * C,), "mlp.proj.weight": (C, 4 * C),
             "mlp.proj.bias": (C,)}
    for i in range(config["n_layer"]):
        shapes.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    return shapes


def export(state: dict, config: dict, tokenizer, out_dir, overwrite: bool = False) -> list[str]:
    """Write tinynn's GPT (its state dict and GPTConfig fields) as a Hugging Face GPT-2 folder; returns
    notes for the user on what was chosen (an untied head, zero biases). What GPT-2 cannot hold exactly is
    a TinynnError that names it."""
    out_dir = Path(out_dir)
    notes = []
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not overwrite)):
        raise TinynnError(f"{out_dir} already exists and is not an empty folder: use --overwrite or another folder")
    if tokenizer.vocab_size > config["vocab_size"]:
        raise TinynnError(f"cannot export as GPT-2: the tokenizer has {tokenizer.vocab_size} tokens, more than the "
                          f"model's vocab_size {config['vocab_size']}")
    state = _unpadded(state, config)
    head_bias = state.get("lm_head.bias")
    if head_bias is not None and np.any(head_bias != 0):
        raise TinynnError("cannot export as GPT-2: the head has a bias that is not zero (lm_head.bias, largest "
                          f"{np.abs(head_bias).max():.3g}), and GPT-2's head has none; train with \"head_bias\": "
                          "false")
    tied = "lm_head.weight" not in state or np.array_equal(state["lm_head.weight"], state["wte.weight"])
    if not tied:
        notes.append("the head differs from wte (it was trained apart): written untied (tie_word_embeddings false)")
    shapes = expected_shapes(config)
    tensors = {}
    zeroed = []
    for hf, ours, transposed in names(config["n_layer"]):
        if ours in state:
            value = np.asarray(state[ours], dtype=np.float32)
        elif ours.endswith(".bias"):  # a model without biases: GPT-2's are zero
            value = np.zeros(shapes[ours], np.float32)
            zeroed.append(ours)
        else:
            raise TinynnError(f"cannot export as GPT-2: the model has no {ours}")
        tensors[f"transformer.{hf}"] = np.ascontiguousarray(value.T if transposed else value)
    if zeroed:
        notes.append("the model has no biases: GPT-2's are written as zeros")
    if not tied:
        tensors["lm_head.weight"] = np.ascontiguousarray(state["lm_head.weight"], dtype=np.float32)
    eot = getattr(tokenizer, "eot_id", None)
    hf_config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config["vocab_size"],
        "n_positions": config["block_size"], "n_embd": config["n_embd"], "n_layer": config["n_layer"],
        "n_head": config["n_head"], "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPS, "resid_pdrop": config.get("dropout", 0.0),
        "embd_pdrop": config.get("dropout", 0.0), "attn_pdrop": config.get("dropout", 0.0),
        "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": bool(tied), "bos_token_id": eot,
        "eos_token_id": eot, "dtype": "float32", "use_cache": True,
    }
    tokenizer_json = char_json(tokenizer) if isinstance(tokenizer, CharTokenizer) else tokenizer.to_json()
    files = {CONFIG: (json.dumps(hf_config, indent=2) + "\n").encode(),
             WEIGHTS: serialize(tensors, metadata={"format": "pt"}),  # transformers reads only format pt
             TOKENIZER: tokenizer_json.encode("utf-8")}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            tmp = out_dir / f"{name}.tmp-{os.getpid()}"
            tmp.write_bytes(data)
            os.replace(tmp, out_dir / name)
    except OSError as e:
        raise TinynnError(f"cannot write {out_dir} ({e.strerror or e})") from None
    return notes


def _unpadded(state: dict, config: dict) -> dict:
    """The state with the token table's and the head's padding rows (vocab_multiple) dropped: GPT-2 has
    vocab_size rows."""
    vocab, rows = config["vocab_size"], padded_rows(config)
    table = state.get("wte.weight")
    if table is None:
        raise TinynnError("cannot export as GPT-2: the model has no wte.weight")
    if table.shape[0] != rows:
        raise TinynnError(f"cannot export as GPT-2: wte.weight has {table.shape[0]} rows, the vocabulary "
                          f"{vocab} padded to a multiple of {config.get('vocab_multiple', 1)} has {rows}")
    return {k: v[:vocab] if k in ("wte.weight", "lm_head.weight", "lm_head.bias") else v for k, v in state.items()}


def build(pretrained: Pretrained, dropout: float | None = None):
    """tinynn's GPT holding the pretrained weights (dropout: the fine-tuning run's, else the folder's)."""
    from tinynn.model import GPT, GPTConfig
    config = dict(pretrained.config)
    if dropout is not None:
        config["dropout"] = dropout
    model = GPT(GPTConfig(**config))
    model.load_state_dict(pretrained.state)
    return model


def export_checkpoint(path, out_dir, overwrite: bool = False) -> list[str]:
    """`tinynn export --format hf`: a tinynn checkpoint written as a GPT-2 folder (see export)."""
    from tinynn import checkpoint
    from tinynn.model import GPTConfig
    from tinynn.tokenizer import from_spec
    saved = checkpoint.load(path)
    config = {f: saved["config"][f] for f in GPTConfig.__dataclass_fields__ if f in saved["config"]}
    lacking = [f for f in ("block_size", "n_layer", "n_head", "n_embd") if f not in config]
    if lacking or "wte.weight" not in saved["model"]:
        raise TinynnError(f"checkpoint {path} holds no GPT ({'no ' + lacking[0] if lacking else 'no wte.weight'})")
    config["vocab_size"] = checkpoint.vocab_size(saved)
    return export(saved["model"], config, from_spec(saved["tokenizer"], f"checkpoint {path}"), out_dir, overwrite)
