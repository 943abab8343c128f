"""Checkpoints: one safetensors file holding the weights, the optimizer state, and (as JSON metadata) the
config, the tokenizer's characters, the step and the RNG state.

Saving writes a temporary file beside the target and renames it over the target, so a run killed mid-save
leaves the previous checkpoint intact.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from tinynn.errors import TinynnError

FORMAT = "tinynn-checkpoint-1"


def save(path, *, model_state: dict, optimizer_state: dict, config: dict, chars: list[str], step: int,
         rng_state: dict, history: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": np.ascontiguousarray(v) for k, v in model_state.items()}
    tensors.update({f"optim.{k}": np.ascontiguousarray(np.asarray(v)) for k, v in optimizer_state.items()})
    metadata = {"format": FORMAT, "config": json.dumps(config), "chars": json.dumps(chars), "step": str(step),
                "rng_state": json.dumps(rng_state), "history": json.dumps(history)}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)  # atomic on POSIX and Windows


def load(path) -> dict:
    """The checkpoint's parts; a missing, corrupt or foreign file is a TinynnError naming it."""
    path = Path(path)
    if not path.is_file():
        raise TinynnError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise TinynnError(f"checkpoint {path} is corrupt or not a safetensors file ({e})") from None
    if metadata.get("format") != FORMAT:
        raise TinynnError(f"checkpoint {path} is not a tinynn checkpoint (format {metadata.get('format')!r})")
    try:
        return {
            "model": {k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
            "optimizer": {k[6:]: v for k, v in tensors.items() if k.startswith("optim.")},
            "config": json.loads(metadata["config"]),
            "chars": json.loads(metadata["chars"]),
            "step": int(metadata["step"]),
            "rng_state": json.loads(metadata["rng_state"]),
            "history": json.loads(metadata["history"]),
        }
    except (KeyError, ValueError) as e:
        raise TinynnError(f"checkpoint {path} has damaged metadata ({e})") from None
