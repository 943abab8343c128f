"""The training configuration: one dataclass, loaded from JSON with every key and type checked. Its model fields
are the GPT's (model.Architecture: declared and checked there); the vocabulary comes from the data.

Any problem is a `TinynnError` whose one-line message names the file and the offending key.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path

from tinynn import precision
from tinynn.errors import TinynnError, TinynnNotice, not_found
from tinynn.model import Architecture, GPTConfig


@dataclass(kw_only=True)
class TrainConfig(Architecture):
    # model: Architecture's fields (model.py), the vocabulary coming from the data; a run's default model is
    # smaller than the lesson's
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    # data
    data: str | None = None  # a UTF-8 text file or a token folder (tinynn prepare, nanoGPT); None: the built-in corpus
    val_fraction: float = 0.1  # of a text file (a token folder has its own val.bin)
    tokenizer: str | None = None  # char, bpe (trained on the text) or a tokenizer.json; None: the folder's, or char
    vocab_size: int | None = None  # the bpe tokenizer's vocabulary, learned from the text (at least 257)
    init_from: str | None = None  # a Hugging Face GPT-2 folder to fine-tune: its weights, shape and tokenizer
    # optimisation
    batch_size: int = 16  # sequences per optimizer step, over all micro-batches and MPI ranks
    grad_accum_steps: int = 1  # micro-batches whose gradients add up before each optimizer step
    max_steps: int = 500
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float | None = 1.0  # max gradient norm; null turns clipping off
    seed: int = 1337
    matmul_precision: str | None = None  # "highest" or "high" (tensor cores, precision.py); None: the process's
    # evaluation, checkpoints, output
    eval_interval: int = 100
    eval_steps: int = 10
    checkpoint_interval: int = 100
    out_dir: str = "out"
    sample_tokens: int = 200
    sample_prompt: str = ""  # empty: start from the first character of the training text
    loss_plot: str | None = None  # a path for the loss curve (.png, .svg, .pdf...; needs matplotlib); one in out_dir
    # moves with --out-dir

    def model_config(self, vocab_size: int) -> GPTConfig:
        model = {field.name: getattr(self, field.name) for field in dataclasses.fields(Architecture)}
        return GPTConfig(vocab_size=vocab_size, **model)

    def validate(self, source="config", names=None) -> TrainConfig:
        """Check every value; `names` maps a key to how the user spelled it (a CLI flag) for the message."""
        names = names or {}

        def bad(key, why):
            where = f"{source}: " if key not in names else ""
            raise TinynnError(f"{where}{names.get(key, repr(key))} {why}")
        hints = typing.get_type_hints(TrainConfig)
        for field in dataclasses.fields(self):  # first, so that a NaN is blamed on its own key
            value = getattr(self, field.name)
            if not _type_ok(value, hints[field.name]):
                bad(field.name, f"must be {_type_name(hints[field.name])}, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                bad(field.name, f"must be a finite number, got {value}")
        for key, why in self.problems():
            bad(key, why)
        for key in ("batch_size", "grad_accum_steps", "max_steps", "eval_interval", "eval_steps"):
            if getattr(self, key) < 1:
                bad(key, f"must be at least 1, got {getattr(self, key)}")
        for key in ("warmup_steps", "checkpoint_interval", "sample_tokens", "seed"):
            if getattr(self, key) < 0:
                bad(key, f"must not be negative, got {getattr(self, key)}")
        if self.batch_size % self.grad_accum_steps:
            bad("batch_size", f"({self.batch_size}) must be divisible by grad_accum_steps ({self.grad_accum_steps})")
        for key in ("val_fraction", "beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                bad(key, f"must be in [0, 1), got {getattr(self, key)}")
        if self.learning_rate <= 0:
            bad("learning_rate", f"must be positive, got {self.learning_rate}")
        if not 0 <= self.min_lr <= self.learning_rate:
            bad("min_lr", f"must be between 0 and learning_rate ({self.learning_rate}), got {self.min_lr}")
        if self.weight_decay < 0:
            bad("weight_decay", f"must not be negative, got {self.weight_decay}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            bad("grad_clip", f"must be positive or null, got {self.grad_clip}")
        if self.matmul_precision is not None and self.matmul_precision not in precision.PRECISIONS:
            bad("matmul_precision", f"must be one of {', '.join(precision.PRECISIONS)} or null, got "
                                    f"{self.matmul_precision!r}")
        if not self.out_dir.strip():
            bad("out_dir", "must not be empty")
        for key in ("data", "init_from", "loss_plot"):  # "" would read as the current folder, or as null
            if getattr(self, key) is not None and not getattr(self, key).strip():
                bad(key, "must be a path or null, got an empty string")
        if self.tokenizer is not None and self.tokenizer not in ("char", "bpe") and \
                not self.tokenizer.endswith(".json"):
            bad("tokenizer", f"must be char, bpe or the path of a tokenizer.json, got {self.tokenizer!r}")
        if self.vocab_size is not None and self.tokenizer != "bpe":
            bad("vocab_size", f"is for tokenizer 'bpe' (the tokenizer is {self.tokenizer or 'char'!r})")
        if self.vocab_size is not None and self.vocab_size < 257:
            bad("vocab_size", f"must be at least 257 (the 256 bytes and end-of-text), got {self.vocab_size}")
        return self


def _type_ok(value, annotation) -> bool:
    options = typing.get_args(annotation) or (annotation,)
    for t in options:
        if t is type(None) and value is None:
            return True
        if t is bool and isinstance(value, bool):
            return True
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t is str and isinstance(value, str):
            return True
    return False


def _type_name(annotation) -> str:
    members = typing.get_args(annotation) or (annotation,)
    return " or ".join("null" if t is type(None) else t.__name__ for t in members)


def from_dict(raw: dict, source="config", overrides: dict | None = None) -> TrainConfig:
    """A validated config from JSON values. `overrides` maps a command-line flag to (key, value); a value of
    None means the flag was not given. Flags and file go through the same checks."""
    if not isinstance(raw, dict):
        raise TinynnError(f"{source}: must hold a JSON object, got {type(raw).__name__}")
    hints = typing.get_type_hints(TrainConfig)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for key, value in raw.items():
        if key not in fields:
            near = difflib.get_close_matches(key, fields, n=1)
            hint = f"did you mean {near[0]!r}?" if near else "README's Config reference lists the keys"
            raise TinynnError(f"{source}: unknown key {_cut(repr(key))} ({hint})")
        if not _type_ok(value, hints[key]):
            raise TinynnError(f"{source}: {key!r} must be {_type_name(hints[key])}, got {_cut(json.dumps(value))}")
    given = {flag: kv for flag, kv in (overrides or {}).items() if kv[1] is not None}
    out_dir = raw.get("out_dir", TrainConfig.out_dir)
    raw = {**raw, **dict(given.values())}
    if raw.get("out_dir", out_dir) != out_dir and isinstance(raw.get("loss_plot"), str):
        raw["loss_plot"] = _follow(raw["loss_plot"], out_dir, raw["out_dir"])
    values = {k: float(v) if hints[k] in (float, float | None) and v is not None else v for k, v in raw.items()}
    return TrainConfig(**values).validate(source, names={key: flag for flag, (key, _) in given.items()})


def _follow(loss_plot: str, old_out_dir: str, out_dir: str) -> str:
    """A loss_plot in the config's out_dir moves with an out_dir given on the command line, so that two runs of
    one config in two out_dirs write two plots."""
    try:
        inside = Path(os.path.normpath(loss_plot)).relative_to(os.path.normpath(old_out_dir))
    except ValueError:
        warnings.warn(f"loss_plot {loss_plot!r} is outside out_dir {old_out_dir!r}, so --out-dir does not move "
                      "it: runs of this config write one plot", TinynnNotice)
        return loss_plot
    return str(Path(out_dir) / inside)


def _cut(text: str, limit: int = 80) -> str:
    """A value quoted in an error, cut short: a damaged checkpoint's config can hold one kilobytes long."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _no_repeats(pairs: list) -> dict:
    """A JSON object whose keys are all different: json keeps the last of two equal keys, silently."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Repeated(key)
        seen[key] = value
    return seen


class _Repeated(Exception):
    pass


def load(path: str | Path, overrides: dict | None = None) -> TrainConfig:
    """The config in a JSON file, with command-line overrides applied (see `from_dict`)."""
    path = Path(path)
    if not path.is_file():
        raise not_found("config file", path)
    try:  # utf-8-sig: a byte-order mark some editors write is not JSON
        raw = json.loads(path.read_text(encoding="utf-8-sig"), object_pairs_hook=_no_repeats)
    except json.JSONDecodeError as e:
        raise TinynnError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError:
        raise TinynnError(f"{path}: not UTF-8 text") from None
    except _Repeated as e:
        raise TinynnError(f"{path}: key {_cut(repr(e.args[0]))} is given twice") from None
    return from_dict(raw, str(path), overrides)


def to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)
