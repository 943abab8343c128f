"""Will a training run fit? An estimate of its memory from the config alone, checked before the model is built.

A model too large for the machine otherwise ends in the kernel's out-of-memory killer, with no message, or a
`MemoryError` traceback. The estimate counts float32 parameters, gradients and AdamW's two moments, the
activations that the backward pass keeps, and the logits over the vocabulary with the temporaries of the
cross entropy.
"""
from __future__ import annotations

import os

from tinynn import model
from tinynn.errors import TinynnError

FLOAT = 4  # bytes: training runs in float32
# Per token and per block, the backward pass keeps (with the temporaries at its peak) about 40 floats per
# embedding channel and 6 per attention score; the logits cost 8 (B, T, vocab) arrays (the logits, softmax,
# gradient and cross entropy's temporaries); parameters 5 copies (weights, gradients, two moments, the
# update's temporary). Measured on the NumPy backend (peak RSS of two steps, vocabularies of 96 to 50,000,
# widths 32 to 512, contexts 32 to 256): these err high, by 0% to 41%. A checkpoint adds 6 copies on the host
# whatever the backend (the weights and moments held until a loss judges them, and their serialised bytes);
# on a GPU the host also draws the initial weights (a float64 array and its float32 copy: 3).
PER_CHANNEL, PER_SCORE, LOGIT_COPIES, PARAMETER_COPIES = 40, 6, 8, 5
CHECKPOINT_COPIES, INIT_COPIES = 6, 3


def parameter_count(cfg, vocab_size: int) -> int:
    """The GPT's parameters for a TrainConfig, counted from the model's definition without building it."""
    return model.parameter_count(cfg.model_config(vocab_size))


def checkpoint_bytes(cfg, vocab_size: int) -> int:
    """A checkpoint holds the weights and AdamW's two moments."""
    return 3 * FLOAT * parameter_count(cfg, vocab_size) + 2**20  # + metadata: config, history, characters


def training_bytes(cfg, vocab_size: int, n_tokens: int, on_device: bool = False) -> dict:
    """The estimate's parts. With `on_device` (a GPU backend), what the host holds: the initial weights are
    drawn there and checkpoints copied back; parameters, gradients, moments, activations and logits live in
    the GPU's memory."""
    tokens = cfg.batch_size * cfg.block_size
    params = FLOAT * parameter_count(cfg, vocab_size)
    copies = CHECKPOINT_COPIES + (INIT_COPIES if on_device else PARAMETER_COPIES)
    parts = {"parameters, gradients and AdamW state": copies * params, "token ids": 8 * n_tokens}
    if not on_device:
        parts["activations"] = FLOAT * tokens * cfg.n_layer * (PER_CHANNEL * cfg.n_embd
                                                               + PER_SCORE * cfg.n_head * cfg.block_size)
        parts["logits"] = FLOAT * LOGIT_COPIES * tokens * vocab_size
    return parts


def available_bytes() -> int | None:
    """Memory the system can give this process now (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check(cfg, vocab_size: int, n_tokens: int, on_device: bool = False, available: int | None = None) -> None:
    """Raise a TinynnError with the estimate when the run will not fit in the memory available. (A GPU
    backend reports running out of its own memory as an error of its own.)"""
    available = available_bytes() if available is None else available
    parts = training_bytes(cfg, vocab_size, n_tokens, on_device)
    total = sum(parts.values())
    if available is not None and total > available:
        largest = max(parts, key=parts.get)
        raise TinynnError(f"this run needs about {gib(total)} of memory ({largest}: {gib(parts[largest])}; "
                          f"vocabulary {vocab_size}, n_embd {cfg.n_embd}, batch {cfg.batch_size} x "
                          f"{cfg.block_size}), only {gib(available)} of host memory is available: make the model, "
                          "the batch or the vocabulary smaller")


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"
