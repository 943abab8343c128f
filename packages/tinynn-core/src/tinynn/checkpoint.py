"""Checkpoints: one safetensors file holding the weights, the optimizer state, and (as JSON metadata) the
config, the tokenizer, the step and the RNG state, and a SHA-256 checksum of all of it (`load` refuses a file
whose bytes were changed; a checkpoint written before the checksum existed loads unchecked).

The model's vocabulary is saved beside its config (`vocab_size`): its tables may have more rows
(`vocab_multiple`'s padding), which are no token. A checkpoint written before it has unpadded tables, whose
rows are its vocabulary (`vocab_size(saved)` answers for both).

A char tokenizer is its list of characters (`chars`); any other goes in `tokenizer` as its spec
(tokenizer.py), with `chars` empty. `load` returns the spec either way, so a checkpoint written before BPE
existed loads unchanged.

Saving writes a temporary file beside the target (`<name>.tmp-<pid>`) and renames it over the target, so a
run killed mid-save leaves the previous checkpoint intact; `remove_orphans` deletes what such a kill left.
The file is written by Python, not by safetensors, so it gets the umask's permissions (0644 by default), not
0600. A failed write (a full disk, a read-only directory) is a `SaveError`, which the training loop survives.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as serialize

from tinynn import rng
from tinynn.errors import TinynnError, not_found

FORMAT = "tinynn-checkpoint-1"
HISTORY = ("step", "train_loss", "val_step", "val_loss")  # the loss history's lists, by the step they were taken
CHECKSUM = "sha256"  # the metadata entry of the checksum; a checkpoint written before it has none, and loads


def _digest(tensors: dict, metadata: dict) -> str:
    """SHA-256 over every tensor (name, dtype, shape, bytes) and every metadata entry but the checksum itself:
    bytes overwritten inside a valid file (a bad disk, a stray write) still parse, and would load silently."""
    h = hashlib.sha256()
    for key in sorted(k for k in metadata if k != CHECKSUM):
        h.update(json.dumps([key, metadata[key]]).encode())
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        h.update(json.dumps([name, array.dtype.str, array.shape]).encode())
        h.update(array.reshape(-1).view(np.uint8))
    return h.hexdigest()


class SaveError(TinynnError):
    """A checkpoint could not be written; the message names the path and the reason."""


def save(path, *, model_state: dict, optimizer_state: dict, config: dict, step: int, rng_state: dict,
         history: dict, chars: list[str] | None = None, tokenizer: dict | None = None,
         vocab_size: int | None = None) -> None:
    """Write the checkpoint; the tokenizer is `chars` (a char tokenizer) or a `tokenizer` spec; `vocab_size` is
    the model's (None: its token table's rows)."""
    path = Path(path)
    if tokenizer is not None and tokenizer.get("type") == "char":
        chars, tokenizer = tokenizer["chars"], None
    if (chars is None) == (tokenizer is None):
        raise ValueError("a checkpoint holds one tokenizer: chars or a tokenizer spec")
    tensors = {f"model.{k}": np.ascontiguousarray(v) for k, v in model_state.items()}
    tensors.update({f"optim.{k}": np.ascontiguousarray(np.asarray(v)) for k, v in optimizer_state.items()})
    metadata = {"format": FORMAT, "config": json.dumps(config), "chars": json.dumps(chars or []), "step": str(step),
                "rng_state": json.dumps(rng_state), "history": json.dumps(history)}
    if tokenizer is not None:
        metadata["tokenizer"] = json.dumps(tokenizer)
    if vocab_size is not None:
        metadata["vocab_size"] = str(vocab_size)
    metadata[CHECKSUM] = _digest(tensors, metadata)
    data = serialize(tensors, metadata=metadata)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SaveError(f"cannot write checkpoint {path} ({e.strerror or e})") from None


def remove_orphans(path) -> list[Path]:
    """Delete the temporary files that a run killed mid-save left beside `path`; returns them."""
    path = Path(path)
    orphans = sorted(path.parent.glob(f"{path.name}.tmp*")) if path.parent.is_dir() else []
    for orphan in orphans:
        orphan.unlink(missing_ok=True)
    return orphans


def load(path) -> dict:
    """The checkpoint's parts; a missing, corrupt or foreign file is a TinynnError naming it."""
    path = Path(path)
    if not path.is_file():
        raise not_found("checkpoint", path, "a folder with no config.json: neither a checkpoint file nor a Hugging "
                                            "Face GPT-2 folder")
    if not os.access(path, os.R_OK):
        raise TinynnError(f"checkpoint {path} is not readable (permission denied)")
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise TinynnError(f"checkpoint {path} is corrupt or not a safetensors file ({e})") from None
    if metadata.get("format") != FORMAT:
        raise TinynnError(f"checkpoint {path} is not a tinynn checkpoint (format {metadata.get('format')!r})")
    if CHECKSUM in metadata and metadata[CHECKSUM] != _digest(tensors, metadata):
        raise TinynnError(f"checkpoint {path} is damaged: its contents do not match the checksum saved with them")
    try:
        saved = {
            "model": {k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
            "optimizer": {k[6:]: v for k, v in tensors.items() if k.startswith("optim.")},
            "config": json.loads(metadata["config"]),
            "chars": json.loads(metadata["chars"]),
            "step": int(metadata["step"]),
            "rng_state": json.loads(metadata["rng_state"]),
            "history": json.loads(metadata["history"]),
        }
        saved["tokenizer"] = json.loads(metadata["tokenizer"]) if "tokenizer" in metadata else \
            {"type": "char", "chars": saved["chars"]}
        saved["vocab_size"] = int(metadata["vocab_size"]) if "vocab_size" in metadata else None
    except (KeyError, ValueError) as e:
        raise TinynnError(f"checkpoint {path} has damaged metadata ({e})") from None
    for name, weights in saved["model"].items():
        if weights.dtype.kind == "f" and not np.isfinite(weights).all():
            raise TinynnError(f"checkpoint {path} has non-finite weights in {name!r}: its run diverged")
    return saved


def check_resumable(saved: dict, path) -> None:
    """A run resumed from `saved` needs what training leaves in a checkpoint besides the weights: its step, the
    optimizer's state, the generator's state and the loss history. A checkpoint written for sampling alone, or
    damaged before the checksum existed, lacks one: a TinynnError names it (training would raise on it)."""
    history = saved["history"]
    problems = [
        (saved["step"] < 0, f"its step is {saved['step']}"),
        (np.asarray(saved["optimizer"].get("steps", [])).size != 1, "it holds no optimizer state"),
        (not rng.valid_state(saved["rng_state"]), "it holds no random generator state"),
        (not isinstance(history, dict) or any(not isinstance(history.get(k), list) for k in HISTORY) or
         len(history["step"]) != len(history["train_loss"]) or len(history["val_step"]) != len(history["val_loss"]),
         "its loss history is not one a run writes"),
    ]
    for bad, why in problems:
        if bad:
            raise TinynnError(f"cannot resume from {path}: {why} (a checkpoint written for sampling alone, or "
                              "damaged); train afresh with --overwrite")


def vocab_size(saved: dict) -> int | None:
    """The saved model's vocabulary: as saved, else (a checkpoint older than padded tables) its token table's
    rows; None where it holds no token table."""
    if saved.get("vocab_size") is not None:
        return saved["vocab_size"]
    table = saved["model"].get("wte.weight")
    return None if table is None else table.shape[0]
